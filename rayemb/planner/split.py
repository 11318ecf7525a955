"""The frequent-category split: which ids of each table are hot (replicated on every rank).

A split stage turns the heavy hitters of the dataset statistics
(:class:`rayemb.data.stats_types.DatasetStats`, what ``stats.json`` holds)
into a per-table hot id set F and the predicted hot share h (the fraction of
lookups that hit F), which decide the hybrid embedding's traffic:
all-reduce of |F|·D·s plus 2·(1-h)·B·P·D·s for the cold per-id exchange.

The stage is pluggable (:class:`SplitRule`, one verb); the default is
:class:`HugeCTRSplitRule`, the frequent-category criterion of HugeCTR's hybrid
embedding (NVIDIA-Merlin/HugeCTR,
``HugeCTR/src/embeddings/hybrid_embedding/calibration_data.cu``:
``ModelInitializationFunctors::calculate_threshold`` and
``calculate_num_frequent_categories``).

Example::

    >>> rule = HugeCTRSplitRule(world_size=8, global_batch_size=65536, num_nodes=2)
    >>> split = rule.split(load_stats_json("stats.json"))
    >>> split.tables["C1"].hot_ids[:3], split.tables["C1"].hot_share
    (array([4117, 18, 733]), 0.41)
    >>> split.log_summary()
"""

from __future__ import annotations

import abc
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Union

import numpy as np

from rayemb.errors import PlanError

if TYPE_CHECKING:
    from rayemb.data.stats_types import DatasetStats

logger = logging.getLogger(__name__)

#: HugeCTR's default bound on the per-iteration duplication probability (single-node rule)
DEFAULT_P_DUP_MAX = 0.01
DEFAULT_BYTES_PER_ELEMENT = 4  # fp32


# ---- VALUE TYPES ---- #


