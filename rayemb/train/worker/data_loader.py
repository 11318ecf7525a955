"""A rank's batches: converted off the training thread, held in memory when they fit, never waited on forever.

Two ways in, one interface (:class:`RankBatches`):

* **in memory** (``data.in_memory``, the default when the rank's shard fits):
  the rank's shard is read once, every batch converted (tensors, KJT, hybrid
  remap) and kept; every epoch runs with no Ray Data, no arrow and no remap in
  the step, in a fresh order per epoch (seeded). All ranks agree on the number
  of batches once per epoch, so the step itself needs no extra collective.
  Where the step leaves the CPU free (``overlap_first_epoch``: a GPU step), the
  first epoch instead trains from the first converted batch on, in the order
  the shard is read, while a background thread converts the next ones, as for
  streamed data (each of its steps then checks that every rank has a batch);
  on a CPU step the conversion would take the step's own cores (measured
  slower overall: docs/benchmarks.md, job_phases), so the shard is read first.
  A job that resumes at a later epoch reads the whole shard first and takes
  that epoch's order.
* **streamed**: a background thread pulls and converts the next batches while
  the step runs (a bounded queue, ``PREFETCH_BATCHES`` deep); each step still
  checks that every rank has a batch.

Training drops a rank's last, partial batch (every step is a full batch);
validation keeps it (``drop_last=False``), its converter padding it to the
full batch (:mod:`rayemb.train.worker.validation`). So the driver's
:func:`split_steps` asks the train split for one global batch and the valid
split for one row.

Either way the first batch of an epoch must arrive within
``data.first_batch_timeout_s``; if it does not, :class:`DataStarvedError`
says why it usually happens (no CPU free on any node for Ray Data's read
tasks, because the training workers hold them all) with the cluster's free
and total CPUs, instead of a silent wait. Later batches log a warning for
every minute they are late.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator, List, Optional

import numpy as np

from rayemb.batch_shape import BatchShape
from rayemb.constants import TRAIN_SPLIT, VALID_SPLIT
from rayemb.errors import DataError
from rayemb.logs import redact_uri

logger = logging.getLogger(__name__)

#: converted batches the streaming thread keeps ready ahead of the step
PREFETCH_BATCHES = 4
#: a late batch (after the first) is reported once per this many seconds
LATE_BATCH_WARNING_S = 60.0
_END = object()


class DataStarvedError(DataError):
    """No batch arrived within the first-batch timeout."""

    def __init__(self, message: str, category: str = "data_starved") -> None:
        super().__init__(message, category)


def split_steps(train_rows: int, valid_rows: int, cfg: Any, data_dir: str) -> int:
    """Train steps per epoch at the job's size (``JobConfig``); a :class:`DataError` when the train split has less
    than one global batch or the valid split no row (validation pads its last batch: one row is enough)."""
    steps = BatchShape(cfg.data.batch_size, cfg.scaling.num_workers).full_steps(train_rows)
    if steps < 1:
        raise DataError(
            f"The {TRAIN_SPLIT} split of {redact_uri(data_dir)!r} has {train_rows} rows, fewer than one global batch "
            f"(data.batch_size={cfg.data.batch_size} x scaling.num_workers={cfg.scaling.num_workers}). "
            "Generate more rows or lower data.batch_size."
        )
    if valid_rows < 1:
        raise DataError(
            f"The {VALID_SPLIT} split of {redact_uri(data_dir)!r} has no rows; validation needs at least one. "
            "Give the dataset a non-empty valid/ split (e.g. rayemb convert --valid-fraction)."
        )
    return steps


def cluster_cpu_report() -> str:
    """'free/total CPUs per node' of the live cluster, for error messages (best effort)."""
    try:
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        total = sum(float(n.get("Resources", {}).get("CPU", 0.0)) for n in nodes)
        free = float(ray.available_resources().get("CPU", 0.0))
        return f"{free:g} of {total:g} CPUs free on {len(nodes)} node(s)"
    except Exception as e:  # noqa: BLE001 - the report must never hide the real error
        return f"CPU use unknown ({type(e).__name__})"


def starvation_message(split: str, rank: int, waited_s: float, cpus_per_worker: Optional[float]) -> str:
    cpw = f"scaling.cpus_per_worker (now {cpus_per_worker:g})" if cpus_per_worker else "scaling.cpus_per_worker"
    return (
        f"Rank {rank} received no batch of the {split} split in {waited_s:.0f} s. Ray Data reads with tasks that "
        f"need a free CPU on some node; the cluster has {cluster_cpu_report()}, the training workers hold the rest. "
        f"Lower {cpw} or add a node with a free CPU. If the storage is just slow, raise data.first_batch_timeout_s."
    )


class _Prefetcher:
    """Iterates ``source`` on a daemon thread, converting each item; the consumer waits with a timeout."""

    def __init__(self, source: Callable[[], Iterator[Any]], convert: Callable[[Any], Any], depth: int) -> None:
        self._q: "queue.Queue[Any]" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(source, convert), daemon=True,
                                        name="rayemb-prefetch")
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Callable[[], Iterator[Any]], convert: Callable[[Any], Any]) -> None:
        try:
            for raw in source():
                if not self._put(convert(raw)):
                    return
            self._put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(e)

    def get(self, timeout: float) -> Any:
        """The next item, ``_END`` at the end; raises ``queue.Empty`` after ``timeout`` s, the source's error."""
        item = self._q.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()


