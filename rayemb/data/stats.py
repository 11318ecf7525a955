"""The statistics pass of a dataset split: one streaming Ray Data pass, :func:`compute_stats`.

(A split small enough to read in well under the time Ray Data's tasks take to start is summarised by the same
per-file code in the calling process.)

The split stage (:mod:`rayemb.planner.split`) needs, per sparse table, how often
each hot id occurs; the planner needs cardinalities and pooling factors. On data
that may hold billions of rows this must be one distributed, streaming pass with
bounded memory: one Ray Data map task per few parquet files summarises them,
batch by batch, with vectorized numpy/pyarrow into mergeable summaries
(:mod:`rayemb.data.sketches`), and the per-file summaries are merged tree-wise
on the driver as they stream in. The result is a
:class:`~rayemb.data.stats_types.DatasetStats`.

Files: :mod:`rayemb.data.stats_io` writes, reads and reuses ``stats.json``;
:func:`rayemb.data.checks.check_ids` applies ``data.id_policy``;
:mod:`rayemb.data.stats_report` draws the chart and the terminal table;
:mod:`rayemb.data.stats_cli` is ``rayemb stats``.

Example::

    >>> stats = compute_stats("/data/synth", num_heavy_hitters=1024)
    >>> stats.tables["C1"].heavy_hitters[:2].tolist()      # [[id, count], ...], count descending
    [[4117, 90210], [18, 51234]]
    >>> write_stats_json(stats, "stats.json")
"""

from __future__ import annotations

import logging
import pickle
import sys
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayemb import storage
from rayemb._ray import init_ray
from rayemb.constants import SMALL_SPLIT_MAX_ROWS, TRAIN_SPLIT
from rayemb.data.checks import ValueSummary
from rayemb.data.fingerprint import dataset_fingerprint
from rayemb.data.footers import corrupt_file_error
from rayemb.data.schema import RAW, DatasetSchema, check_parquet_columns, count_rows, parquet_files
from rayemb.data.sketches import DEFAULT_NUM_HEAVY_HITTERS, TableSummary, merge_summaries
from rayemb.data.stats_types import DatasetStats
from rayemb.data.transforms import bucket_ids, dense_values
from rayemb.embedding.raw_ids import raw_ids_to_int64
from rayemb.errors import DataError, find_user_error
from rayemb.logs import redact_uri

logger = logging.getLogger(__name__)

#: rows decoded and summarised at once by one task (26 int64 tables: ~110 MB)
DEFAULT_ROWS_PER_READ = 1 << 19


# ---- PER-BLOCK PASS ---- #


def _ids(values: Any, raw: bool) -> np.ndarray:
    """int64 ids of a null-free array: a raw-id column's strings hashed as the batches hash them."""
    if raw:
        return raw_ids_to_int64(values)
    return values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _column_values(col: pa.ChunkedArray, multi_hot: bool, raw: bool = False) -> Tuple[np.ndarray, int, int]:
    """(non-null ids as int64, nulls, max bag length) of one sparse column of a block, vectorized.

    One-hot: nulls are null rows. Multi-hot: nulls are null bags plus null ids
    inside bags; a null bag counts as an empty bag. ``flatten`` honours slice
    offsets, so no per-row Python work happens. ``raw``: a raw-id column (int64
    or string ids; strings become the int64 ids training uses).
    """
    if not multi_hot:
        nulls = col.null_count
        if nulls:
            col = pc.drop_null(col)
        arr = _ids(col, raw) if col.num_chunks else np.zeros(0, np.int64)
        return arr, int(nulls), 1
    parts: List[np.ndarray] = []
    nulls, max_bag = 0, 0
    for chunk in col.chunks:
        nulls += chunk.null_count
        if len(chunk):
            lengths = pc.fill_null(pc.list_value_length(chunk), 0)
            max_bag = max(max_bag, int(pc.max(lengths).as_py() or 0))
        flat = chunk.flatten()
        if flat.null_count:
            nulls += flat.null_count
            flat = pc.drop_null(flat)
        parts.append(_ids(flat, raw))
    values = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return values, int(nulls), max_bag


#: one sparse column to summarise: (name, num_embeddings, multi_hot[, raw ids]; without it: encoded)
Feature = Tuple[Any, ...]


def _is_raw(feature: Feature) -> bool:
    return len(feature) > 3 and bool(feature[3])


def _summarize_table(table: pa.Table, features: Sequence[Feature], capacity: Optional[int],
                     buckets: Optional[Mapping[str, Sequence[float]]] = None) -> Dict[str, TableSummary]:
    """Summaries of every sparse column of one in-memory table; a bucketized dense column (``buckets``: name ->
    boundaries) is summarised by the bucket ids training looks up."""
    out: Dict[str, TableSummary] = {}
    for f in features:
        name, num_embeddings, multi_hot = f[:3]
        if buckets and name in buckets:
            values, nulls, max_bag = bucket_ids(np.asarray(buckets[name], np.float32), np.asarray(
                dense_values(table.column(name)), np.float32)), 0, 1
        else:
            values, nulls, max_bag = _column_values(table.column(name), multi_hot, _is_raw(f))
        out[name] = TableSummary.from_values(
            name, num_embeddings, values, rows=table.num_rows, nulls=nulls, max_bag=max_bag, capacity=capacity,
            raw=_is_raw(f),
        )
    return out


