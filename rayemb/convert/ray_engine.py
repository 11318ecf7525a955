"""``rayemb convert criteo --engine ray``: the Criteo conversion as Ray tasks on every CPU of a cluster.

The output is the single-process engine's, byte for byte in content: the same
part files holding the same rows in the same order, ids, dense values, split,
``schema.yaml`` and summary (bar timings and the ``engine`` entry). The stages:

1. the checks of the single-process engine, on the driver, before any work
   (options, inputs, the first lines of every input, an existing ``--out``);
2. :func:`~rayemb.convert.chunks.plan_chunks` cuts the inputs into chunks of
   whole lines; where a file has several, a small task per chunk counts its
   lines, so that every chunk knows its first line number (the validation split
   hashes line numbers);
3. ``--vocab-from-train``: every chunk's tasks count the values of its train
   rows, a Ray Data group-by on the table name merges the counts of each table
   in one task (sums and the ranking do not depend on the order chunks arrive
   in), and the driver builds the vocabularies from the merged counts;
4. the encoding pass (:mod:`rayemb.convert.ray_encode`): one task per chunk
   parses it block by block (:mod:`rayemb.convert.criteo_columns`), encodes and
   splits the rows into tables that stay in Ray's object store; the driver takes
   the blocks in input order and adds up the summary, and as soon as every row
   of a part file is encoded a task writes that part into the staging folder
   (:mod:`rayemb.convert.output`), the parts the single-process engine writes;
   the driver then publishes the dataset: a failure anywhere leaves nothing at
   ``--out``.

Parsing, encoding and parquet writing all run in tasks; the driver only adds up
the summary (per-table tallies of the ids), which it reads from the object store
without a copy. The part-writing tasks run on the driver's node, where the
staging folder is, so every row crosses to that node once (as a finished
dataset in a bucket is uploaded from it too). Inputs must be readable from
every node: a URI (``s3://...``) or a path on a filesystem all nodes mount.

Example::

    >>> convert_criteo_ray(ConvertOptions(inputs=("day_0.gz", "day_1.gz"), out="data/criteo", hash_buckets=10**6,
    ...                                   engine="ray", address="head:6379"))
"""

from __future__ import annotations

import contextlib
import logging
import math
import pickle
import time
from typing import Any, Dict, Iterator, List, Optional

from rayemb import storage
from rayemb.convert.chunk_tasks import ChunkJob, count_values, merge_counts, vocabulary_of
from rayemb.convert.chunks import Chunk, plan_chunks
from rayemb.convert.common import ConvertOptions, Progress
from rayemb.convert.criteo import CATEGORICAL, CriteoFormat
from rayemb.convert.output import StagedOutput
from rayemb.convert.ray_encode import EncodePass, line_counts, numbered
from rayemb.convert.stream import WriteState, encoders_for, prepare
from rayemb.convert.vocab import Vocabulary
from rayemb.errors import find_user_error

logger = logging.getLogger("rayemb.convert")

#: chunks per CPU (so that uneven chunks still keep every CPU busy to the end), and the largest chunk
CHUNKS_PER_CPU = 4
MAX_CHUNK_BYTES = 256 * 2**20