@dataclass(frozen=True, eq=False)
class TableSplit:
    """The hot set of one table.

    ``hot_ids`` (int64) are ordered by count descending, ``hot_counts`` are the
    heavy-hitter counts (lower bounds when the stats were approximate).
    ``limited_by`` says what fixed |F|: ``"threshold"`` (the rule),
    ``"memory"`` (the per-rank budget), ``"candidates"`` (fewer known heavy
    hitters than the rule asked for) or ``"capacity"`` (a raw-id table, whose
    managed-collision half must keep 2 slots per rank of its capacity; its hot
    ids are raw values). ``complete`` is False when the stats' error bound reaches the
    threshold count, i.e. ids the rule would make hot may be missing:
    recompute stats with more heavy hitters.
    """

    name: str
    num_embeddings: int
    hot_ids: np.ndarray
    hot_counts: np.ndarray
    hot_share: float
    threshold: float  # expected occurrences per global batch that make an id hot
    limited_by: str
    complete: bool

    @property
    def num_hot(self) -> int:
        return int(self.hot_ids.size)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready summary (without the ids themselves)."""
        return {
            "num_embeddings": self.num_embeddings,
            "num_hot": self.num_hot,
            "hot_share": self.hot_share,
            "threshold_per_batch": self.threshold,
            "limited_by": self.limited_by,
            "complete": self.complete,
        }


@dataclass(frozen=True, eq=False)
class FrequentSplit:
    """Hot sets of all tables, plus the inputs they were computed for."""

    tables: Dict[str, TableSplit]
    world_size: int
    global_batch_size: int
    rule: str
    params: Dict[str, Any] = field(default_factory=dict)

    def hot_ids(self, name: str) -> np.ndarray:
        return self.tables[name].hot_ids

    def hot_bytes_per_rank(self, embedding_dim: int, bytes_per_element: int = DEFAULT_BYTES_PER_ELEMENT) -> int:
        """Bytes of replicated (hot) rows every rank holds, weights only."""
        return sum(t.num_hot for t in self.tables.values()) * embedding_dim * bytes_per_element

    def summary_table(self) -> str:
        head = f"{'table':<8}{'V':>11}{'|F|':>9}{'h':>8}{'thr/batch':>11}  limited_by"
        lines = [head, "-" * (len(head) + 2)]
        for t in self.tables.values():
            mark = "" if t.complete else " (incomplete: raise --num-heavy-hitters)"
            lines.append(
                f"{t.name:<8}{t.num_embeddings:>11,}{t.num_hot:>9,}{t.hot_share:>8.3f}{t.threshold:>11.3g}"
                f"  {t.limited_by}{mark}"
            )
        return "\n".join(lines)

    def log_summary(self) -> None:
        logger.info(
            "frequent-category split (%s, W=%d, B=%d):\n%s",
            self.rule, self.world_size, self.global_batch_size, self.summary_table(),
        )

    def to_dict(self) -> Dict[str, Any]:
        return {
            "rule": self.rule,
            "world_size": self.world_size,
            "global_batch_size": self.global_batch_size,
            "params": dict(self.params),
            "tables": {n: t.to_dict() for n, t in self.tables.items()},
        }


# ---- STAGE ---- #


class SplitRule(abc.ABC):
    """Chooses the hot ids of every table from the dataset statistics (:func:`rayemb.data.stats.compute_stats`)."""

    @abc.abstractmethod
    def split(self, stats: "DatasetStats") -> FrequentSplit:
        ...


def _round_up(n: int, w: int) -> int:
    return -(-n // w) * w


class HugeCTRSplitRule(SplitRule):
    """HugeCTR's frequent-category rule, hot set rounded to a multiple of W, under a memory cap.

    With global batch B, world size W over N nodes, and a category c seen
    ``count(c)`` times in ``rows`` samples (for multi-hot features, id
    occurrences across bags), its expected count per global batch is
    ``e(c) = count(c) / rows * B``; c is hot when ``e(c) >= T`` with

    - N > 1 (HugeCTR's IB_NVLink case):
      ``T = N * (BW_a2a / BW_allreduce) * eff * N / (N - 1)``
      (where the all-to-all of one cold occurrence costs as much as the
      all-reduce share of one replicated row);
    - N = 1, W > 1 (NVLink_SingleNode): ``T = B * sqrt(2 p_dup_max / (M (M - 1)))``
      with M = B / W, so a cold category is duplicated within a rank's batch
      with probability at most ``p_dup_max``;
    - W = 1: nothing is communicated, so nothing is hot (T = inf);
    - ``threshold`` given (W > 1): T is that, e.g. the break-even of the
      calibrated step-time model (:func:`rayemb.planner.step_time.hot_threshold`,
      which :func:`rayemb.planner.tables.split_rule` uses across nodes); a
      mapping gives each table its own T (the break-even depends on its dim).

    HugeCTR states T per ``num_iterations`` batches and compares raw counts;
    dividing by the number of batches ``rows / B`` gives the per-batch form above.

    The hot count n is rounded UP to a multiple of W (each rank then owns an
    equal slice of the hot-row updates), taking the next most frequent ids;
    when fewer candidates are known, it is rounded down instead (HugeCTR
    subtracts W when the rounded count exceeds the categories). Hot rows are
    replicated, so with ``memory_budget_bytes`` the most frequent rows across
    all tables (by e(c)) are kept while ``sum |F_t| * (D * s + opt)`` fits (opt:
    ``optimizer_bytes_per_row``, the state a replicated row of ``train.embedding_optimizer``
    keeps, :func:`rayemb.planner.optimizer_state.optimizer_state_bytes`), and
    each table is rounded down to a multiple of W. ``embedding_dim`` and
    ``optimizer_bytes_per_row`` may be mappings table -> value, one entry for
    every table of the statistics (tables of unequal widths).

    Counts come from heavy-hitter summaries whose counts are lower bounds
    (true count in ``[count, count + error_bound]``); an id is hot on its
    lower bound, so the rule never over-replicates on estimation error.
    """

    def __init__(
        self,
        world_size: int,
        global_batch_size: int,
        *,
        num_nodes: Optional[int] = None,
        bw_all_to_all: float = 1.0,
        bw_all_reduce: float = 1.0,
        efficiency: float = 1.0,
        p_dup_max: float = DEFAULT_P_DUP_MAX,
        memory_budget_bytes: Optional[int] = None,
        embedding_dim: Union[int, Mapping[str, int]] = 16,
        bytes_per_element: int = DEFAULT_BYTES_PER_ELEMENT,
        optimizer_bytes_per_row: Union[int, Mapping[str, int]] = 0,
        threshold: Union[None, float, Mapping[str, float]] = None,
    ) -> None:
        num_nodes = world_size if num_nodes is None else num_nodes
        checks = [
            (world_size >= 1, f"world_size={world_size} must be at least 1"),
            (global_batch_size >= world_size, f"global_batch_size={global_batch_size} must be >= world_size"),
            (1 <= num_nodes <= world_size, f"num_nodes={num_nodes} must lie in [1, world_size={world_size}]"),
            (bw_all_to_all > 0 and bw_all_reduce > 0, "bandwidths must be positive"),
            (efficiency > 0, f"efficiency={efficiency} must be positive"),
            (0 < p_dup_max < 1, f"p_dup_max={p_dup_max} must lie in (0, 1)"),
            (memory_budget_bytes is None or memory_budget_bytes >= 0, "memory_budget_bytes must be >= 0"),
            (threshold is None or all(t > 0 for t in _values(threshold)), f"threshold={threshold} must be positive"),
        ]
        for ok, msg in checks:
            if not ok:
                raise PlanError(f"Invalid frequent-category split input: {msg}.", category="invalid_input")
        self.world_size = world_size
        self.global_batch_size = global_batch_size
        self.num_nodes = num_nodes
        self.bw_all_to_all = bw_all_to_all
        self.bw_all_reduce = bw_all_reduce
        self.efficiency = efficiency
        self.p_dup_max = p_dup_max
        self.memory_budget_bytes = memory_budget_bytes
        self.embedding_dim = embedding_dim
        self.bytes_per_element = bytes_per_element
        self.optimizer_bytes_per_row = optimizer_bytes_per_row
        #: T given outright (e.g. the calibrated break-even, rayemb.planner.step_time.hot_threshold), else HugeCTR's
        self.given_threshold = threshold

    def threshold(self, table: Optional[str] = None) -> float:
        """T: expected occurrences per global batch from which a category of ``table`` is hot (a per-table
        ``threshold`` mapping needs the table named)."""
        n, w, b = self.num_nodes, self.world_size, self.global_batch_size
        if w == 1:
            return math.inf
        if self.given_threshold is not None:
            return float(_of(self.given_threshold, table, "threshold"))
        if n > 1:
            return n * (self.bw_all_to_all / self.bw_all_reduce) * self.efficiency * n / (n - 1)
        m = b / w
        if m <= 1:
            return math.inf  # one sample per rank: a duplicate within a rank's batch cannot occur
        return b * math.sqrt(2.0 * self.p_dup_max / (m * (m - 1)))

    def _row_bytes(self, name: str) -> int:
        return (int(_of(self.embedding_dim, name, "embedding_dim")) * self.bytes_per_element
                + int(_of(self.optimizer_bytes_per_row, name, "optimizer_bytes_per_row")))

    def split(self, stats: "DatasetStats") -> FrequentSplit:
        self._check_tables(stats)
        w, b = self.world_size, self.global_batch_size
        rows = int(stats.rows)
        cand: Dict[str, np.ndarray] = {}
        counts: Dict[str, np.ndarray] = {}
        n_hot: Dict[str, int] = {}
        limited: Dict[str, str] = {}
        for name, t in stats.tables.items():
            thr = self.threshold(name)
            hh = t.heavy_hitters
            order = np.lexsort((hh[:, 0], -hh[:, 1]))  # count desc, id asc: stats.json order, made certain
            cand[name], counts[name] = hh[order, 0], hh[order, 1]
            expected = counts[name] / max(rows, 1) * b
            n = int(np.count_nonzero(expected >= thr)) if math.isfinite(thr) else 0
            n_r = _round_up(n, w)
            limited[name] = "threshold"
            if n_r > cand[name].size:
                n_r, limited[name] = (cand[name].size // w) * w, "candidates"
            # a raw-id table's hot ids take rows of its capacity; its managed-collision half keeps the rest, at
            # least 2 slots per rank (one is the rank's default row)
            if getattr(t, "ids", "encoded") == "raw":
                room = (int(t.num_embeddings) - 2 * w) // w * w
                if n_r > room:
                    n_r, limited[name] = max(room, 0), "capacity"
            n_hot[name] = n_r
        if self.memory_budget_bytes is not None:
            self._apply_budget(cand, counts, n_hot, limited)
        tables: Dict[str, TableSplit] = {}
        for name, t in stats.tables.items():
            thr, n = self.threshold(name), n_hot[name]
            values = int(t.values)
            thr_count = thr * rows / b if math.isfinite(thr) else math.inf
            tables[name] = TableSplit(
                name=name,
                num_embeddings=int(t.num_embeddings),
                hot_ids=cand[name][:n].copy(),
                hot_counts=counts[name][:n].copy(),
                hot_share=float(counts[name][:n].sum() / values) if values else 0.0,
                threshold=thr,
                limited_by=limited[name],
                complete=int(t.error_bound) < thr_count,
            )
        out = FrequentSplit(tables, w, b, "hugectr" if self.given_threshold is None else "calibrated", self._params())
        for t in tables.values():
            if not t.complete:
                logger.warning(
                    "table %s: heavy-hitter error bound %d reaches the hot threshold; some hot ids may be "
                    "missing. Recompute stats with more --num-heavy-hitters.",
                    t.name, stats.tables[t.name].error_bound,
                )
        return out

    def _apply_budget(
        self,
        cand: Dict[str, np.ndarray],
        counts: Dict[str, np.ndarray],
        n_hot: Dict[str, int],
        limited: Dict[str, str],
    ) -> None:
        """Keeps the globally most frequent hot rows that fit the budget. Mutates n_hot/limited in place."""
        names = [n for n in n_hot if n_hot[n] > 0]
        if not names:
            return
        row_bytes = {n: self._row_bytes(n) for n in names}
        total = sum(n_hot[n] * row_bytes[n] for n in names)
        if total <= self.memory_budget_bytes:
            return
        # Rank every wanted row by its count (same rows -> same denominator), keep a prefix that fits.
        cnt = np.concatenate([counts[n][: n_hot[n]] for n in names])
        owner = np.concatenate([np.full(n_hot[n], i) for i, n in enumerate(names)])
        nbytes = np.array([row_bytes[n] for n in names], dtype=np.int64)[owner]
        order = np.argsort(-cnt, kind="stable")
        fits = np.cumsum(nbytes[order]) <= self.memory_budget_bytes
        kept = np.bincount(owner[order][fits], minlength=len(names))
        for i, n in enumerate(names):
            capped = (int(kept[i]) // self.world_size) * self.world_size
            if capped < n_hot[n]:
                n_hot[n], limited[n] = capped, "memory"

    def _check_tables(self, stats: "DatasetStats") -> None:
        """A per-table input names every table of ``stats`` (PlanError naming the missing ones)."""
        inputs = {"embedding_dim": self.embedding_dim, "optimizer_bytes_per_row": self.optimizer_bytes_per_row,
                  "threshold": self.given_threshold}
        for what, value in inputs.items():
            missing = [n for n in stats.tables if isinstance(value, Mapping) and n not in value]
            if missing:
                raise PlanError(f"Invalid frequent-category split input: {what} is given per table but names no "
                                f"value for table(s) {missing} of the statistics. Give every table one (its own "
                                "embedding_dim, else model.embedding_dim), or one value for all.",
                                category="invalid_input")

    def _params(self) -> Dict[str, Any]:
        """The rule's inputs beyond W and B, and its threshold (FrequentSplit.params): one number, or table ->
        number when the tables' thresholds differ."""
        names = ("num_nodes", "bw_all_to_all", "bw_all_reduce", "efficiency", "p_dup_max", "memory_budget_bytes")
        thr: Any = self.threshold() if not isinstance(self.given_threshold, Mapping) or self.world_size == 1 else {
            n: self.threshold(n) for n in self.given_threshold}
        if isinstance(thr, dict) and len(set(thr.values())) == 1:
            thr = next(iter(thr.values()))
        return {**{n: getattr(self, n) for n in names}, "threshold_per_batch": thr}


def _values(value: Union[float, Mapping[str, float]]) -> Any:
    return value.values() if isinstance(value, Mapping) else (value,)


def _of(value: Any, table: Optional[str], what: str) -> Any:
    """``value``'s entry for ``table`` when it is given per table, else ``value``."""
    if not isinstance(value, Mapping):
        return value
    if table is None:
        raise PlanError(f"{what} is given per table: name the table whose value is wanted.", category="invalid_input")
    return value[table]


__all__ = ["SplitRule", "HugeCTRSplitRule", "TableSplit", "FrequentSplit"]
