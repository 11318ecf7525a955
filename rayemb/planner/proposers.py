"""TorchRec ``Proposer`` s: a memory-binned knapsack (dynamic program) and equal-row grouping.

Both plug into ``EmbeddingShardingPlanner(proposer=[...])``; the
knapsack proposer is the default of the ``torchrec`` engine
(:mod:`rayemb.planner.torchrec_plan`). Imports torchrec: only the TorchRec
glue imports this module, never the torch-free planner core.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from typing import Callable, List, Optional

import numpy as np
from torchrec.distributed.planner.types import Enumerator, Proposer, ShardingOption, Topology

logger = logging.getLogger(__name__)

#: cap on memory bins (bins_per_device x devices), bounding the knapsack to O(tables x options x bins)
MAX_KNAPSACK_BINS = 4096


def _primary_storage(opt: ShardingOption, tier: str) -> float:
    return float(getattr(opt.total_storage, tier) or 0)


class _PerTableProposer(Proposer):
    """Keeps the search space grouped by table (``fqn``, in order); subclasses propose from it."""

    def __init__(self) -> None:
        self._options: "OrderedDict[str, List[ShardingOption]]" = OrderedDict()

    def load(self, search_space: List[ShardingOption], enumerator: Optional[Enumerator] = None) -> None:
        self._options = OrderedDict()
        for opt in search_space:
            self._options.setdefault(opt.fqn, []).append(opt)
        self._loaded(enumerator)

    def feedback(
        self,
        partitionable: bool,
        plan: Optional[List[ShardingOption]] = None,
        perf_rating: Optional[float] = None,
        storage_constraint: Optional[Topology] = None,
    ) -> None:
        self._told(storage_constraint)

    def _loaded(self, enumerator: Optional[Enumerator]) -> None:
        """Called after :meth:`load` grouped a new search space."""

    def _told(self, storage_constraint: Optional[Topology]) -> None:
        """Called with each of the planner's feedbacks on the last proposal."""


