"""Mergeable summaries of one sparse table: HyperLogLog, Misra–Gries and :class:`TableSummary`.

Every quantity the statistics pass (:mod:`rayemb.data.stats`) needs is a
*mergeable summary* (Agarwal et al., "Mergeable Summaries", PODS 2012): built
per block, combined in any order, with bounded memory. Per table
(:class:`TableSummary`):

- rows, values (non-null ids, including invalid ones), nulls, invalid ids
  (negative or ``>= num_embeddings``) with a few example values, min/max id,
  pooling factor (ids per bag: mean and max);
- distinct valid ids: exact (a bitmap of ``num_embeddings`` bits, merged with OR)
  when ``num_embeddings <= DISTINCT_EXACT_MAX_ROWS``, otherwise a HyperLogLog
  sketch (:class:`HyperLogLog`);
- heavy hitters: a Misra–Gries summary of capacity ``k`` (see :func:`_mg_reduce`
  for the maths and the error bound), or exact counts of every id with
  ``capacity=None`` (small data, and the test oracle).

A raw-id table (``ids: raw``) has no id range: every int64 value is an id
(strings arrive hashed), none is invalid, ``num_embeddings`` is its capacity
and says nothing about the ids, so its distinct ids are counted by the
histogram while no counter was dropped and by HyperLogLog after, never by a
bitmap of ``num_embeddings`` bits.

Example::

    >>> a = TableSummary.from_values("C1", 1000, np.array([3, 3, 7]), rows=3, capacity=2)
    >>> b = TableSummary.from_values("C1", 1000, np.array([3, 9]), rows=2, capacity=2)
    >>> a.merge(b).to_stats().heavy_hitters.tolist()
    [[3, 3]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from rayemb.data.stats_types import TableStats

#: Misra–Gries capacity k: counters kept per table (16 bytes each per summary)
DEFAULT_NUM_HEAVY_HITTERS = 4096
#: tables with at most this many rows count distinct ids exactly with a bitmap (128 KiB)
DISTINCT_EXACT_MAX_ROWS = 1 << 20
#: HyperLogLog precision p: m = 2**p registers of one byte (16 KiB), std. error 1.04/sqrt(m) = 0.81 %
HLL_PRECISION = 14
#: example invalid ids kept per table for error messages
NUM_INVALID_EXAMPLES = 5
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


def _count_ids(ids: np.ndarray, num_embeddings: Optional[int]) -> Tuple[np.ndarray, np.ndarray]:
    """Exact (distinct ids sorted ascending, counts) of valid ids ``0 <= id < num_embeddings``.

    Uses ``np.bincount`` (O(n + V), faster than sorting) when the table is
    not much larger than the block, else ``np.unique``; ``num_embeddings``
    None (raw ids, any int64): always ``np.unique``.
    """
    if ids.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if num_embeddings is not None and num_embeddings <= _DENSE_COUNT_FACTOR * ids.size + (1 << 16):
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
    hll: Optional[HyperLogLog] = None  # when num_embeddings is large (or the ids raw) and not exact
    #: a raw-id table: any int64 is an id (module docstring)
    raw: bool = False

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
        raw: bool = False,
    ) -> "TableSummary":
        """Summarises one block: ``values`` are the block's non-null ids (int64, flattened bags)."""
        v = values.astype(np.int64, copy=False)
        s = cls(name, num_embeddings, capacity, rows=rows, values=int(v.size), nulls=nulls, max_bag=int(max_bag),
                raw=raw)
        if v.size:
            s.min_id, s.max_id = int(v.min()), int(v.max())
            if not raw and (s.min_id < 0 or s.max_id >= num_embeddings):
                bad = (v < 0) | (v >= num_embeddings)
                s.invalid = int(np.count_nonzero(bad))
                s.invalid_examples = tuple(int(x) for x in np.unique(v[bad])[:NUM_INVALID_EXAMPLES])
                v = v[~bad]
        ids, counts = _count_ids(v, None if raw else num_embeddings)
        if capacity is None:
            s.ids, s.counts = ids, counts
            return s
        if not raw and num_embeddings <= DISTINCT_EXACT_MAX_ROWS:
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
        if (self.name, self.num_embeddings, self.capacity, self.raw) != (other.name, other.num_embeddings,
                                                                         other.capacity, other.raw):
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
            raw=self.raw,
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

    def to_stats(self) -> TableStats:
        """The final statistics of this table (one entry of stats.json's ``tables``)."""
        distinct, distinct_exact = self.distinct()
        hh_ids, hh_counts = self.heavy_hitters()
        return TableStats(
            num_embeddings=int(self.num_embeddings),
            rows=int(self.rows),
            values=int(self.values),
            distinct=distinct,
            distinct_exact=distinct_exact,
            invalid=int(self.invalid),
            invalid_examples=tuple(int(x) for x in self.invalid_examples),
            nulls=int(self.nulls),
            min_id=self.min_id,
            max_id=self.max_id,
            pooling_mean=float(self.values / self.rows) if self.rows else 0.0,
            pooling_max=int(self.max_bag),
            heavy_hitters=np.stack([hh_ids, hh_counts], axis=1),
            error_bound=int(self.error_bound),
            ids="raw" if self.raw else "encoded",
        )


def merge_summaries(a: Dict[str, TableSummary], b: Dict[str, TableSummary]) -> Dict[str, TableSummary]:
    """Merges two ``{table name: summary}`` dicts of disjoint rows, table by table."""
    return {name: a[name].merge(b[name]) for name in a}


__all__ = [
    "HyperLogLog", "TableSummary", "merge_summaries", "DEFAULT_NUM_HEAVY_HITTERS", "DISTINCT_EXACT_MAX_ROWS",
    "HLL_PRECISION", "NUM_INVALID_EXAMPLES",
]
