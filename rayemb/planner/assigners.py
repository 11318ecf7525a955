"""The fast engine's rank assignment: replicated rows everywhere, split tables evenly, whole tables grouped.

:class:`GreedyRankAssigner` (a :class:`~rayemb.planner.types.RankAssigner`)
puts data-parallel, row-wise and hybrid tables on every rank, table-row-wise
tables on the least-loaded node, column shards on distinct least-loaded ranks,
and whole (table-wise) tables heaviest-first onto the lightest rank
(:func:`balanced_groups`). O(tables x log W) plus O(W) per row-wise table:
500 tables on 1024 ranks in well under a second, where TorchRec's enumerator
builds 1024 shards per option per table. Pure: no torch.
"""

from __future__ import annotations

import heapq
import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from rayemb.planner.cost import column_shards
from rayemb.planner.types import ClusterTopology, Cost, Placement, RankAssigner, TableSpec


def balanced_groups(weights: Sequence[float], num_groups: int, base: Optional[Sequence[float]] = None) -> List[int]:
    """Assigns items to ``num_groups`` groups, heaviest first onto the lightest group (LPT).

    Graham's longest-processing-time rule: max group load <= (4/3 - 1/(3m)) x
    optimum (Graham 1969, "Bounds on multiprocessing timing anomalies").
    ``base`` holds loads already on each group. Returns the group of each item.
    """
    heap: List[Tuple[float, int]] = [((base[g] if base else 0.0), g) for g in range(num_groups)]
    heapq.heapify(heap)
    out = [0] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        load, g = heapq.heappop(heap)
        out[i] = g
        heapq.heappush(heap, (load + weights[i], g))
    return out


class GreedyRankAssigner(RankAssigner):
    """Replicated rows everywhere, row-wise evenly, whole shards heaviest-first onto the lightest rank."""

    def assign(
        self, tables: Sequence[TableSpec], choices: Mapping[str, Cost], topology: ClusterTopology
    ) -> Tuple[Dict[str, Tuple[int, ...]], List[int]]:
        w, l = topology.world_size, topology.devices_per_node
        load = [0.0] * w
        ranks: Dict[str, Tuple[int, ...]] = {}
        whole: List[Tuple[str, float]] = []  # (table, bytes) of table-wise pieces
        cw: List[Tuple[str, int, float]] = []  # (table, k shards, bytes per shard)
        twrw: List[Tuple[str, float]] = []
        all_ranks = tuple(range(w))
        for t in tables:
            c = choices[t.name]
            p = c.placement
            if p in (Placement.DATA_PARALLEL, Placement.ROW_WISE, Placement.HYBRID):
                per_rank = c.memory_bytes / w
                for r in range(w):
                    load[r] += per_rank
                ranks[t.name] = all_ranks
            elif p == Placement.TABLE_WISE:
                whole.append((t.name, float(c.memory_bytes)))
            elif p == Placement.TABLE_ROW_WISE:
                twrw.append((t.name, float(c.memory_bytes)))
            else:
                k = column_shards(t.dim, w if p == Placement.COLUMN_WISE else l)
                cw.append((t.name, k, c.memory_bytes / k))
        if twrw:
            node_load = [sum(load[n * l:(n + 1) * l]) for n in range(topology.num_nodes)]
            for (name, nbytes), node in zip(twrw, balanced_groups([b for _, b in twrw], topology.num_nodes, node_load)):
                for r in range(node * l, (node + 1) * l):
                    load[r] += nbytes / l
                ranks[name] = tuple(range(node * l, (node + 1) * l))
        # column shards of one table go to distinct ranks: place them largest table first
        for name, k, per in sorted(cw, key=lambda x: -x[1] * x[2]):
            pool = range(w) if choices[name].placement == Placement.COLUMN_WISE else None
            if pool is None:  # TWCW: the least-loaded node
                node = min(range(topology.num_nodes), key=lambda n: sum(load[n * l:(n + 1) * l]))
                pool = range(node * l, (node + 1) * l)
            picked = sorted(pool, key=lambda r: load[r])[:k]
            for r in picked:
                load[r] += per
            ranks[name] = tuple(sorted(picked))
        for (name, nbytes), r in zip(whole, balanced_groups([b for _, b in whole], w, load)):
            load[r] += nbytes
            ranks[name] = (r,)
        return ranks, [int(math.ceil(x)) for x in load]


__all__ = ["GreedyRankAssigner", "balanced_groups"]