class MemoryBinnedKnapsackProposer(_PerTableProposer):
    r"""Cheapest choice of one sharding option per table under a binned total-memory budget (a knapsack).

    Problem (TorchEasyRec ``tzrec/utils/plan_util.py``, ``DynamicProgrammingProposer``;
    ported to TorchRec as ``torchrec.distributed.planner.proposers.DynamicProgrammingProposer``):
    tables i = 1..M each pick an option j with memory :math:`a_{ij}` and cost
    :math:`b_{ij}`; minimise :math:`\sum_i b_{i,j_i}` subject to
    :math:`\sum_i a_{i,j_i} \le K`, K the memory of all devices. Memory is
    discretised into bins of size :math:`K / n` (:math:`n` = bins per device x
    devices, capped at :data:`MAX_KNAPSACK_BINS`), rounding each :math:`a_{ij}` *up*
    so a binned-feasible plan is truly within K. With :math:`\hat a_{ij}=\lceil a_{ij}/(K/n)\rceil`
    and c[i][k] the least cost of tables 1..i in k bins:

    .. math::
        c[0][0] = 0,\quad c[i][k] = \min_j \bigl(c[i-1][k-\hat a_{ij}] + b_{ij}\bigr),\ k \le n

    Every reachable final bin k is a candidate plan (total memory fits but a
    per-device fit is not guaranteed, so the partitioner decides); the proposer
    emits the Pareto front of (memory, cost) over final bins, cheapest first,
    and the planner keeps the best plan that partitions.

    Differences from the sources: the memory tier is the topology's (HBM on
    CUDA, host DDR on CPU — TorchRec's port divides by zero on CPU topologies
    whose HBM is 0), the recurrence is vectorised over bins with numpy (it
    scales to 1024 devices), and the cost is pluggable (default TorchRec's
    ``ShardingOption.total_perf``).

    Args:
        bins_per_device: memory bins per device (the knapsack's precision).
        cost_fn: ShardingOption -> cost to minimise.
    """

    def __init__(
        self,
        bins_per_device: int = 100,
        cost_fn: Optional[Callable[[ShardingOption], float]] = None,
        max_proposals: int = 16,
    ) -> None:
        self._bins_per_device = max(1, bins_per_device)
        self._cost_fn = cost_fn or (lambda o: float(o.total_perf))
        self._max_proposals = max_proposals
        self._proposals: List[List[int]] = []
        self._cursor = -1
        self._solved = False
        super().__init__()

    def _loaded(self, enumerator: Optional[Enumerator]) -> None:
        self._proposals, self._cursor, self._solved = [], -1, False

    def propose(self) -> Optional[List[ShardingOption]]:
        if not self._solved:
            # TorchRec hands us the storage constraint only through feedback: a first cheap proposal
            # (each table's smallest option) starts the exchange.
            tier = "hbm" if any(_primary_storage(o, "hbm") for opts in self._options.values() for o in opts) else "ddr"
            return [min(opts, key=lambda o: _primary_storage(o, tier)) for opts in self._options.values()]
        if 0 <= self._cursor < len(self._proposals):
            idx = self._proposals[self._cursor]
            return [opts[j] for opts, j in zip(self._options.values(), idx)]
        return None

    def _told(self, storage_constraint: Optional[Topology]) -> None:
        if self._solved:
            self._cursor += 1
            return
        self._solved = True
        assert storage_constraint is not None, "TorchRec passes the storage constraint with the first feedback"
        self._proposals = self.solve(storage_constraint)
        self._cursor = 0 if self._proposals else -1

    def solve(self, storage_constraint: Topology) -> List[List[int]]:
        """Solves the knapsack; returns option indices per table for the Pareto-front plans, cheapest first."""
        devices = storage_constraint.devices
        tier = "hbm" if storage_constraint.compute_device == "cuda" else "ddr"
        total = float(sum(getattr(d.storage, tier) for d in devices))
        tables = list(self._options.values())
        if not tables or total <= 0:
            return []
        n = int(min(self._bins_per_device * len(devices), MAX_KNAPSACK_BINS))
        bin_size = total / n
        inf = float("inf")
        cheapest = np.full(n + 1, inf)
        cheapest[0] = 0.0
        choice = np.full((len(tables), n + 1), -1, dtype=np.int32)
        prev = np.full((len(tables), n + 1), -1, dtype=np.int32)
        for i, opts in enumerate(tables):
            new = np.full(n + 1, inf)
            for j, opt in enumerate(opts):
                a = int(math.ceil(_primary_storage(opt, tier) / bin_size - 1e-9))
                if a > n:
                    continue
                cand = np.full(n + 1, inf)
                cand[a:] = cheapest[: n + 1 - a] + self._cost_fn(opt)
                better = cand < new
                new[better] = cand[better]
                choice[i, better] = j
                prev[i, better] = np.nonzero(better)[0] - a
            cheapest = new
        proposals: List[List[int]] = []
        best = inf
        for k in range(n + 1):  # Pareto front: more memory only if strictly cheaper
            if cheapest[k] < best:
                best = cheapest[k]
                idx, kk = [0] * len(tables), k
                for i in range(len(tables) - 1, -1, -1):
                    idx[i] = int(choice[i, kk])
                    kk = int(prev[i, kk])
                proposals.append(idx)
        proposals.reverse()  # cheapest first
        logger.debug("knapsack proposer: %d tables, %d bins, %d Pareto plans", len(tables), n, len(proposals))
        return proposals[: self._max_proposals]


class EqualRowGroupingProposer(_PerTableProposer):
    """Proposes sharding types that let every rank hold the same number of rows.

    Idea from ColossalAI's recsys ``LoadBalanceManager`` (fair mode): with W
    groups, each should hold ``sum(rows) / W`` rows. Whole tables can only be
    balanced when each is at most that share, so a table larger than the share
    is split row-wise over all ranks (even by construction) and smaller tables
    stay table-wise, to be grouped onto ranks by TorchRec's partitioner (or
    :func:`rayemb.planner.assigners.balanced_groups` on the fast engine). One proposal.
    """

    def __init__(self) -> None:
        super().__init__()
        self._world_size = 1
        self._done = False

    def _loaded(self, enumerator: Optional[Enumerator]) -> None:
        self._done = False
        if enumerator is not None and getattr(enumerator, "_world_size", None):
            self._world_size = int(enumerator._world_size)
        else:
            self._world_size = max((len(o.shards) for opts in self._options.values() for o in opts), default=1)

    def propose(self) -> Optional[List[ShardingOption]]:
        if self._done:
            return None
        rows = {fqn: opts[0].tensor.shape[0] for fqn, opts in self._options.items()}
        share = sum(rows.values()) / self._world_size
        out = []
        for fqn, opts in self._options.items():
            want = "row_wise" if rows[fqn] > share else "table_wise"
            pick = [o for o in opts if o.sharding_type == want] or opts
            out.append(min(pick, key=lambda o: float(o.total_perf)))
        return out

    def _told(self, storage_constraint: Optional[Topology]) -> None:
        self._done = True


__all__ = ["MemoryBinnedKnapsackProposer", "EqualRowGroupingProposer", "MAX_KNAPSACK_BINS"]