def _summarize_files(
    batch: pa.Table, *, features: Sequence[Feature], capacity: Optional[int], rows_per_read: int,
    label: Union[None, str, Sequence[str]] = None, dense: Sequence[str] = (), weight: Optional[str] = None,
    buckets: Optional[Mapping[str, Sequence[float]]] = None,
) -> pa.Table:
    """Ray Data UDF: parquet paths in, one row per file out, holding its pickled summaries.

    Each file is read with pyarrow's ``ParquetFile.iter_batches`` in batches of
    ``rows_per_read`` rows (bounded memory) and the batch summaries are merged
    in the task, so only k counters per table leave it. The pickled value is
    ``({name: TableSummary}, ValueSummary)``: the sparse tables and the label and
    dense value checks. A file that cannot be decoded raises :class:`DataError`
    naming it.
    """
    names = [f[0] for f in features]
    columns = names + ([label] if isinstance(label, str) else list(label or [])) + list(dense) + \
        ([weight] if weight else [])
    blobs = []
    for path in batch.column("path").to_pylist():
        merger = _TreeMerger()
        values = ValueSummary()
        try:
            where, fs = storage.parquet_source(path)  # a local path, or a URI opened through pyarrow.fs
            pf = pq.ParquetFile(where, filesystem=fs)
            for rb in pf.iter_batches(batch_size=rows_per_read, columns=columns, use_threads=False):
                table = pa.Table.from_batches([rb])
                if features:
                    merger.push(_summarize_table(table, features, capacity, buckets))
                values = values + ValueSummary.of_table(table, label, dense, weight)
        except (pa.ArrowException, OSError, ValueError) as e:
            # Returned, not raised: Ray Data would wrap a raised error in its own exception and traceback.
            blobs.append(pickle.dumps(corrupt_file_error(path, e), protocol=pickle.HIGHEST_PROTOCOL))
            continue
        part = merger.result()
        if part is None:  # a file without rows, or no sparse tables asked for
            part = {f[0]: TableSummary(f[0], f[1], capacity, raw=_is_raw(f)) for f in features}
        blobs.append(pickle.dumps((part, values), protocol=pickle.HIGHEST_PROTOCOL))
    return pa.table({"summary": pa.array(blobs, type=pa.large_binary())})


class _TreeMerger:
    """Streaming binary-tree merge: like a binary counter, merges two summaries of equal level.

    Summaries arrive one at a time; at most log2(n) partial results are held,
    and every summary takes part in O(log n) merges of similarly sized inputs.
    """

    def __init__(self) -> None:
        self._stack: List[Tuple[int, Dict[str, TableSummary]]] = []

    def push(self, summary: Dict[str, TableSummary]) -> None:
        level = 0
        while self._stack and self._stack[-1][0] == level:
            _, prev = self._stack.pop()
            summary = merge_summaries(prev, summary)
            level += 1
        self._stack.append((level, summary))

    def result(self) -> Optional[Dict[str, TableSummary]]:
        out: Optional[Dict[str, TableSummary]] = None
        while self._stack:
            _, s = self._stack.pop()
            out = s if out is None else merge_summaries(s, out)
        return out


def _print_progress(rows: int, total: int, values: int, t0: float) -> None:
    dt = max(time.monotonic() - t0, 1e-9)
    pct = f" ({100 * rows / total:.0f}%)" if total else ""
    print(f"stats: {rows:,}/{total:,} rows{pct}, {values / dt / 1e6:,.1f} M ids/s", file=sys.stderr, flush=True)


