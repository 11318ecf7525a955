"""Estimator and chooser: each placement's bytes per step and memory per rank, and the per-table choice.

Notation (DESIGN §4): global batch B, dim D, element bytes s, world size W,
devices per node L, pooling factor P, hot rows |F|, hot share h, rows V.
Traffic per placement is :func:`rayemb.planner.traffic.predict_table_bytes`
(one formula for every placement, checked against measured collective bytes
by the hybrid benchmark); :func:`table_bytes` feeds it a :class:`TableSpec`.

Memory (weights + optimizer state; model-parallel tables use FBGEMM's
row-wise Adagrad, one fp32 per row; data-parallel rows use a dense Adagrad, one
fp32 per element): data-parallel holds V·D·(s+4) on every rank; pooled
model-parallel holds V·(D·s+4) in total, split by rows (RW over W ranks, TWRW
over L) or columns (CW, k shards); hybrid holds |F|·D·(s+4) on every rank plus
the cold rows row-wise.

The choice (:class:`BytesCostModel`): among the placements a table's pin
allows, pick the fewest bytes per step whose largest shard fits a rank, with
replicated bytes (data-parallel tables, hybrid hot sets) capped at
``replicated_fraction`` of each rank's capacity, granted to the tables that
save the most traffic per replicated byte first. Pooled model-parallel tables
are table-wise when they are smaller than an equal per-rank share of all
model-parallel rows (so whole tables can be balanced); larger ones are
table-row-wise on multi-node clusters when their per-rank piece stays under
``TWRW_MAX_CAPACITY_SHARE`` of a rank (the reduce-scatter stays inside a node:
2·(L-1)·B·D·s instead of 2·(W-1)·B·D·s — TorchRec's choice for large tables
at scale), else row-wise over all ranks.
"""

from __future__ import annotations

import logging
import math
from typing import Dict, List, Mapping, Optional, Sequence

from rayemb.errors import PlanError
from rayemb.planner.types import (
    INSUFFICIENT_STORAGE,
    STORAGE_REMEDIES,
    ClusterTopology,
    Cost,
    Placement,
    PlacementChooser,
    TablePin,
    TableSpec,
)
from rayemb.planner.traffic import predict_table_bytes

logger = logging.getLogger(__name__)

#: fp32 optimizer state: row-wise Adagrad keeps one per row, dense Adagrad one per element
OPTIMIZER_STATE_BYTES = 4
#: width of one column-wise shard (TorchRec's ``min_partition`` default is 32 columns)
COLUMN_SHARD_DIM = 32
#: share of a rank's capacity that replicated rows (data-parallel tables, hybrid hot sets) may take
DEFAULT_REPLICATED_FRACTION = 0.25
#: a large table is sharded table-row-wise (inside one node) when its per-rank piece is at most this share
#: of a rank's capacity; otherwise row-wise over all ranks
TWRW_MAX_CAPACITY_SHARE = 0.25


