"""Per-table statistics of a dataset in one streaming Ray Data pass: ``rayemb stats``.

The split stage (:mod:`rayemb.planner.split`) needs, per sparse table, how often
each hot id occurs; the planner needs cardinalities and pooling factors. On data
that may hold billions of rows this must be one distributed, streaming pass with
bounded memory, so every quantity is a *mergeable summary* (Agarwal et al.,
"Mergeable Summaries", PODS 2012): one Ray Data map task per
parquet file summarises it, batch by batch, with vectorized numpy/pyarrow, and
the per-file summaries are merged tree-wise on the driver as they stream in.

Per table (:class:`TableSummary`):

- rows, values (non-null ids, including invalid ones), nulls, invalid ids
  (negative or ``>= num_embeddings``) with a few example values, min/max id,
  pooling factor (ids per bag: mean and max);
- distinct valid ids: exact (a bitmap of ``num_embeddings`` bits, merged with OR)
  when ``num_embeddings <= DISTINCT_EXACT_MAX_ROWS``, otherwise a HyperLogLog
  sketch (:class:`HyperLogLog`);
- heavy hitters: a Misra–Gries summary of capacity ``k`` (see :func:`_mg_reduce`
  for the maths and the error bound), or exact counts of every id with
  ``exact=True`` (small data, and the test oracle).

Example::

    >>> stats = compute_stats("/data/synth", num_heavy_hitters=1024)
    >>> stats["tables"]["C1"]["heavy_hitters"][:2]      # [[id, count], ...], count descending
    [[4117, 90210], [18, 51234]]
    >>> write_stats_json(stats, "stats.json")
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import pickle
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayemb._ray import init_ray
from rayemb.config import ID_POLICIES
from rayemb.constants import SCHEMA_FILE, TRAIN_SPLIT
from rayemb.data.checks import ValueSummary
from rayemb.data.schema import DatasetSchema, check_parquet_columns, parquet_files
from rayemb.errors import DataError, find_user_error

logger = logging.getLogger(__name__)

STATS_SCHEMA_VERSION = 1
#: Misra–Gries capacity k: counters kept per table (16 bytes each per summary)
DEFAULT_NUM_HEAVY_HITTERS = 4096
#: tables with at most this many rows count distinct ids exactly with a bitmap (128 KiB)
DISTINCT_EXACT_MAX_ROWS = 1 << 20
#: HyperLogLog precision p: m = 2**p registers of one byte (16 KiB), std. error 1.04/sqrt(m) = 0.81 %
HLL_PRECISION = 14
#: example invalid ids kept per table for error messages
NUM_INVALID_EXAMPLES = 5
#: rows decoded and summarised at once by one task (26 int64 tables: ~110 MB)
DEFAULT_ROWS_PER_READ = 1 << 19
#: per-block counting uses bincount (O(n + V)) instead of sort/hash unique when V <= this * n + 2**16
_DENSE_COUNT_FACTOR = 4


# ---- HYPERLOGLOG ---- #


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer (Steele, Lea & Flood, OOPSLA 2014): a bijective 64-bit mixer.

    Vectorized over uint64; numpy array arithmetic wraps modulo 2**64 as the
    algorithm requires.
    """
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _hll_sigma(x: float) -> float:
    """sigma(x) = x + sum_{k>=1} x^(2^k) 2^(k-1) (Ertl 2017, eq. for the zero-register correction)."""
    if x == 1.0:
        return math.inf
    y, z = 1.0, x
    while True:
        x *= x
        z_old = z
        z += x * y
        y += y
        if z == z_old:
            return z


def _hll_tau(x: float) -> float:
    """tau(x) = (1 - x - sum_{k>=1} (1 - x^(2^-k))^2 2^-k) / 3 (Ertl 2017, saturated-register correction)."""
    if x == 0.0 or x == 1.0:
        return 0.0
    y, z = 1.0, 1.0 - x
    while True:
        x = math.sqrt(x)
        z_old = z
        y *= 0.5
        z -= (1.0 - x) ** 2 * y
        if z == z_old:
            return z / 3.0


