"""Criteo-shaped synthetic data with a learnable label.

Shape: a ``label`` column, 13 dense count features ``I1..I13`` and ``T`` sparse
features ``C1..CT`` whose cardinalities are Criteo 1TB's divided by ``scale``.
Ids follow a truncated Zipf(alpha) law over ``[0, V)`` by popularity rank and are
then mapped through a per-table affine bijection ``id = (a * rank + b) mod V``
(``gcd(a, V) = 1``), so hot ids are spread over the id space instead of being
the small numbers.

The label comes from a hidden logistic model: each of the first
``num_signal_tables`` tables carries a hidden weight per id (for multi-hot bags,
the mean over the bag), and the dense features contribute through
``log1p(x)``. ``P(label = 1) = sigmoid(sum of contributions + bias)``, so a model
that learns per-id embeddings can reach an AUC well above 0.5.

Generation is chunked (``chunk_rows`` rows in RAM at a time) and deterministic
for a seed: chunk ``k`` draws from ``SeedSequence([seed, k])``.

**User history** (``sequence_length=L > 0``, ``rayemb gen-data --sequence-length
L``): one more column ``H1`` (list<int64>, a ``sequence: true`` feature with
``max_length: L`` and ``target: C1``) holds each row's recent items, ids of
``C1``'s id space, oldest first, ``0 .. 3L/2`` of them (so some are cut by
``max_length``). Every item has a hidden category ``id mod K``
(``HISTORY_CATEGORIES``); each row's user has a hidden favourite category and
``HISTORY_FOCUS`` of its history items are of that category (the rest any
item, popularity as ``C1``'s). The label's logit gains
``sequence_strength * (f - 1/K)``, ``f`` the share of the ``L`` most recent
history items whose category equals the target ``C1``'s. ``C1``'s category alone
says nothing (every category matches a user's favourite as often), so only a
model that compares the history with ``C1`` (the user-history tower) can use
it. The history draws from its own stream, ``SeedSequence([seed, k, 1])``,
and without the option nothing changes: the same files byte for byte.

Example::

    >>> spec = SyntheticSpec(rows=1000, num_tables=4, seed=0)
    >>> generate(spec, "/tmp/synth")        # writes parquet + schema.yaml
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rayemb.constants import (
    CRITEO_1TB_CARDINALITIES,
    DEFAULT_CARDINALITY_SCALE,
    DEFAULT_GEN_CHUNK_ROWS,
    LABEL_COLUMN,
    MIN_SYNTH_CARDINALITY,
    NUM_DENSE_FEATURES,
    TRAIN_SPLIT,
    VALID_SPLIT,
)
from rayemb.data.schema import DatasetSchema, SparseFeature
from rayemb.errors import DataError

logger = logging.getLogger(__name__)

#: name of the synthetic user-history column and the pooled column it refers to
HISTORY_COLUMN, HISTORY_TARGET = "H1", "C1"
#: the second task's label column (``second_label``)
SECOND_LABEL_COLUMN = "like"
#: hidden item categories (``id mod K``) of the history signal
HISTORY_CATEGORIES = 4
#: share of a user's history items drawn from the user's favourite category
HISTORY_FOCUS = 0.8


@dataclass(frozen=True)
class SyntheticSpec:
    rows: int
    num_tables: int = 26
    zipf_alpha: float = 1.1
    multi_hot: bool = False
    mean_pooling: float = 8.0  # mean ids per bag when multi_hot
    seed: int = 0
    scale: int = DEFAULT_CARDINALITY_SCALE
    valid_fraction: float = 0.1
    chunk_rows: int = DEFAULT_GEN_CHUNK_ROWS
    num_signal_tables: int = 8
    signal_strength: float = 3.0
    cardinalities: Optional[List[int]] = field(default=None)
    #: > 0: add the user-history column H1 keeping this many recent items (see the module docstring)
    sequence_length: int = 0
    #: weight of the history-matches-target term in the label's logit
    sequence_strength: float = 4.0
    #: add a second label column ``like`` (a second task), drawn from its own hidden model over the next
    #: ``num_signal_tables`` tables (none of the first label's features) from its own seed streams: the
    #: columns of the data without it are unchanged
    second_label: bool = False
    #: one Zipf exponent per table instead of ``zipf_alpha`` for all (the named profiles of
    #: :mod:`rayemb.data.profiles` give each table its own)
    zipf_alphas: Optional[Sequence[float]] = field(default=None)

    def __post_init__(self) -> None:
        checks = [
            (self.rows >= 2, f"rows={self.rows}: generate at least 2 rows"),
            (self.num_tables >= 1, f"tables={self.num_tables}: need at least one sparse table"),
            (self.zipf_alpha > 0, f"zipf={self.zipf_alpha}: the Zipf exponent must be positive"),
            (self.mean_pooling >= 1, f"mean_pooling={self.mean_pooling}: must be at least 1"),
            (self.scale >= 1, f"scale={self.scale}: must be at least 1"),
            (0 < self.valid_fraction < 1, f"valid_fraction={self.valid_fraction}: must lie in (0, 1)"),
            (self.chunk_rows >= 1, f"chunk_rows={self.chunk_rows}: must be positive"),
            (self.sequence_length >= 0, f"sequence_length={self.sequence_length}: must be >= 0 (0: no history)"),
            (not (self.sequence_length and self.multi_hot), "sequence_length with multi_hot: the history's target "
             "C1 must be one item per row; drop --multi-hot or --sequence-length"),
            (not self.second_label or self.num_tables > self.num_signal_tables, f"second_label needs tables beyond "
             f"the first label's {self.num_signal_tables} signal tables (it has {self.num_tables}); ask for more "
             "tables"),
            (self.zipf_alphas is None or len(self.zipf_alphas) == self.num_tables, f"{len(self.zipf_alphas or ())} "
             f"Zipf exponents for {self.num_tables} tables: give one per table"),
            (self.zipf_alphas is None or all(a > 0 for a in self.zipf_alphas), f"zipf_alphas={self.zipf_alphas}: "
             "every Zipf exponent must be positive"),
        ]
        for ok, msg in checks:
            if not ok:
                raise DataError(f"Invalid synthetic data request: {msg}.")

    def table_sizes(self) -> List[int]:
        if self.cardinalities is not None:
            if len(self.cardinalities) != self.num_tables:
                raise DataError(
                    f"{len(self.cardinalities)} cardinalities given for {self.num_tables} tables; give one per table."
                )
            return [int(c) for c in self.cardinalities]
        base = CRITEO_1TB_CARDINALITIES
        return [
            max(MIN_SYNTH_CARDINALITY, math.ceil(base[t % len(base)] / self.scale)) for t in range(self.num_tables)
        ]

    def table_alphas(self) -> List[float]:
        """The Zipf exponent of each table."""
        if self.zipf_alphas is not None:
            return [float(a) for a in self.zipf_alphas]
        return [self.zipf_alpha] * self.num_tables

    def schema(self) -> DatasetSchema:
        sizes = self.table_sizes()
        history = (SparseFeature(HISTORY_COLUMN, sizes[0], sequence=True, max_length=self.sequence_length,
                                 target=HISTORY_TARGET),) if self.sequence_length else ()
        return DatasetSchema(
            label=LABEL_COLUMN,
            dense=tuple(f"I{i + 1}" for i in range(NUM_DENSE_FEATURES)),
            sparse=tuple(SparseFeature(f"C{t + 1}", v, self.multi_hot) for t, v in enumerate(sizes)),
            sequence=history,
            extra_labels=(SECOND_LABEL_COLUMN,) if self.second_label else (),
        )


class _ZipfTable:
    """Samples ids of one table: Zipf rank by inverse CDF, then an affine bijection.

    The CDF is built once per table (8 bytes a row, in place: no second array of the table's size) and each
    draw is a binary search in it, so a chunk costs memory in its own rows only, whatever the table's size.
    """

    def __init__(self, num_rows: int, alpha: float, rng: np.random.Generator) -> None:
        self.num_rows = num_rows
        self.cdf = np.arange(1, num_rows + 1, dtype=np.float64)
        np.power(self.cdf, -alpha, out=self.cdf)
        np.cumsum(self.cdf, out=self.cdf)
        self.cdf /= self.cdf[-1]
        a = int(rng.integers(1, max(2, num_rows)))
        while math.gcd(a, num_rows) != 1:
            a += 1
        self.a, self.b = a, int(rng.integers(0, num_rows))

    def rank_to_id(self, rank: np.ndarray) -> np.ndarray:
        return (rank.astype(np.int64) * self.a + self.b) % self.num_rows

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        rank = np.minimum(np.searchsorted(self.cdf, rng.random(n), side="right"), self.num_rows - 1)
        return self.rank_to_id(rank)


class _HiddenModel:
    """The ground truth the label is drawn from (see the module docstring)."""

    def __init__(self, spec: SyntheticSpec, sizes: List[int], rng: np.random.Generator) -> None:
        k = min(spec.num_signal_tables, len(sizes))
        self.table_weights = [rng.standard_normal(sizes[t]).astype(np.float32) for t in range(k)]
        self.scale = spec.signal_strength / math.sqrt(k + 1)
        self.dense_weights = rng.standard_normal(NUM_DENSE_FEATURES).astype(np.float32) * 0.5
        self.bias = -1.0  # ~25-30% positives, like Criteo's click rate

    @classmethod
    def second(cls, spec: SyntheticSpec, sizes: List[int]) -> "_HiddenModel":
        """The second label's hidden model: its own seed stream, the ``num_signal_tables`` tables after the first
        label's, and no dense term (so no feature of the first label's)."""
        rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 0, 2]))
        k = min(spec.num_signal_tables, len(sizes))
        tables = list(range(k, min(2 * k, len(sizes))))
        model = cls.__new__(cls)
        model.tables = tables
        model.table_weights = [rng.standard_normal(sizes[t]).astype(np.float32) for t in tables]
        model.scale = spec.signal_strength / math.sqrt(len(tables) + 1)
        model.dense_weights = np.zeros(NUM_DENSE_FEATURES, np.float32)
        model.bias = -1.0
        return model

    def logits(self, dense: np.ndarray, bag_means: List[np.ndarray]) -> np.ndarray:
        z = (np.log1p(dense) - 1.0) @ self.dense_weights * 0.3
        for w in bag_means:
            z = z + self.scale * w
        return z + self.bias


def _bag_mean(weights: np.ndarray, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    sums = np.add.reduceat(weights[ids], np.r_[0, np.cumsum(lengths)[:-1]]) if ids.size else np.zeros(len(lengths))
    sums = np.where(lengths > 0, sums, 0.0)  # reduceat repeats a value at empty segments
    return (sums / np.maximum(lengths, 1)).astype(np.float32)


def _history(spec: SyntheticSpec, table: _ZipfTable, target: np.ndarray, n: int,
             chunk_idx: int) -> "tuple[pa.Array, np.ndarray]":
    """The history column of one chunk and its logit term (module docstring), from its own seed stream."""
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 1 + chunk_idx, 1]))
    k, length = HISTORY_CATEGORIES, spec.sequence_length
    lengths = rng.integers(0, length + length // 2 + 1, size=n).astype(np.int32)
    total = int(lengths.sum())
    favourite = np.repeat(rng.integers(0, k, size=n), lengths)
    ids = table.sample(total, rng)
    focused = rng.random(total) < HISTORY_FOCUS
    moved = ids - ids % k + favourite  # the same popularity rank's neighbour in the favourite category
    moved = np.where(moved >= table.num_rows, moved - k, moved)
    ids = np.where(focused & (moved >= 0), moved, ids).astype(np.int64)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    # share of the L most recent items (what max_length keeps) in the target's category
    pos = np.arange(total) - np.repeat(offsets[:-1], lengths)
    recent = pos >= np.repeat(lengths - np.minimum(lengths, length), lengths)
    match = ((ids % k) == np.repeat(target % k, lengths)) & recent
    kept = np.minimum(lengths, length)
    share = _bag_mean(match.astype(np.float32), np.arange(total), lengths) * lengths / np.maximum(kept, 1)
    term = np.where(kept > 0, spec.sequence_strength * (share - 1.0 / k), 0.0).astype(np.float32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids, pa.int64())), term


def _chunk(
    spec: SyntheticSpec, tables: List[_ZipfTable], hidden: _HiddenModel, n: int, chunk_idx: int,
    second: Optional[_HiddenModel] = None,
) -> pa.Table:
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 1 + chunk_idx]))
    dense = np.floor(np.exp(rng.normal(1.0, 1.2, size=(n, NUM_DENSE_FEATURES)))).astype(np.float32)
    cols: Dict[str, pa.Array] = {}
    bag_means: List[np.ndarray] = []
    drawn: List["tuple[np.ndarray, np.ndarray]"] = []
    for t, table in enumerate(tables):
        if spec.multi_hot:
            lengths = rng.poisson(spec.mean_pooling, size=n).astype(np.int32)
            ids = table.sample(int(lengths.sum()), rng)
            offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
            cols[f"C{t + 1}"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids, pa.int64()))
        else:
            lengths = np.ones(n, dtype=np.int32)
            ids = table.sample(n, rng)
            cols[f"C{t + 1}"] = pa.array(ids, pa.int64())
        if t < len(hidden.table_weights):
            bag_means.append(_bag_mean(hidden.table_weights[t], ids, lengths))
        drawn.append((ids, lengths))
    z = hidden.logits(dense, bag_means)
    if spec.sequence_length:
        target_ids = cols[HISTORY_TARGET].to_numpy()
        history, term = _history(spec, tables[0], target_ids, n, chunk_idx)
        z = z + term
        cols[HISTORY_COLUMN] = history
    p = 1.0 / (1.0 + np.exp(-z))
    label = (rng.random(n) < p).astype(np.float32)
    out = {LABEL_COLUMN: pa.array(label)}
    if second is not None:  # its own stream: the first label and every feature are drawn as without it
        rng2 = np.random.default_rng(np.random.SeedSequence([spec.seed, 1 + chunk_idx, 2]))
        means = [_bag_mean(w, *drawn[t]) for t, w in zip(second.tables, second.table_weights)]
        z2 = second.logits(dense, means)
        out[SECOND_LABEL_COLUMN] = pa.array((rng2.random(n) < 1.0 / (1.0 + np.exp(-z2))).astype(np.float32))
    out.update({f"I{i + 1}": pa.array(dense[:, i]) for i in range(NUM_DENSE_FEATURES)})
    out.update(cols)
    return pa.table(out)


def generate(
    spec: SyntheticSpec,
    out_dir: str,
    progress: Optional[Callable[[int, int], None]] = None,
) -> DatasetSchema:
    """Writes ``out_dir/{train,valid}/part-*.parquet`` and ``out_dir/schema.yaml``.

    ``progress(rows_done, rows_total)`` is called after every chunk. The schema
    file is written last, so an interrupted run leaves no dataset that looks complete.
    """
    schema = spec.schema()
    sizes = spec.table_sizes()
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 0]))
    tables = [_ZipfTable(v, alpha, rng) for v, alpha in zip(sizes, spec.table_alphas())]
    hidden = _HiddenModel(spec, sizes, rng)
    second = _HiddenModel.second(spec, sizes) if spec.second_label else None

    n_valid = max(1, int(round(spec.rows * spec.valid_fraction)))
    n_train = spec.rows - n_valid
    if n_train < 1:
        raise DataError(f"rows={spec.rows} leaves no training rows after the validation split; ask for more rows.")
    os.makedirs(out_dir, exist_ok=True)
    stale = os.path.join(out_dir, "schema.yaml")
    if os.path.exists(stale):
        os.remove(stale)
    done, chunk_idx = 0, 0
    for split, split_rows in ((TRAIN_SPLIT, n_train), (VALID_SPLIT, n_valid)):
        split_path = os.path.join(out_dir, split)
        os.makedirs(split_path, exist_ok=True)
        for old in os.listdir(split_path):
            if old.endswith(".parquet"):
                os.remove(os.path.join(split_path, old))
        for part, start in enumerate(range(0, split_rows, spec.chunk_rows)):
            n = min(spec.chunk_rows, split_rows - start)
            table = _chunk(spec, tables, hidden, n, chunk_idx, second)
            pq.write_table(table, os.path.join(split_path, f"part-{part:05d}.parquet"))
            done += n
            chunk_idx += 1
            if progress is not None:
                progress(done, spec.rows)
    schema.save(out_dir)
    return schema


def log_progress(every_s: float = 2.0) -> Callable[[int, int], None]:
    """A ``progress`` callback that prints rows/s at most every ``every_s`` seconds."""
    t0 = time.monotonic()
    last = [0.0]

    def cb(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= every_s or done == total:
            last[0] = now
            rate = done / max(now - t0, 1e-9)
            print(f"gen-data: {done:,}/{total:,} rows ({100 * done / total:.0f}%), {rate:,.0f} rows/s", flush=True)

    return cb