def column_shards(dim: int, world_size: int) -> int:
    """k = number of column-wise shards: dim split into COLUMN_SHARD_DIM-wide pieces, at most one per rank."""
    return max(1, min(world_size, dim // COLUMN_SHARD_DIM))


def table_bytes(
    table: TableSpec, placement: Placement, world_size: int, devices_per_node: int, global_batch: int
) -> float:
    """Predicted bytes per step (summed over ranks, fwd + bwd) of ``table`` under ``placement``."""
    if world_size == 1:
        return 0.0
    by_collective = predict_table_bytes(
        placement, batch_size=global_batch, dim=table.dim, world_size=world_size, pooling=table.pooling_factor,
        num_rows=table.rows, hot_share=table.hot_share, num_hot=table.hot_rows, elem_bytes=table.bytes_per_element,
        column_shards=column_shards(table.dim, world_size), devices_per_node=devices_per_node,
    )
    return float(sum(by_collective.values()))


def table_memory(table: TableSpec, placement: Placement, world_size: int, devices_per_node: int) -> Cost:
    """Memory of ``table`` under ``placement`` (bytes per step left 0; see :func:`table_cost`)."""
    mp_row = table.row_bytes + OPTIMIZER_STATE_BYTES
    dp_row = table.dim * (table.bytes_per_element + OPTIMIZER_STATE_BYTES)
    w = world_size
    if placement == Placement.DATA_PARALLEL:
        total, biggest = w * table.rows * dp_row, table.rows * dp_row
    elif placement == Placement.TABLE_WISE:
        total = biggest = table.rows * mp_row
    elif placement == Placement.ROW_WISE:
        total, biggest = table.rows * mp_row, math.ceil(table.rows / w) * mp_row
    elif placement == Placement.TABLE_ROW_WISE:
        l = max(1, min(devices_per_node, w))
        total, biggest = table.rows * mp_row, math.ceil(table.rows / l) * mp_row
    elif placement in (Placement.COLUMN_WISE, Placement.TABLE_COLUMN_WISE):
        k = column_shards(table.dim, w)
        total = table.rows * (table.row_bytes + k * OPTIMIZER_STATE_BYTES)
        biggest = table.rows * (math.ceil(table.dim / k) * table.bytes_per_element + OPTIMIZER_STATE_BYTES)
    else:  # HYBRID
        hot = table.hot_rows * dp_row
        total = w * hot + table.cold_rows * mp_row
        biggest = hot + math.ceil(table.cold_rows / w) * mp_row
    return Cost(placement, 0.0, int(total), int(biggest))


def table_cost(
    table: TableSpec, placement: Placement, world_size: int, devices_per_node: int, global_batch: int
) -> Cost:
    """Bytes per step and memory of one placement of one table (pure)."""
    mem = table_memory(table, placement, world_size, devices_per_node)
    return Cost(placement, table_bytes(table, placement, world_size, devices_per_node, global_batch),
                mem.memory_bytes, mem.max_shard_bytes)


def replicated_bytes_per_rank(cost: Cost, table: TableSpec) -> int:
    """Bytes that every rank holds for this placement (data-parallel tables, hybrid hot sets)."""
    dp_row = table.dim * (table.bytes_per_element + OPTIMIZER_STATE_BYTES)
    if cost.placement == Placement.DATA_PARALLEL:
        return table.rows * dp_row
    if cost.placement == Placement.HYBRID:
        return table.hot_rows * dp_row
    return 0


class BytesCostModel(PlacementChooser):
    """Chooses per table among data-parallel, pooled model-parallel and hybrid by predicted bytes (DESIGN §4).

    >>> t = [TableSpec("small", rows=100, dim=16), TableSpec("big", rows=10**7, dim=16)]
    >>> choice = BytesCostModel().choose(t, ClusterTopology(1, 8), global_batch=65536, pins={})
    >>> choice["small"].placement.value, choice["big"].placement.value
    ('data_parallel', 'row_wise')
    """

    def __init__(self, replicated_fraction: float = DEFAULT_REPLICATED_FRACTION) -> None:
        self.replicated_fraction = replicated_fraction

    def candidates(
        self, table: TableSpec, topology: ClusterTopology, global_batch: int, fair_share_bytes: float,
        pin: Optional[TablePin],
    ) -> List[Cost]:
        """Costs of the placements this table may take, cheapest traffic first."""
        w, l = topology.world_size, topology.devices_per_node
        if pin is not None and pin.sharding is not None:
            options = [pin.sharding]
        else:
            tw_or_rw = Placement.TABLE_WISE
            mp_bytes = table.rows * (table.row_bytes + OPTIMIZER_STATE_BYTES)
            if w > 1 and mp_bytes > fair_share_bytes:
                tw_or_rw = Placement.ROW_WISE
                if topology.num_nodes > 1 and mp_bytes / l <= TWRW_MAX_CAPACITY_SHARE * topology.capacity_bytes:
                    tw_or_rw = Placement.TABLE_ROW_WISE
            options = [Placement.DATA_PARALLEL, tw_or_rw]
            if tw_or_rw != Placement.ROW_WISE:
                options.append(Placement.ROW_WISE)  # fallback when the table does not fit one rank / node
            if 0 < table.hot_rows < table.rows:
                options.append(Placement.HYBRID)
            if pin is not None:
                if pin.hybrid is True and table.rows > 0 and table.hot_rows >= table.rows:
                    # every row is hot: "hybrid" is all rows replicated and no cold half, i.e. data-parallel
                    options = [Placement.DATA_PARALLEL]
                else:
                    options = [p for p in options if pin.allows(p)]
        costs = [table_cost(table, p, w, l, global_batch) for p in options]
        return sorted(costs, key=lambda c: (c.bytes_per_step, c.max_shard_bytes))

    def choose(
        self,
        tables: Sequence[TableSpec],
        topology: ClusterTopology,
        global_batch: int,
        pins: Mapping[str, TablePin],
    ) -> Dict[str, Cost]:
        cap = topology.capacity_bytes
        w = topology.world_size
        total_mp = sum(t.rows * (t.row_bytes + OPTIMIZER_STATE_BYTES) for t in tables)
        fair_share = total_mp / w
        budget = self.replicated_fraction * cap
        choice: Dict[str, Cost] = {}
        cands: Dict[str, List[Cost]] = {}
        for t in tables:
            pin = pins.get(t.name)
            cs = [c for c in self.candidates(t, topology, global_batch, fair_share, pin) if c.fits_in(cap)]
            if not cs:
                if pin is not None and pin.sharding is not None:
                    c = table_cost(t, pin.sharding, w, topology.devices_per_node, global_batch)
                    raise PlanError(
                        f"Table {t.name!r} ({t.rows} rows x dim {t.dim}) is pinned to {pin.sharding.value}, whose "
                        f"largest shard needs {c.max_shard_bytes / 2**30:.2f} GiB but a rank holds "
                        f"{cap / 2**30:.2f} GiB. Unpin it (let the planner row-wise shard it), or: {STORAGE_REMEDIES}.",
                        INSUFFICIENT_STORAGE,
                    )
                raise PlanError(
                    f"Table {t.name!r} ({t.rows} rows x dim {t.dim}) does not fit: even row-wise over "
                    f"{w} ranks its shard exceeds a rank's {cap / 2**30:.2f} GiB table capacity. Possible "
                    f"solutions: {STORAGE_REMEDIES}.", INSUFFICIENT_STORAGE,
                )
            cands[t.name] = cs
        # replicated placements compete for the per-rank budget: best saving per replicated byte first
        by_name = {t.name: t for t in tables}

        def best_unreplicated(name: str) -> Optional[Cost]:
            rest = [c for c in cands[name] if replicated_bytes_per_rank(c, by_name[name]) == 0]
            return rest[0] if rest else None

        wants = []
        for name, cs in cands.items():
            first = cs[0]
            rep = replicated_bytes_per_rank(first, by_name[name])
            if rep == 0:
                choice[name] = first
                continue
            alt = best_unreplicated(name)
            saving = (alt.bytes_per_step - first.bytes_per_step) if alt else float("inf")
            wants.append((-(saving / max(rep, 1)), name))
        used = 0
        for _, name in sorted(wants):
            t = by_name[name]
            forced = best_unreplicated(name) is None  # pinned to data-parallel/hybrid: the budget yields to the pin
            for c in cands[name]:
                rep = replicated_bytes_per_rank(c, t)
                if rep == 0 or forced or used + rep <= budget:
                    choice[name] = c
                    used += rep
                    break
        logger.debug("cost model chose %s", {n: c.placement.value for n, c in choice.items()})
        return {t.name: choice[t.name] for t in tables}


__all__ = [
    "BytesCostModel", "table_bytes", "table_memory", "table_cost", "column_shards", "replicated_bytes_per_rank",
    "OPTIMIZER_STATE_BYTES", "COLUMN_SHARD_DIM", "DEFAULT_REPLICATED_FRACTION",
]