@contextlib.contextmanager
def ray_cluster(address: Optional[str]) -> Iterator[Any]:
    """The Ray this process already joined, else the cluster at ``address``, else ``$RAY_ADDRESS`` or a private
    local one (:func:`rayemb._ray.init_ray`); a connection made here is closed here (a local Ray it started,
    stopped)."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        from rayemb._ray import init_ray

        init_ray()
    try:
        yield ray
    finally:
        ray.shutdown()


@contextlib.contextmanager
def _data_context() -> Iterator[None]:
    """Ray Data set to work quietly (the conversion logs its own progress and raises a task's error itself);
    restored after."""
    from ray.data import DataContext
    from ray.data.context import ShuffleStrategy

    ctx = DataContext.get_current()
    log = logging.getLogger("ray.data")
    saved = (ctx.enable_progress_bars, ctx.shuffle_strategy, log.level)
    ctx.enable_progress_bars = False
    # the group-by of 26 tables' counts: the default hash shuffle starts aggregator actors (seconds, even warm);
    # a sort shuffle of 26 keys is plain tasks
    ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    # a task's error comes back as the exception this module raises (a user error as its own message)
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        ctx.enable_progress_bars, ctx.shuffle_strategy, level = saved
        log.setLevel(level)


def _chunk_bytes(opts: ConvertOptions, total_bytes: int, cpus: int) -> int:
    if opts.chunk_bytes is not None:
        return opts.chunk_bytes
    return int(min(MAX_CHUNK_BYTES, max(opts.block_size, math.ceil(total_bytes / max(1, cpus * CHUNKS_PER_CPU)))))


def _dataset(chunks: List[Chunk]) -> Any:
    import ray.data

    return ray.data.from_items([{"chunk": pickle.dumps(c)} for c in chunks], override_num_blocks=len(chunks))


def _run(chunks: List[Chunk], fn: Any, job_ref: Any) -> Any:
    """Ray Data applying ``fn(chunk, job)`` (a generator of dict rows) to every chunk, one task per chunk."""
    return _dataset(chunks).map_batches(_per_chunk, batch_size=1, fn_kwargs={"fn": fn, "job": job_ref})


def _per_chunk(batch: Dict[str, Any], fn: Any, job: Any) -> Iterator[Dict[str, List[Any]]]:
    import ray

    job = ray.get(job) if isinstance(job, ray.ObjectRef) else job
    for item in batch["chunk"]:
        for row in fn(pickle.loads(item), job):
            yield {k: [v] for k, v in row.items()}


def _vocabularies(chunks: List[Chunk], opts: ConvertOptions, job_ref: Any, cpus: int) -> Dict[str, Vocabulary]:
    train = [c for c in chunks if c.role != "valid"]
    logger.info("convert criteo: pass 1/2: counting the values of the train rows of %d chunks", len(train))

    def merge(group: Dict[str, Any]) -> Dict[str, List[Any]]:
        row = merge_counts(str(group["table"][0]), group["keys"], group["counts"], opts.min_count)
        return {k: [v] for k, v in row.items()}

    counts = _run(train, count_values, job_ref)
    merged = counts.groupby("table", num_partitions=min(cpus, len(CATEGORICAL))).map_groups(merge, batch_format="numpy")
    return {str(row["table"]): vocabulary_of(row) for row in merged.take_all()}


def convert_criteo_ray(opts: ConvertOptions) -> Dict[str, Any]:
    """Criteo inputs -> the dataset at ``opts.out`` on a Ray cluster's CPUs; returns the summary it writes."""
    fmt = CriteoFormat()
    roles = prepare(fmt, opts)
    t0 = time.monotonic()
    with StagedOutput(opts.out, opts.overwrite) as stage, ray_cluster(opts.address) as ray:
        try:
            cpus = int(ray.cluster_resources().get("CPU", 1))
            total = sum(s for s, _ in storage.sizes_and_mtimes_ns([p for p, _ in roles]))
            chunks = plan_chunks(roles, _chunk_bytes(opts, total, cpus))
            counts = line_counts(chunks, opts.block_size)
            if counts:
                logger.info("convert criteo: counting the lines of %d chunks", len(counts))
            vocabularies = None
            if opts.vocab_from_train:
                chunks, counts = numbered(chunks, counts), {}
                with _data_context():
                    vocabularies = _vocabularies(chunks, opts, ray.put(ChunkJob(opts)), cpus)
            encoders = encoders_for(fmt, opts, vocabularies)
            state = WriteState(fmt, opts, encoders, stage)
            job = ChunkJob(opts, encoders, state.pa_schema, tuple(state.distinct))
            stage_name = "pass 2/2 (writing)" if opts.vocab_from_train else "writing"
            with EncodePass(state, cpus) as encoding:
                encoding.run(chunks, ray.put(job), counts, Progress(fmt.name, opts.progress_every_s), stage_name)
                rows = state.close()
                encoding.wait()
        except Exception as e:
            user = find_user_error(e)
            if user is not None and user is not e:
                raise user from None
            raise
        engine = {"name": "ray", "cpus": cpus, "chunks": len(chunks)}
        summary = state.finish(stage.path, rows, time.monotonic() - t0, engine)
        stage.commit()
    return summary