class RankBatches:
    """One split's batches on one rank (module docstring).

    Args:
        shard: the rank's rows: a Ray Data shard (``ray.train.get_dataset_shard(split)``) or, for a split the
            driver held, a :class:`~rayemb.train.held_splits.HeldShard`.
        batch_size: rows per batch.
        convert: pyarrow table -> batch (``BatchConverter``).
        drop_last: drop the shard's last, partial batch (training); False hands it to ``convert`` (validation).
        in_memory: keep the converted batches after the first pass.
        first_batch_timeout_s: the wait for an epoch's first batch before :class:`DataStarvedError`.
        split, rank, cpus_per_worker: for messages.
        seed: the per-epoch order of in-memory batches is ``default_rng((seed, epoch))`` (an overlapped first
            epoch: the read order).
        shuffle: reorder in-memory batches every epoch.
        overlap_first_epoch: in memory, train the first epoch from the first converted batch on (module
            docstring); False reads the whole shard first.
    """

    def __init__(self, shard: Any, batch_size: int, convert: Callable[[Any], Any], *, in_memory: bool,
                 first_batch_timeout_s: float, split: str, rank: int, cpus_per_worker: Optional[float] = None,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = True, overlap_first_epoch: bool = True) -> None:
        self.shard, self.batch_size, self.convert, self.drop_last = shard, batch_size, convert, drop_last
        self.in_memory = in_memory
        self.first_batch_timeout_s = first_batch_timeout_s
        self.split, self.rank, self.cpus_per_worker = split, rank, cpus_per_worker
        self.seed, self.shuffle, self.overlap_first_epoch = seed, shuffle, overlap_first_epoch
        self._cache: Optional[List[Any]] = None
        #: the first epoch's batches kept so far and the stream they come from, while it is being read
        self._partial: Optional[Any] = None
        self._loading: Optional[threading.Thread] = None
        self._load_error: Optional[BaseException] = None
        #: seconds the last full read of the shard took (in memory: the one load)
        self.load_seconds = 0.0

    @property
    def needs_step_check(self) -> bool:
        """Whether ranks must agree every step that each still has a batch (streamed data)."""
        return self._cache is None

    def __len__(self) -> int:
        if self._cache is None:
            raise TypeError("the number of streamed batches is known only after the first in-memory load")
        return len(self._cache)

    def _source(self) -> Iterator[Any]:
        return iter(self.shard.iter_batches(batch_size=self.batch_size, batch_format="pyarrow",
                                            drop_last=self.drop_last, prefetch_batches=2))

    def _stream(self) -> Iterator[Any]:
        pre = _Prefetcher(self._source, self.convert, PREFETCH_BATCHES)
        t0 = time.monotonic()
        first = True
        try:
            while True:
                waited = 0.0
                while True:
                    limit = self.first_batch_timeout_s - waited if first else LATE_BATCH_WARNING_S
                    try:
                        item = pre.get(timeout=max(limit, 0.01))
                        break
                    except queue.Empty:
                        waited += max(limit, 0.01)
                        if first:
                            raise DataStarvedError(starvation_message(
                                self.split, self.rank, time.monotonic() - t0, self.cpus_per_worker)) from None
                        logger.warning("rank %d: no batch of the %s split for %.0f s (%s)", self.rank, self.split,
                                       waited, cluster_cpu_report())
                if item is _END:
                    return
                first = False
                yield item
        finally:
            pre.close()
            self.load_seconds = time.monotonic() - t0

    def preload(self) -> None:
        """In memory: start reading and converting the shard now, in the background; the first :meth:`epoch`
        waits for it. A split needed only later (validation) is then read while the one needed first is, not
        after it."""
        if self.in_memory and self._cache is None and self._loading is None:
            self._loading = threading.Thread(target=self._load, name=f"rayemb-load-{self.split}", daemon=True)
            self._loading.start()

    def _load(self) -> None:
        try:
            cache = list(self._stream())
        except BaseException as e:  # noqa: BLE001 - raised where the batches are wanted (epoch)
            self._load_error = e
            return
        logger.info("rank %d: %d %s batches held in memory (read and converted in %.1f s)", self.rank,
                    len(cache), self.split, self.load_seconds)
        self._cache = cache

    def _keep_as_read(self) -> Iterator[Any]:
        """The first epoch in memory: each batch as soon as it is converted, kept for the epochs after it."""
        kept: List[Any] = []
        stream = self._stream()
        self._partial = (kept, stream)
        for item in stream:
            kept.append(item)
            yield item
        self._finish_partial()

    def _finish_partial(self) -> None:
        """Reads what the first epoch did not (it may stop early), then holds every batch."""
        kept, stream = self._partial
        kept.extend(stream)
        self._partial = None
        logger.info("rank %d: %d %s batches held in memory (read and converted in %.1f s, beside the first epoch)",
                    self.rank, len(kept), self.split, self.load_seconds)
        self._cache = kept

    def epoch(self, epoch: int) -> Iterator[Any]:
        """This epoch's batches: streamed, or (in memory) the first epoch as read and kept, each later one the
        kept batches in its own order."""
        if not self.in_memory:
            return self._stream()
        if self._partial is not None:
            self._finish_partial()
        if self._cache is None and self._loading is None and epoch == 0 and self.overlap_first_epoch:
            return self._keep_as_read()
        if self._cache is None:
            if self._loading is None:
                self._load()
            else:
                self._loading.join()
                self._loading = None
            if self._load_error is not None:
                error, self._load_error = self._load_error, None
                raise error
        if not self.shuffle or (epoch == 0 and self.overlap_first_epoch):  # an overlapped first epoch: read order
            return iter(self._cache)
        order = np.random.default_rng((self.seed, epoch)).permutation(len(self._cache))
        return (self._cache[i] for i in order)


__all__ = ["RankBatches", "DataStarvedError", "split_steps", "starvation_message", "cluster_cpu_report",
           "PREFETCH_BATCHES"]