def compute_stats(
    data_dir: str,
    *,
    exact: bool = False,
    split: str = TRAIN_SPLIT,
    num_heavy_hitters: int = DEFAULT_NUM_HEAVY_HITTERS,
    progress: bool = False,
    tables: bool = True,
    in_process: Optional[bool] = None,
    fingerprint: Optional[str] = None,
) -> DatasetStats:
    """Computes the statistics of ``data_dir/split`` (what stats.json holds) in one streaming Ray Data pass.

    The same pass counts bad label and dense values and measures each dense
    column's moments, ``standardize``'s parameters (``.values``, see
    :mod:`rayemb.data.checks`); ``tables=False`` does only that (the validation
    split needs no table statistics).

    One Ray Data map task per parquet file reads it in bounded batches and
    emits that file's summaries; the driver merges them in a tree as they
    stream in.

    ``exact=True`` keeps the full histogram of every table (heavy_hitters lists
    every id, error_bound 0): memory O(distinct ids), for small data and tests.
    Otherwise each table keeps a Misra–Gries summary of ``num_heavy_hitters``
    counters. ``data_dir`` may be a URI (``s3://bucket/data``; the Ray tasks read
    through :mod:`rayemb.storage` with the credentials of their environment).
    ``in_process``: summarise the files in this process instead (same summaries, no Ray); by default a split of
    at most :data:`~rayemb.constants.SMALL_SPLIT_MAX_ROWS` rows is. Starts Ray (:func:`rayemb._ray.init_ray`),
    for the Ray Data pass, only when it is not running. Checks
    the columns first (missing column / wrong type: :class:`DataError` naming it).
    Out-of-range ids are counted, not fatal: apply
    :func:`rayemb.data.checks.check_ids` with the job's ``data.id_policy``. ``fingerprint``: the split's
    (:func:`~rayemb.data.fingerprint.dataset_fingerprint`) where the caller took it already.
    """
    if num_heavy_hitters < 1:
        raise DataError(f"num_heavy_hitters={num_heavy_hitters}: keep at least one heavy-hitter counter per table.")
    schema = DatasetSchema.load(data_dir)
    check_parquet_columns(schema, data_dir, split)
    files = parquet_files(data_dir, split)
    fingerprint = fingerprint or dataset_fingerprint(data_dir, split)
    features = [(f.name, int(f.num_embeddings), bool(f.multi_hot), f.ids == RAW) for f in schema.sparse] \
        if tables else []
    total_rows = count_rows(data_dir, split)  # footers only (concurrently for remote files)
    if in_process is None:
        in_process = total_rows <= SMALL_SPLIT_MAX_ROWS
    summarize_kwargs = {"features": features, "capacity": None if exact else num_heavy_hitters,
                        "rows_per_read": DEFAULT_ROWS_PER_READ, "label": schema.label if not schema.extra_labels else schema.labels,
                        "dense": list(schema.dense), "weight": schema.weight,
                        "buckets": {f.name: f.bucketize for f in schema.sparse if f.bucketize is not None}}
    t0 = time.monotonic()
    merger = _TreeMerger()
    value_summary = ValueSummary()
    rows = values = blocks = 0
    last_print = t0
    try:
        for blob in (_summaries_here(files, summarize_kwargs) if in_process
                     else _summaries_on_ray(files, summarize_kwargs)):
            loaded = pickle.loads(blob)
            if isinstance(loaded, DataError):  # an unreadable file, named
                raise loaded
            part, file_values = loaded
            rows += file_values.rows
            values += sum(s.values for s in part.values())
            blocks += 1
            value_summary = value_summary + file_values
            if part:
                merger.push(part)
            if progress and time.monotonic() - last_print >= 2.0:
                last_print = time.monotonic()
                _print_progress(rows, total_rows, values, t0)
    except Exception as e:  # a task's DataError (corrupt file) arrives wrapped by Ray: show it as it is
        user_error = find_user_error(e)
        if user_error is not None:
            raise user_error from None
        raise
    merged = merger.result()
    elapsed = time.monotonic() - t0
    if merged is None:  # files with zero rows
        merged = {
            name: TableSummary(name, v, None if exact else num_heavy_hitters, raw=raw) for name, v, _, raw in features
        }
    if progress:
        _print_progress(rows, total_rows or rows, values, t0)
    logger.info("stats of %s/%s: %d rows, %d blocks, %.1f s%s", redact_uri(data_dir), split, rows, blocks, elapsed,
                " (in this process)" if in_process else "")
    return DatasetStats(
        rows=int(rows),
        fingerprint=fingerprint,
        data_dir=redact_uri(storage.abspath(data_dir)),  # stats.json is logged: no credentials in it
        split=split,
        exact=bool(exact),
        num_heavy_hitters=None if exact else int(num_heavy_hitters),
        elapsed_s=round(elapsed, 3),
        values=value_summary,
        tables={name: merged[name].to_stats() for name, _, _, _ in features},
    )


def _summaries_here(files: Sequence[str], kwargs: Dict[str, Any]) -> Iterator[bytes]:
    """Each file's pickled summaries, computed in this process (a small split)."""
    for path in files:
        yield from _summarize_files(pa.table({"path": [path]}), **kwargs).column("summary").to_pylist()


def _summaries_on_ray(files: Sequence[str], kwargs: Dict[str, Any]) -> Iterator[bytes]:
    """Each file's pickled summaries, computed by Ray Data map tasks across the cluster, as they stream in."""
    import ray

    init_ray()
    ctx = ray.data.DataContext.get_current()
    old_bars = ctx.enable_progress_bars
    ctx.enable_progress_bars = False
    try:
        # A dataset of file paths whose map tasks read with pyarrow directly: Ray Data's read_parquet decodes
        # several times slower than ParquetFile.iter_batches, and reading dominated the pass (jobs/bench/stats.py).
        # A few files per task (about 4 tasks per CPU) so per-task overhead stays small next to the work.
        cpus = max(1, int(ray.available_resources().get("CPU", 1)))
        num_blocks = max(1, min(len(files), 4 * cpus))
        ds = ray.data.from_items([{"path": p} for p in files], override_num_blocks=num_blocks).map_batches(
            _summarize_files, batch_size=None, batch_format="pyarrow", fn_kwargs=kwargs)
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2):
            yield from batch.column("summary").to_pylist()
    finally:
        ctx.enable_progress_bars = old_bars


__all__ = ["compute_stats", "DEFAULT_ROWS_PER_READ"]
