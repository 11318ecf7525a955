"""Worker side of checkpoints: where a (re)started job continues, and writing the next checkpoint.

Checkpoints are logical (:mod:`rayemb.checkpoint.store`): they load into any
world size and plan, so a worker group restarted by Ray Train after a failure
or a resize (``scaling.num_workers: [min, max]``), or a new job with
``--resume-from``, continues from the newest intact one:

* the model, optimizer state and dense weights re-partitioned for this plan;
* the position: epoch, and within it the samples already trained — a job of
  another world size skips the same number of samples (rounded down to its
  global batch); the same world size also gets its RNG states back;
* the early-stopping bookkeeping.

A checkpoint that fails its size/SHA-256 check is skipped with a warning for
the previous one (Ray Train keeps ``train.keep_checkpoints``); an explicit
``--resume-from`` that fails is an error (the driver checks it first). A store
that does not answer is not a damaged checkpoint: listing, reading and
downloading are tried again with backoff
(:data:`rayemb.checkpoint.reader.STORAGE_RETRY_S`), then the resume fails
naming the checkpoint (:class:`~rayemb.errors.DataError` ``storage``) instead
of falling back or starting from scratch.

Checkpoints on remote storage (``tracking.output_dir: s3://...``, where Ray
Train uploads them, or ``--resume-from s3://...``) are found by listing the
store; rank 0 downloads the chosen one and checks it, then one rank per node
downloads it for the ranks of its node (a lock file in the node's temp
directory), and the copies are removed after loading.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from rayemb.batch_shape import BatchShape
from rayemb.checkpoint.meta import CheckpointMeta

logger = logging.getLogger(__name__)


@dataclass
class Position:
    """Where training continues."""

    step: int = 0  # optimizer steps taken so far (all epochs)
    epoch: int = 0  # first epoch to run
    skip_steps: int = 0  # steps of ``epoch`` already trained (of this world's global batch)
    bookkeeping: Dict[str, Any] = field(default_factory=dict)  # early stopping state
    source: Optional[str] = None  # the checkpoint loaded


def position_from_meta(meta: Union[CheckpointMeta, Mapping[str, Any]], shape: BatchShape) -> Position:
    """The :class:`Position` a checkpoint (its meta, or its meta.json) leads to for a job of batch ``shape``."""
    if not isinstance(meta, CheckpointMeta):
        meta = CheckpointMeta.from_dict(meta)
    return Position(meta.step, meta.next_epoch, meta.skip_steps(shape), dict(meta.early_stopping))


def _checkpoint_uri(checkpoint: Any, checkpoint_root: Optional[str]) -> Optional[str]:
    """The URI of a Ray checkpoint on remote storage (Ray holds a path on its pyarrow filesystem)."""
    from rayemb import storage

    if checkpoint_root and storage.is_remote(checkpoint_root):
        root = storage.filesystem(checkpoint_root)[1].rstrip("/")
        if checkpoint.path.startswith(root + "/"):
            return storage.join(checkpoint_root, checkpoint.path[len(root) + 1:])
    scheme = {"s3": "s3", "gcs": "gs"}.get(getattr(checkpoint.filesystem, "type_name", ""))
    return f"{scheme}://{checkpoint.path.lstrip('/')}" if scheme else None


def _candidates(resume_from: Optional[str], checkpoint_root: Optional[str]) -> Tuple[List[str], bool]:
    """Checkpoints to try, newest first, and whether falling back past the first is allowed.

    Ray registers a reported checkpoint when its controller next polls the workers: a worker killed
    right after reporting leaves a complete (meta.json written last, hashes listed) but unregistered
    checkpoint, and a group restarted after losing a node was seen to get no checkpoint at all. So
    the job's own checkpoint folder (``checkpoint_root``: this job's, no other job writes there) is
    scanned too; the newest intact one by step wins. On remote storage the candidates are URIs.
    """
    import ray.train

    from rayemb import storage
    from rayemb.checkpoint.reader import checkpoints_newest_first, read_meta

    checkpoint = ray.train.get_checkpoint()
    registered = None
    if checkpoint is not None:
        if getattr(checkpoint.filesystem, "type_name", "local") == "local":
            registered = checkpoint.path
        else:
            registered = _checkpoint_uri(checkpoint, checkpoint_root)
            if registered is None:  # a store rayemb cannot name: download Ray's registered latest
                return [checkpoint.to_directory()], False
    found: List[str] = []
    for parent in ([storage.dirname(registered)] if registered else []) + [checkpoint_root]:
        if parent:
            found += [p for p in checkpoints_newest_first(parent) if p not in found]
    if found:
        found.sort(key=lambda p: (_step_of(read_meta(p)), storage.basename(p)), reverse=True)
        return found, True
    if registered is not None:
        return [registered], True
    if resume_from:
        return [resume_from], False
    return [], False


def _step_of(meta: Optional[Mapping[str, Any]]) -> int:
    """The step a checkpoint was written at; -1 (oldest) for a directory that turned out not to be one."""
    return -1 if meta is None else CheckpointMeta.from_dict(meta).step


def _node_copy(path: str, nonce: str) -> str:
    """A local directory holding checkpoint ``path``: itself when local, else one download per node and nonce."""
    import fcntl
    import shutil

    from rayemb import storage
    from rayemb.checkpoint.reader import with_storage_retries

    if not storage.is_remote(path):
        return path
    local = os.path.join(tempfile.gettempdir(), f"rayemb-restore-{nonce}")

    def download() -> str:
        shutil.rmtree(local, ignore_errors=True)  # a try the store broke off leaves part of the files
        return storage.download_dir(path, local)

    with open(local + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first rank of a node downloads, the others wait for it
        if not os.path.exists(local + ".complete"):
            with_storage_retries(download, path)
            open(local + ".complete", "w").close()
    return local


def _remove_node_copy(path: str, local: str) -> None:
    import shutil

    if local != path:
        shutil.rmtree(local, ignore_errors=True)
        for suffix in (".complete", ".lock"):
            try:
                os.remove(local + suffix)
            except OSError:
                pass


def restore(model: Any, optimizer: Any, remapper: Any, tables: Mapping[str, Tuple[int, int]],
            shape: BatchShape, resume_from: Optional[str] = None, checkpoint_root: Optional[str] = None,
            chunk_mib: Optional[float] = None) -> Position:
    """Loads the newest intact checkpoint (Ray Train's, else ``resume_from``) into this plan; a collective.

    Rank 0 picks the checkpoint (size and SHA-256 of every file checked) and
    tells the others, so all ranks load the same one. ``chunk_mib``: ``train.checkpoint_chunk_mib``
    (None: :data:`rayemb.checkpoint.store.DEFAULT_CHUNK_MIB`).
    """
    import uuid

    import torch.distributed as dist

    from rayemb.checkpoint.reader import verify
    from rayemb.checkpoint.store import DEFAULT_CHUNK_MIB, load_logical
    from rayemb.errors import DataError

    rank = dist.get_rank()
    if shape.world != dist.get_world_size():
        raise ValueError(f"restore: the batch shape is for {shape.world} ranks, the process group has "
                         f"{dist.get_world_size()}")
    choice: List[Any] = [None, None, None]
    if rank == 0:
        candidates, fallback = _candidates(resume_from, checkpoint_root)
        run = uuid.uuid4().hex[:12]
        for i, path in enumerate(candidates):
            nonce = f"{run}-{i}"
            local = _node_copy(path, nonce)
            try:
                choice = [path, verify(local, hashes=True, shown=path), nonce]
                if i:
                    logger.warning("resuming from the older checkpoint %s", _shown(path))
                break
            except DataError as e:
                _remove_node_copy(path, local)
                if not fallback or e.category == "storage":  # an unreachable store is no verdict on it
                    raise
                logger.warning("checkpoint %s is not usable (%s); falling back to the previous one", _shown(path), e)
        else:
            if candidates:
                logger.warning("no intact checkpoint among %d; starting from scratch", len(candidates))
    dist.broadcast_object_list(choice, src=0)
    path, meta, nonce = choice
    if path is None:
        return Position()
    local = _node_copy(path, nonce)
    try:
        load_logical(local, model, optimizer, remapper, tables, meta=meta,
                     chunk_mib=DEFAULT_CHUNK_MIB if chunk_mib is None else chunk_mib)
    except BaseException:  # the job fails: do not leave a download behind (no barrier: others may not get there)
        _remove_node_copy(path, local)
        raise
    if local != path:
        dist.barrier()  # every rank of the node has read the copy
        _remove_node_copy(path, local)
    written = CheckpointMeta.from_dict(meta, shown=_shown(path))
    pos = position_from_meta(written, shape)
    pos.source = path
    if rank == 0:
        logger.info("resumed from %s (written by %d ranks at epoch %d, step %d): continuing at epoch %d after %d "
                    "step(s) of it", _shown(path), written.world_size, written.epoch, pos.step, pos.epoch,
                    pos.skip_steps)
    return pos


def _shown(path: str) -> str:
    from rayemb.logs import redact_uri

    return redact_uri(path)


def save_and_report(model: Any, optimizer: Any, remapper: Any, tables: Mapping[str, Tuple[int, int]],
                    meta: CheckpointMeta, report: Mapping[str, Any], chunk_mib: Optional[float] = None) -> None:
    """Writes a logical checkpoint (every rank its part, in a temp dir) and reports it with ``report`` to Ray Train.

    ``chunk_mib``: ``train.checkpoint_chunk_mib`` (None: :data:`rayemb.checkpoint.store.DEFAULT_CHUNK_MIB`).
    """
    import ray.train

    from rayemb.checkpoint.store import DEFAULT_CHUNK_MIB, save_logical

    import time

    with tempfile.TemporaryDirectory(prefix="rayemb-ckpt-") as directory:
        t0 = time.perf_counter()
        doc = save_logical(directory, model, optimizer, remapper, tables, meta.to_dict(),
                           chunk_mib=DEFAULT_CHUNK_MIB if chunk_mib is None else chunk_mib)
        seconds = time.perf_counter() - t0
        if doc:  # rank 0: what the checkpoint cost, in the log and the run's metrics
            size = sum(f["bytes"] for f in doc["files"].values())
            logger.info("checkpoint at step %d: %.1f MiB written in %.2f s", meta.step, size / 2**20,
                        seconds)
            report = {**report, "checkpoint_s": seconds, "checkpoint_bytes": float(size)}
        ray.train.report(dict(report), checkpoint=ray.train.Checkpoint.from_directory(directory))


# ---- DRIVER SIDE ---- #


def check_resume_from(cfg: Any, schema: Any) -> Optional[Tuple[str, CheckpointMeta]]:
    """(directory, its meta) of ``train.resume_from`` after checking it fits this job; None when not resuming.

    Any world size and plan load (logical checkpoints); the files must be intact (sizes, SHA-256) and hold
    the schema's tables with this job's rows and dim.
    """
    if not cfg.train.resume_from:
        return None
    from rayemb.checkpoint.reader import verify
    from rayemb.config import resolve_path
    from rayemb.errors import DataError

    from rayemb import storage
    from rayemb.logs import redact_uri

    directory = resolve_path(cfg.train.resume_from)
    storage.check_supported(directory, "train.resume_from / --resume-from")
    shown = redact_uri(directory)
    try:
        meta = verify(directory)
    except DataError as e:
        raise DataError(f"{e.message.rstrip('.')} (train.resume_from / --resume-from).",
                        category="storage" if e.category == "storage" else "bad_checkpoint") from None
    from rayemb.contract.tables import table_configs  # TorchRec: imported once the files are known to be there

    from rayemb.checkpoint.raw_files import check_id_kinds

    saved = meta.get("tables", {})
    check_id_kinds({t: saved[t] for t in schema.table_names if t in saved}, schema.raw_names,
                   f"{shown} (train.resume_from)")
    for t in table_configs(schema, cfg.model.embedding_dim):
        got = saved.get(t.name)
        if got is None or (int(got["num_embeddings"]), int(got["dim"])) != (int(t.num_embeddings), int(t.embedding_dim)):
            raise DataError(
                f"Checkpoint {shown!r} (train.resume_from) has table {t.name!r} as {got}; this job has "
                f"{t.num_embeddings} rows x {t.embedding_dim} dims. Resume with the same dataset schema and "
                "model.embedding_dim, or start fresh.", category="bad_checkpoint")
    written = CheckpointMeta.from_dict(meta, shown=f"Checkpoint {shown!r} (train.resume_from)")
    if written.trained_all(cfg.train.epochs):
        raise DataError(
            f"Checkpoint {shown!r} (train.resume_from) already holds epoch {written.epoch + 1} of "
            f"train.epochs={cfg.train.epochs}: nothing is left to train. Raise train.epochs (e.g. "
            f"--set train.epochs={written.epoch + 2}).", category="bad_checkpoint")
    return directory, written


def fault_injection() -> Optional[Dict[str, Any]]:
    """``$RAYEMB_FAULT_INJECTION=STEP:MARKER_FILE[:kill]``: a worker fails once at STEP (tests of recovery).

    ``kill``: the worker process SIGKILLs itself instead of raising.
    """
    from rayemb.constants import FAULT_INJECTION_ENV_VAR

    spec = os.environ.get(FAULT_INJECTION_ENV_VAR)
    if not spec:
        return None
    step, rest = spec.split(":", 1)
    kill = rest.endswith(":kill")
    return {"step": int(step), "marker": rest[:-len(":kill")] if kill else rest, "mode": "kill" if kill else "raise"}


class CheckpointSchedule:
    """When to write a checkpoint besides epoch ends: every N steps and/or every S seconds.

    The time rule is decided by rank 0 at log points and agreed on through the
    loop's existing all-reduce (:meth:`due_flag`), so ranks never disagree.
    """

    def __init__(self, every_n_steps: Optional[int], every_s: Optional[float], rank: int) -> None:
        import time

        self.every_n_steps = every_n_steps
        self.every_s = every_s
        self.rank = rank
        self._last = time.monotonic()

    def due_flag(self) -> float:
        """1.0 on rank 0 when the time rule says a checkpoint is due (sum it over ranks), else 0.0."""
        import time

        return 1.0 if self.rank == 0 and self.every_s is not None and time.monotonic() - self._last >= self.every_s \
            else 0.0

    def due(self, step: int, time_flag: float = 0.0) -> bool:
        return bool(self.every_n_steps and step % self.every_n_steps == 0) or time_flag > 0

    def saved(self) -> None:
        import time

        self._last = time.monotonic()


__all__ = ["CheckpointSchedule", "Position", "check_resume_from", "fault_injection", "position_from_meta", "restore", "save_and_report"]
