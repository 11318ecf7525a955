"""``plan()``: tables + topology + global batch (+ pins) -> :class:`~rayemb.planner.types.PlanResult`, and ``rayemb plan``.

The stages, each with one verb (DESIGN §4, STYLE §12 — pure: no process group,
no GPU, no Ray):

1. **Choose** a placement per table — the estimator and chooser
   :class:`~rayemb.planner.cost.BytesCostModel` (a
   :class:`~rayemb.planner.types.PlacementChooser`): data-parallel, pooled
   model-parallel or hybrid, honouring pins; traffic from
   :mod:`rayemb.planner.traffic`.
2. **Place** shards on ranks, by one of two engines:

   * ``"fast"``: :class:`~rayemb.planner.assigners.GreedyRankAssigner` (a
     :class:`~rayemb.planner.types.RankAssigner`; no torch) — replicated rows
     on every rank, row-wise tables evenly, table-row-wise on the least-loaded
     node, whole shards grouped heaviest-first.
     :func:`rayemb.planner.torchrec_plan.to_sharding_plan` turns it into a
     TorchRec plan.
   * ``"torchrec"``: TorchRec's ``EmbeddingShardingPlanner`` with our
     knapsack proposer (:mod:`rayemb.planner.torchrec_plan`, imported only
     for this engine); the ``ShardingPlan`` is kept on ``PlanResult.sharding_plan``.

   ``"auto"`` picks ``torchrec`` while ``world_size x tables <= 2048``.

Inputs come from :mod:`rayemb.planner.tables`, outputs (plan.json, text,
PNG) from :mod:`rayemb.planner.report`; ``rayemb plan`` is :mod:`rayemb.cli.plan`.

Example::

    >>> topo = described_topology(world_size=16, gpus_per_node=8, hbm_gib=80)
    >>> result = plan([TableSpec("C1", rows=10**6, dim=64)], topo, global_batch=65536, engine="fast")
    >>> result.tables["C1"].placement.value, result.all_fit()
    ('table_row_wise', True)
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional, Sequence

from rayemb.errors import PlanError
from rayemb.planner.assigners import GreedyRankAssigner
from rayemb.planner.cost import BytesCostModel, table_bytes, table_memory
from rayemb.planner.types import (
    INSUFFICIENT_STORAGE,
    INVALID_PIN,
    STORAGE_REMEDIES,
    ClusterTopology,
    GiB,
    Placement,
    PlacementChooser,
    PlanResult,
    RankAssigner,
    RankUsage,
    TablePin,
    TablePlan,
    TableSpec,
    parse_pins,
)

logger = logging.getLogger(__name__)

#: world_size x tables up to which ``engine="auto"`` runs TorchRec's planner
TORCHREC_ENGINE_MAX_CELLS = 2048
ENGINES = ("auto", "torchrec", "fast")


# ---- PLAN ---- #


def plan(
    tables: Sequence[TableSpec],
    topology: ClusterTopology,
    global_batch: int,
    pins: Optional[Mapping[str, Any]] = None,
    proposer: Any = None,
    engine: str = "auto",
    chooser: Optional[PlacementChooser] = None,
    assigner: Optional[RankAssigner] = None,
) -> PlanResult:
    """Plans ``tables`` on ``topology`` for ``global_batch`` samples per step.

    ``pins``: ``{table: {"sharding": "row_wise", "hybrid": False, "compute_kernel": "fused"}}``
    (or :class:`TablePin` values). ``proposer``: a TorchRec ``Proposer`` (or a
    list) for the ``torchrec`` engine (default
    :class:`~rayemb.planner.proposers.MemoryBinnedKnapsackProposer`).
    Raises :class:`PlanError` (``insufficient_storage``, ``invalid_pin``).
    """
    if engine not in ENGINES:
        raise PlanError(f"Unknown planner engine {engine!r}; use one of {ENGINES}.", INVALID_PIN)
    if not tables:
        raise PlanError("No tables to plan; the dataset schema declares no sparse features.", INVALID_PIN)
    if global_batch < topology.world_size:
        raise PlanError(
            f"Global batch {global_batch} is smaller than the world size {topology.world_size}; every rank needs "
            "at least one sample per step. Raise data.batch_size.", INVALID_PIN,
        )
    pin_map = parse_pins(pins, [t.name for t in tables])
    choices = (chooser or BytesCostModel()).choose(tables, topology, global_batch, pin_map)
    if engine == "auto":
        engine = "torchrec" if topology.world_size * len(tables) <= TORCHREC_ENGINE_MAX_CELLS else "fast"
    w, l = topology.world_size, topology.devices_per_node
    sharding_plan = None
    if engine == "torchrec":
        from rayemb.planner.torchrec_plan import torchrec_plan

        sharding_plan, placed, load = torchrec_plan(tables, choices, pin_map, topology, global_batch, proposer)
    else:
        ranks, load = (assigner or GreedyRankAssigner()).assign(tables, choices, topology)
        placed = {}
        for t in tables:
            p = choices[t.name].placement
            kernel = "dense" if p == Placement.DATA_PARALLEL else ((pin_map.get(t.name) or TablePin()).compute_kernel or "fused")
            placed[t.name] = (Placement.ROW_WISE.value if p == Placement.HYBRID else p.value, ranks[t.name], kernel)

    out: Dict[str, TablePlan] = {}
    for t in tables:
        chosen = choices[t.name].placement
        sharding_type, ranks_t, kernel = placed[t.name]
        placement = chosen if chosen in (Placement.HYBRID, Placement.DATA_PARALLEL) else Placement(sharding_type)
        out[t.name] = TablePlan(
            name=t.name, placement=placement, sharding_type=sharding_type, ranks=tuple(ranks_t),
            hot_rows=t.hot_rows if placement == Placement.HYBRID else 0,
            predicted_bytes_per_step=table_bytes(t, placement, w, l, global_batch),
            memory_bytes=table_memory(t, placement, w, l).memory_bytes, compute_kernel=str(kernel),
        )
    usage = tuple(RankUsage(r, int(load[r]), topology.capacity_bytes) for r in range(w))
    result = PlanResult(world_size=w, global_batch=global_batch, tables=out, ranks=usage, topology=topology,
                        engine=engine, sharding_plan=sharding_plan)
    over = [u for u in usage if not u.fits()]
    if over:
        worst = max(over, key=lambda u: u.memory_bytes)
        raise PlanError(
            f"The plan does not fit: {len(over)} of {w} ranks exceed their table capacity (rank {worst.rank} needs "
            f"{worst.memory_bytes / GiB:.2f} GiB of {worst.capacity_bytes / GiB:.2f} GiB). Possible solutions: "
            f"{STORAGE_REMEDIES}.", INSUFFICIENT_STORAGE,
        )
    logger.info("planned %d tables on %d ranks (%s engine): %s, %.3g bytes/step, max/mean memory %.3f",
                len(tables), w, engine, result.placement_counts(), result.predicted_bytes_per_step,
                result.memory_imbalance)
    return result


__all__ = ["plan", "ENGINES", "TORCHREC_ENGINE_MAX_CELLS"]