class HyperLogLog:
    """A mergeable distinct-count sketch (Flajolet et al., "HyperLogLog", AofA 2007).

    Each id is hashed to 64 bits with SplitMix64; the top ``p`` bits pick one of
    ``m = 2**p`` registers, which keeps the maximum over its ids of
    ``rho = 1 + (leading zeros of the remaining q = 64 - p bits)`` (``q + 1``
    when they are all zero). Merging is the element-wise maximum, so it is
    exactly associative and commutative, and adding an id twice changes nothing.

    The estimate is Ertl's improved raw estimator ("New cardinality estimation
    algorithms for HyperLogLog sketches", arXiv:1702.01284, 2017, Algorithm 6),
    which is unbiased over the whole range without HLL++'s empirical bias tables:
    with C_k the number of registers equal to k,

        z = m tau(1 - C_{q+1}/m);  z = (z + C_k) / 2 for k = q..1;  z += m sigma(C_0/m)
        estimate = m^2 / (2 ln 2 z)

    Its relative standard error is about ``1.04 / sqrt(m)`` (0.81 % for p = 14).
    """

    def __init__(self, p: int = HLL_PRECISION, registers: Optional[np.ndarray] = None) -> None:
        self.p = p
        self.registers = np.zeros(1 << p, dtype=np.uint8) if registers is None else registers

    @property
    def relative_std_error(self) -> float:
        return 1.04 / math.sqrt(1 << self.p)

    def add(self, ids: np.ndarray) -> None:
        """Adds ``ids`` (any integer array; duplicates are harmless). Mutates the registers in place."""
        if ids.size == 0:
            return
        h = _splitmix64(ids)
        q = 64 - self.p
        idx = (h >> np.uint64(q)).astype(np.intp)
        rest = (h & np.uint64((1 << q) - 1)).astype(np.float64)  # < 2**53, so the conversion is exact
        # frexp(w) = (f, e) with w = f 2^e, f in [0.5, 1): floor(log2 w) = e - 1, so rho = q - (e - 1) = q + 1 - e;
        # frexp(0) gives e = 0 and rho = q + 1, the all-zero case.
        rho = (q + 1 - np.frexp(rest)[1]).astype(np.uint8)
        np.maximum.at(self.registers, idx, rho)

    def merge(self, other: "HyperLogLog") -> "HyperLogLog":
        if other.p != self.p:
            raise ValueError(f"cannot merge HyperLogLog sketches of precision {self.p} and {other.p}")
        return HyperLogLog(self.p, np.maximum(self.registers, other.registers))

    def estimate(self) -> float:
        m = 1 << self.p
        q = 64 - self.p
        c = np.bincount(self.registers, minlength=q + 2).astype(np.float64)
        z = m * _hll_tau(1.0 - c[q + 1] / m)
        for k in range(q, 0, -1):
            z = 0.5 * (z + c[k])
        z += m * _hll_sigma(c[0] / m)
        return 0.0 if math.isinf(z) else m * m / (2.0 * math.log(2.0) * z)


# ---- MISRA-GRIES ---- #


def _mg_reduce(ids: np.ndarray, counts: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray, int]:
    """Reduces an (id, count) summary to at most ``k`` counters; returns ``(ids, counts, subtracted)``.

    Misra–Gries ("Finding repeated elements", Sci. Comput. Program. 1982) in the
    mergeable form of Agarwal et al. (PODS 2012, §3): let c be the (k+1)-th
    largest count; subtract c from every counter and drop those that reach 0.
    At least (k+1)·c of mass is removed, so after any tree of merges and
    reductions with subtracted amounts c_1, c_2, ... the tracked error
    ``E = sum_j c_j`` satisfies

        f(x) - E <= f_hat(x) <= f(x)   for every id x (f_hat = 0 when x is absent)
        E <= (N - N_hat) / (k + 1) <= N / (k + 1)

    where N is the number of valid ids counted and N_hat the sum of the kept
    counters. Hence every id with true count > E is kept. Vectorized: one
    ``np.partition`` (O(n)).
    """
    if ids.size <= k:
        return ids, counts, 0
    c = int(np.partition(counts, counts.size - (k + 1))[counts.size - (k + 1)])
    keep = counts > c
    return ids[keep], counts[keep] - c, c


def _count_ids(ids: np.ndarray, num_embeddings: int) -> Tuple[np.ndarray, np.ndarray]:
    """Exact (distinct ids sorted ascending, counts) of valid ids ``0 <= id < num_embeddings``.

    Uses ``np.bincount`` (O(n + V), ~4x faster than sorting) when the table is
    not much larger than the block, else ``np.unique``.
    """
    if ids.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if num_embeddings <= _DENSE_COUNT_FACTOR * ids.size + (1 << 16):
        dense = np.bincount(ids, minlength=num_embeddings)
        present = np.flatnonzero(dense)
        return present.astype(np.int64), dense[present].astype(np.int64)
    u, c = np.unique(ids, return_counts=True)
    return u.astype(np.int64), c.astype(np.int64)


def _add_counts(a_ids: np.ndarray, a_counts: np.ndarray, b_ids: np.ndarray, b_counts: np.ndarray):
    """Sum of two sparse histograms (ids sorted ascending in, ids sorted ascending out)."""
    if a_ids.size == 0:
        return b_ids, b_counts
    if b_ids.size == 0:
        return a_ids, a_counts
    ids = np.concatenate([a_ids, b_ids])
    u, inv = np.unique(ids, return_inverse=True)
    counts = np.bincount(inv, weights=np.concatenate([a_counts, b_counts]), minlength=u.size)
    return u, np.rint(counts).astype(np.int64)


# ---- TABLE SUMMARY ---- #


@dataclass
class TableSummary:
    """Mergeable statistics of one sparse table over some rows (see the module docstring).

    ``ids``/``counts`` (sorted by id) are a Misra–Gries summary with tracked
    error ``error_bound`` (``capacity`` counters at most), or the exact
    histogram when ``capacity`` is None. Build one per block with
    :meth:`from_values`, combine with :meth:`merge` (returns a new summary).
    """

    name: str
    num_embeddings: int
    capacity: Optional[int]
    rows: int = 0
    values: int = 0
    nulls: int = 0
    invalid: int = 0
    invalid_examples: Tuple[int, ...] = ()
    min_id: Optional[int] = None
    max_id: Optional[int] = None
    max_bag: int = 0
    ids: np.ndarray = None  # type: ignore[assignment]
    counts: np.ndarray = None  # type: ignore[assignment]
    error_bound: int = 0
    bitmap: Optional[np.ndarray] = None  # packed bits of seen valid ids, when num_embeddings is small
    hll: Optional[HyperLogLog] = None  # when num_embeddings is large and not exact

    def __post_init__(self) -> None:
        if self.ids is None:
            self.ids = np.zeros(0, np.int64)
            self.counts = np.zeros(0, np.int64)

    @property
    def exact(self) -> bool:
        return self.capacity is None

    @classmethod
    def from_values(
        cls,
        name: str,
        num_embeddings: int,
        values: np.ndarray,
        *,
        rows: int,
        nulls: int = 0,
        max_bag: int = 1,
        capacity: Optional[int] = DEFAULT_NUM_HEAVY_HITTERS,
    ) -> "TableSummary":
        """Summarises one block: ``values`` are the block's non-null ids (int64, flattened bags)."""
        v = values.astype(np.int64, copy=False)
        s = cls(name, num_embeddings, capacity, rows=rows, values=int(v.size), nulls=nulls, max_bag=int(max_bag))
        if v.size:
            s.min_id, s.max_id = int(v.min()), int(v.max())
            if s.min_id < 0 or s.max_id >= num_embeddings:
                bad = (v < 0) | (v >= num_embeddings)
                s.invalid = int(np.count_nonzero(bad))
                s.invalid_examples = tuple(int(x) for x in np.unique(v[bad])[:NUM_INVALID_EXAMPLES])
                v = v[~bad]
        ids, counts = _count_ids(v, num_embeddings)
        if capacity is None:
            s.ids, s.counts = ids, counts
            return s
        if num_embeddings <= DISTINCT_EXACT_MAX_ROWS:
            bits = np.zeros(num_embeddings, dtype=bool)
            bits[ids] = True
            s.bitmap = np.packbits(bits)
        else:
            s.hll = HyperLogLog()
            s.hll.add(ids)
        s.ids, s.counts, s.error_bound = _mg_reduce(ids, counts, capacity)
        return s

    def merge(self, other: "TableSummary") -> "TableSummary":
        """Combines the summaries of two disjoint sets of rows (the inputs are not modified)."""
        if (self.name, self.num_embeddings, self.capacity) != (other.name, other.num_embeddings, other.capacity):
            raise ValueError(f"cannot merge summaries of {self.name!r} and {other.name!r} with different settings")
        mins = [x for x in (self.min_id, other.min_id) if x is not None]
        maxs = [x for x in (self.max_id, other.max_id) if x is not None]
        out = TableSummary(
            self.name,
            self.num_embeddings,
            self.capacity,
            rows=self.rows + other.rows,
            values=self.values + other.values,
            nulls=self.nulls + other.nulls,
            invalid=self.invalid + other.invalid,
            invalid_examples=tuple(sorted(set(self.invalid_examples) | set(other.invalid_examples)))[
                :NUM_INVALID_EXAMPLES
            ],
            min_id=min(mins) if mins else None,
            max_id=max(maxs) if maxs else None,
            max_bag=max(self.max_bag, other.max_bag),
        )
        ids, counts = _add_counts(self.ids, self.counts, other.ids, other.counts)
        sub = 0
        if self.capacity is not None:
            ids, counts, sub = _mg_reduce(ids, counts, self.capacity)
        out.ids, out.counts = ids, counts
        out.error_bound = self.error_bound + other.error_bound + sub
        if self.bitmap is not None and other.bitmap is not None:
            out.bitmap = self.bitmap | other.bitmap
        if self.hll is not None and other.hll is not None:
            out.hll = self.hll.merge(other.hll)
        return out

    def distinct(self) -> Tuple[int, bool]:
        """(number of distinct valid ids, whether it is exact)."""
        if self.exact or self.error_bound == 0:  # no counter was ever dropped: the histogram is complete
            return int(self.ids.size), True
        if self.bitmap is not None:
            return int(np.unpackbits(self.bitmap, count=self.num_embeddings).sum()), True
        assert self.hll is not None
        return int(round(self.hll.estimate())), False

    def heavy_hitters(self, limit: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """(ids, counts) ordered by count descending, ties by id ascending; at most ``limit``."""
        order = np.lexsort((self.ids, -self.counts))
        if limit is not None:
            order = order[:limit]
        return self.ids[order], self.counts[order]

    def to_dict(self) -> Dict[str, Any]:
        distinct, distinct_exact = self.distinct()
        hh_ids, hh_counts = self.heavy_hitters()
        return {
            "num_embeddings": int(self.num_embeddings),
            "rows": int(self.rows),
            "values": int(self.values),
            "distinct": distinct,
            "distinct_exact": distinct_exact,
            "invalid": int(self.invalid),
            "invalid_examples": [int(x) for x in self.invalid_examples],
            "nulls": int(self.nulls),
            "min_id": self.min_id,
            "max_id": self.max_id,
            "pooling_factor": {
                "mean": float(self.values / self.rows) if self.rows else 0.0,
                "max": int(self.max_bag),
            },
            "heavy_hitters": np.stack([hh_ids, hh_counts], axis=1).tolist() if hh_ids.size else [],
            "error_bound": int(self.error_bound),
        }


# ---- PER-BLOCK PASS ---- #


def _column_values(col: pa.ChunkedArray, multi_hot: bool) -> Tuple[np.ndarray, int, int]:
    """(non-null ids as int64, nulls, max bag length) of one sparse column of a block, vectorized.

    One-hot: nulls are null rows. Multi-hot: nulls are null bags plus null ids
    inside bags; a null bag counts as an empty bag. ``flatten`` honours slice
    offsets, so no per-row Python work happens.
    """
    if not multi_hot:
        nulls = col.null_count
        if nulls:
            col = pc.drop_null(col)
        arr = col.to_numpy() if col.num_chunks else np.zeros(0, np.int64)
        return arr.astype(np.int64, copy=False), int(nulls), 1
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
        parts.append(flat.to_numpy(zero_copy_only=False).astype(np.int64, copy=False))
    values = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return values, int(nulls), max_bag


def _summarize_table(
    table: pa.Table, features: Sequence[Tuple[str, int, bool]], capacity: Optional[int]
) -> Dict[str, TableSummary]:
    """Summaries of every sparse column of one in-memory table."""
    out: Dict[str, TableSummary] = {}
    for name, num_embeddings, multi_hot in features:
        values, nulls, max_bag = _column_values(table.column(name), multi_hot)
        out[name] = TableSummary.from_values(
            name, num_embeddings, values, rows=table.num_rows, nulls=nulls, max_bag=max_bag, capacity=capacity
        )
    return out


def _summarize_files(
    batch: pa.Table, *, features: Sequence[Tuple[str, int, bool]], capacity: Optional[int], rows_per_read: int,
    label: Optional[str] = None, dense: Sequence[str] = (),
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
    columns = names + ([label] if label else []) + list(dense)
    blobs = []
    for path in batch.column("path").to_pylist():
        merger = _TreeMerger()
        values = ValueSummary()
        try:
            pf = pq.ParquetFile(path)
            for rb in pf.iter_batches(batch_size=rows_per_read, columns=columns, use_threads=False):
                table = pa.Table.from_batches([rb])
                if features:
                    merger.push(_summarize_table(table, features, capacity))
                values = values + ValueSummary.of_table(table, label, dense)
        except (pa.ArrowException, OSError, ValueError) as e:
            # Returned, not raised: Ray Data would wrap a raised error in its own exception and traceback.
            blobs.append(pickle.dumps(DataError(
                f"Parquet file {path!r} cannot be read ({type(e).__name__}: {str(e).strip()[:200]}). It is corrupt "
                "or truncated: rewrite it (e.g. rerun the conversion that made it) or remove it from the dataset.",
                category="corrupt_file",
            ), protocol=pickle.HIGHEST_PROTOCOL))
            continue
        part = merger.result()
        if part is None:  # a file without rows, or no sparse tables asked for
            part = {n: TableSummary(n, v, capacity) for n, v, _ in features}
        blobs.append(pickle.dumps((part, values), protocol=pickle.HIGHEST_PROTOCOL))
    return pa.table({"summary": pa.array(blobs, type=pa.large_binary())})


def merge_summaries(a: Dict[str, TableSummary], b: Dict[str, TableSummary]) -> Dict[str, TableSummary]:
    return {name: a[name].merge(b[name]) for name in a}


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


# ---- DRIVER ---- #


def dataset_fingerprint(data_dir: str, split: str = TRAIN_SPLIT) -> str:
    """A short hash of ``schema.yaml`` and the split's parquet file names, sizes and mtimes.

    Cheap (one ``stat`` per file, no reads) and changes whenever a file is
    rewritten, so a training job can reuse a ``stats.json`` whose fingerprint
    matches instead of recomputing it.
    """
    h = hashlib.sha256()
    schema_path = os.path.join(data_dir, SCHEMA_FILE)
    if os.path.isfile(schema_path):
        with open(schema_path, "rb") as f:
            h.update(f.read())
    h.update(split.encode())
    for path in parquet_files(data_dir, split):
        st = os.stat(path)
        h.update(f"\0{os.path.basename(path)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return "sha256:" + h.hexdigest()[:32]


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
) -> Dict[str, Any]:
    """Computes the ``stats.json`` dict of ``data_dir/split`` in one streaming Ray Data pass.

    The same pass counts bad label and dense values (``"values"``, see
    :mod:`rayemb.data.checks`); ``tables=False`` does only that (the validation
    split needs no table statistics).

    One Ray Data map task per parquet file reads it in bounded batches and
    emits that file's summaries; the driver merges them in a tree as they
    stream in.

    ``exact=True`` keeps the full histogram of every table (heavy_hitters lists
    every id, error_bound 0): memory O(distinct ids), for small data and tests.
    Otherwise each table keeps a Misra–Gries summary of ``num_heavy_hitters``
    counters. Starts Ray (:func:`rayemb._ray.init_ray`) only when it is not running. Checks
    the columns first (missing column / wrong type: :class:`DataError` naming it).
    Out-of-range ids are counted, not fatal: apply :func:`check_ids` with the
    job's ``data.id_policy``.
    """
    import ray

    if num_heavy_hitters < 1:
        raise DataError(f"num_heavy_hitters={num_heavy_hitters}: keep at least one heavy-hitter counter per table.")
    schema = DatasetSchema.load(data_dir)
    check_parquet_columns(schema, data_dir, split)
    files = parquet_files(data_dir, split)
    fingerprint = dataset_fingerprint(data_dir, split)
    features = [(f.name, int(f.num_embeddings), bool(f.multi_hot)) for f in schema.sparse] if tables else []
    total_rows = 0
    if progress:
        total_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    init_ray()
    ctx = ray.data.DataContext.get_current()
    old_bars = ctx.enable_progress_bars
    ctx.enable_progress_bars = False
    t0 = time.monotonic()
    merger = _TreeMerger()
    value_summary = ValueSummary()
    rows = values = blocks = 0
    last_print = t0
    try:
        # A dataset of file paths whose map tasks read with pyarrow directly: measured here,
        # read_parquet's reader decoded ~32 M ids/s on 2 CPUs where ParquetFile.iter_batches
        # decodes ~70-250 M ids/s per CPU, so reading dominated the pass (jobs/bench/stats.py).
        # A few files per task (about 4 tasks per CPU) so per-task overhead stays small next to the work.
        cpus = max(1, int(ray.available_resources().get("CPU", 1)))
        num_blocks = max(1, min(len(files), 4 * cpus))
        ds = ray.data.from_items([{"path": p} for p in files], override_num_blocks=num_blocks).map_batches(
            _summarize_files,
            batch_size=None,
            batch_format="pyarrow",
            fn_kwargs={
                "features": features,
                "capacity": None if exact else num_heavy_hitters,
                "rows_per_read": DEFAULT_ROWS_PER_READ,
                "label": schema.label,
                "dense": list(schema.dense),
            },
        )
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2):
            for blob in batch.column("summary").to_pylist():
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
    finally:
        ctx.enable_progress_bars = old_bars
    merged = merger.result()
    elapsed = time.monotonic() - t0
    if merged is None:  # files with zero rows
        merged = {
            name: TableSummary(name, v, None if exact else num_heavy_hitters) for name, v, _ in features
        }
    if progress:
        _print_progress(rows, total_rows or rows, values, t0)
    logger.info("stats of %s/%s: %d rows, %d blocks, %.1f s", data_dir, split, rows, blocks, elapsed)
    return {
        "schema_version": STATS_SCHEMA_VERSION,
        "rows": int(rows),
        "fingerprint": fingerprint,
        "data_dir": os.path.abspath(data_dir),
        "split": split,
        "exact": bool(exact),
        "num_heavy_hitters": None if exact else int(num_heavy_hitters),
        "elapsed_s": round(elapsed, 3),
        "values": value_summary.to_dict(),
        "tables": {name: merged[name].to_dict() for name, _, _ in features},
    }


# ---- CHECKS, FILES, PLOTS ---- #


def check_ids(stats: Mapping[str, Any], schema: DatasetSchema, policy: str = "error") -> None:
    """Applies ``data.id_policy`` to the out-of-range ids that ``stats`` counted.

    ``"error"`` raises :class:`DataError` naming every offending column, how many
    values and example values; ``"hash"`` (id mod num_embeddings) and ``"clip"``
    (to ``[0, num_embeddings - 1]``) log a warning, since the batch conversion
    remaps those ids.
    """
    if policy not in ID_POLICIES:
        raise DataError(f"Unknown id policy {policy!r}; data.id_policy must be one of {ID_POLICIES}.")
    bad = []
    for feat in schema.sparse:
        t = stats["tables"].get(feat.name)
        if t is None:
            raise DataError(
                f"stats.json has no entry for sparse column {feat.name!r}; it was computed for another dataset. "
                "Recompute it with `rayemb stats --data DIR --out stats.json`."
            )
        if t["invalid"]:
            bad.append(
                f"column {feat.name!r}: {t['invalid']:,} of {t['values']:,} ids outside [0, {feat.num_embeddings}) "
                f"(e.g. {t.get('invalid_examples', [])}, observed range [{t['min_id']}, {t['max_id']}])"
            )
    if not bad:
        return
    if policy == "error":
        raise DataError(
            "Dataset has out-of-range sparse ids: " + "; ".join(bad) + ". Fix num_embeddings in schema.yaml to "
            "cover the ids, or choose a policy: `--set data.id_policy=hash` (id mod num_embeddings) or "
            "`--set data.id_policy=clip` (clamp to the table).",
            category="invalid_ids",
        )
    logger.warning("out-of-range ids will be remapped by id_policy=%s: %s", policy, "; ".join(bad))


def write_stats_json(stats: Mapping[str, Any], path: str) -> str:
    """Writes ``stats`` atomically (temp file + rename), so readers never see half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(stats, f, indent=1)
    os.replace(tmp, path)
    return path


def load_stats_json(path: str) -> Dict[str, Any]:
    try:
        with open(path) as f:
            stats = json.load(f)
    except FileNotFoundError:
        raise DataError(f"Stats file {path!r} does not exist. Create it with `rayemb stats --data DIR --out {path}`.") from None
    except json.JSONDecodeError as e:
        raise DataError(f"Stats file {path!r} is not valid JSON ({e}). Recompute it with `rayemb stats`.") from None
    if not isinstance(stats, dict) or stats.get("schema_version") != STATS_SCHEMA_VERSION or "tables" not in stats:
        raise DataError(
            f"Stats file {path!r} is not a stats.json of schema_version {STATS_SCHEMA_VERSION}. "
            "Recompute it with `rayemb stats --data DIR --out stats.json`."
        )
    return stats


def load_or_compute_stats(
    data_dir: str,
    stats_path: Optional[str] = None,
    *,
    split: str = TRAIN_SPLIT,
    exact: bool = False,
    num_heavy_hitters: int = DEFAULT_NUM_HEAVY_HITTERS,
    progress: bool = False,
) -> Dict[str, Any]:
    """Reuses ``stats_path`` when its fingerprint and split match ``data_dir``, else computes stats.

    A stale file (the data changed) is logged and recomputed, never silently used.
    """
    if stats_path and os.path.isfile(stats_path):
        stats = load_stats_json(stats_path)
        if (stats.get("fingerprint") == dataset_fingerprint(data_dir, split) and stats.get("split", split) == split
                and "values" in stats):
            logger.info("reusing %s (fingerprint matches %s)", stats_path, data_dir)
            return stats
        logger.warning("%s was computed for other data than %s/%s (or by an older rayemb); recomputing",
                       stats_path, data_dir, split)
    return compute_stats(data_dir, exact=exact, split=split, num_heavy_hitters=num_heavy_hitters, progress=progress)


def plot_frequencies(stats: Mapping[str, Any], png_path: str) -> str:
    """Log-log rank/count plot of every table's heavy hitters, one panel per table in a grid."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(stats["tables"])
    cols = max(1, math.ceil(math.sqrt(len(names))))
    grid_rows = max(1, math.ceil(len(names) / cols))
    fig = Figure(figsize=(2.6 * cols, 2.1 * grid_rows))
    FigureCanvasAgg(fig)
    for i, name in enumerate(names):
        ax = fig.add_subplot(grid_rows, cols, i + 1)
        t = stats["tables"][name]
        counts = np.array([c for _, c in t["heavy_hitters"]], dtype=np.float64)
        counts = counts[counts > 0]
        if counts.size:
            ax.loglog(np.arange(1, counts.size + 1), counts, lw=1.2)
        ax.set_title(f"{name} (V={t.get('num_embeddings', '?')})", fontsize=8)
        ax.tick_params(labelsize=6)
    fig.suptitle(f"id frequency by rank ({stats.get('rows', 0):,} rows)", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
    fig.savefig(png_path, dpi=90)
    return png_path


def format_stats_table(stats: Mapping[str, Any]) -> str:
    """A fixed-width per-table summary for the terminal."""
    head = f"{'table':<8}{'V':>11}{'distinct':>11}{'pool':>7}{'top-1 %':>9}{'invalid':>9}{'err':>8}"
    lines = [head, "-" * len(head)]
    for name, t in stats["tables"].items():
        top = t["heavy_hitters"][0][1] / t["values"] * 100 if t["heavy_hitters"] and t["values"] else 0.0
        approx = "" if t["distinct_exact"] else "~"
        lines.append(
            f"{name:<8}{t.get('num_embeddings', 0):>11,}{approx + format(t['distinct'], ','):>11}"
            f"{t['pooling_factor']['mean']:>7.2f}{top:>9.2f}{t['invalid']:>9,}{t['error_bound']:>8,}"
        )
    return "\n".join(lines)


# ---- CLI ---- #


def add_stats_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rayemb stats`` (the lead's cli.py calls this, then :func:`stats_main`)."""
    parser.add_argument("--data", required=True, help="dataset directory (schema.yaml, train/, valid/)")
    parser.add_argument("--out", required=True, help="stats.json to write")
    parser.add_argument("--exact", action="store_true", help="exact counts of every id (small data, slower)")
    parser.add_argument("--split", default=TRAIN_SPLIT, help="which split to scan (default: %(default)s)")
    parser.add_argument(
        "--num-heavy-hitters", type=int, default=DEFAULT_NUM_HEAVY_HITTERS,
        help="Misra-Gries counters per table (default: %(default)s)",
    )
    parser.add_argument("--plot", default=None, help="also write a log-log frequency PNG here")


def stats_main(args: argparse.Namespace) -> int:
    """``rayemb stats --data DIR --out stats.json [--exact]``: computes, writes, prints a summary.

    User errors propagate as :class:`DataError` for the CLI's error handler.
    """
    stats = compute_stats(
        args.data,
        exact=bool(getattr(args, "exact", False)),
        split=getattr(args, "split", TRAIN_SPLIT),
        num_heavy_hitters=getattr(args, "num_heavy_hitters", DEFAULT_NUM_HEAVY_HITTERS),
        progress=True,
    )
    write_stats_json(stats, args.out)
    print(format_stats_table(stats))
    bad = [n for n, t in stats["tables"].items() if t["invalid"]]
    if bad:
        print(f"warning: out-of-range ids in {bad}; training fails unless data.id_policy is hash or clip")
    if getattr(args, "plot", None):
        plot_frequencies(stats, args.plot)
        print(f"wrote {args.plot}")
    print(f"wrote {args.out} ({stats['rows']:,} rows, {stats['elapsed_s']:.1f} s)")
    return 0


__all__ = [
    "TableSummary", "HyperLogLog", "compute_stats", "check_ids", "dataset_fingerprint",
    "write_stats_json", "load_stats_json", "load_or_compute_stats", "plot_frequencies",
    "format_stats_table", "add_stats_arguments", "stats_main", "merge_summaries",
    "DEFAULT_NUM_HEAVY_HITTERS", "STATS_SCHEMA_VERSION",
]
