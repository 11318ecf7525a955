"""``plan()``: tables + topology + global batch (+ pins) -> :class:`~rayemb.planner.types.PlanResult`, and ``rayemb plan``.

The stages, each with one verb (pure: no process group, no GPU, no Ray):

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

   ``"auto"`` picks ``torchrec`` while ``world_size x tables <= 2048`` and no table is compressed or
   cached (the job's TorchRec module does not build those yet; what-if plans place them with ``fast``).

Inputs come from :mod:`rayemb.planner.tables`, outputs (plan.json, text,
PNG) from :mod:`rayemb.planner.report`; ``rayemb plan`` is :mod:`rayemb.cli.plan`.

Example::

    >>> from rayemb.planner.topology import described_topology
    >>> from rayemb.planner.types import TableSpec
    >>> topo = described_topology(world_size=16, gpus_per_node=8, hbm_gib=80)
    >>> result = plan([TableSpec("C1", rows=10**6, dim=64)], topo, global_batch=65536, engine="fast")
    >>> result.tables["C1"].placement.value, result.all_fit()
    ('table_row_wise', True)
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from rayemb.errors import PlanError
from rayemb.planner.assigners import GreedyRankAssigner
from rayemb.planner.compression import StoredCost, auto_options, has_host_tier, host_capacity_bytes
from rayemb.planner.cost import FP32_EXCHANGE, BytesCostModel, ExchangeBytes, storage_cost, table_bytes, table_memory
from rayemb.planner.pins import TablePin, parse_pins
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
    TablePlan,
    TableSpec,
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
    exchange: ExchangeBytes = FP32_EXCHANGE,
) -> PlanResult:
    """Plans ``tables`` on ``topology`` for ``global_batch`` samples per step.

    ``pins``: ``{table: {"sharding": "row_wise", "hybrid": False, "compute_kernel": "fused"}}``
    (or :class:`TablePin` values; storage keys ``compression``, ``buckets``, ``combine``,
    ``block_dim``, ``kernel``, ``cache_load_factor``: :mod:`rayemb.planner.compression`). A table
    that fits no plain placement is cached or compressed (``TablePlan.storage`` says which and why).
    ``proposer``: a TorchRec ``Proposer`` (or a list) for the ``torchrec`` engine (default
    :class:`~rayemb.planner.proposers.MemoryBinnedKnapsackProposer`). ``exchange``: the element sizes on the
    wire (``train.comm_precision``) the bytes per step count, and the default chooser chooses by.
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
    pin_map = _without_host_cache(parse_pins(pins, [t.name for t in tables]), topology)
    made_room: Dict[str, str] = {}  # table -> why it was stored although it fits a rank on its own
    for _ in range(len(tables) + 1):
        result = _plan_once(tables, topology, global_batch, pin_map, proposer, engine, chooser, assigner, exchange)
        over = [u for u in result.ranks if not u.fits()]
        if not over:
            break
        worst = max(over, key=lambda u: u.memory_bytes)
        why = (f"{len(over)} of {result.world_size} ranks exceed their table capacity (rank {worst.rank} needs "
               f"{worst.memory_bytes / GiB:.2f} GiB of {worst.capacity_bytes / GiB:.2f} GiB)")
        victim = _room_maker(tables, result, pin_map, topology, global_batch)
        if victim is None:
            tried = f"; caching or compressing {sorted(made_room)} was not enough" if made_room else ""
            raise PlanError(f"The plan does not fit: {why}{tried}. Possible solutions: {STORAGE_REMEDIES}.",
                            INSUFFICIENT_STORAGE)
        name, pin = victim
        pin_map = {**pin_map, name: pin}
        made_room[name] = why
        logger.info("planner: %s; storing table %s as %s to make room", why, name, dict(pin.storage))
    for name, why in made_room.items():  # the reason says why a table that fits on its own was stored
        tp = result.tables[name]
        reason = (f"the plan did not fit plainly ({why}); {name} is the largest table no pin fixes, "
                  f"{tp.storage.get('compression') if tp.storage.get('compression') != 'none' else 'cached'} "
                  "to make room")
        result.tables[name] = replace(tp, storage={**tp.storage, "reason": reason})
    logger.info("planned %d tables on %d ranks (%s engine): %s, %.3g bytes/step, max/mean memory %.3f",
                len(tables), result.world_size, result.engine, result.placement_counts(),
                result.predicted_bytes_per_step, result.memory_imbalance)
    return result


def _plan_once(tables: Sequence[TableSpec], topology: ClusterTopology, global_batch: int,
               pin_map: Dict[str, TablePin], proposer: Any, engine: str, chooser: Optional[PlacementChooser],
               assigner: Optional[RankAssigner], exchange: ExchangeBytes = FP32_EXCHANGE) -> PlanResult:
    """Choose placements, then place them on ranks; per-rank memory over capacity is left to the caller."""
    choices = (chooser or BytesCostModel(exchange=exchange)).choose(tables, topology, global_batch, pin_map)
    stored = {n: c for n, c in choices.items() if isinstance(c, StoredCost) and not c.option.is_plain}
    if engine == "auto":
        small = topology.world_size * len(tables) <= TORCHREC_ENGINE_MAX_CELLS
        engine = "torchrec" if small and not stored else "fast"
    if engine == "torchrec":
        # compressed tables: the planning module builds their physical tables from ``choices[t].option``
        # (a StoredCost); cached ones are FBGEMM's UVM caching kernel (CUDA; never on CPU, see above)
        pin_map = {**pin_map, **{n: replace(pin_map.get(n) or TablePin(), compute_kernel="fused_uvm_caching")
                                 for n, c in stored.items() if c.option.kernel == "cached"}}
    w, l = topology.world_size, topology.devices_per_node
    sharding_plan = None
    if engine == "torchrec":
        from rayemb.planner.torchrec_plan import torchrec_plan

        # a chooser that priced each placement on the live backend (the step-time model) keeps its sharding
        # types: TorchRec's own perf estimate knows neither the links nor gloo's per-module costs
        exact = bool(getattr(chooser, "placements_are_final", False))
        try:
            sharding_plan, placed, load = torchrec_plan(tables, choices, pin_map, topology, global_batch, proposer,
                                                        exact=exact)
        except PlanError:
            if not exact:
                raise
            logger.warning("planner: TorchRec found no ranks for the chosen sharding types as they are; "
                           "letting it switch pooled types where memory needs it")
            sharding_plan, placed, load = torchrec_plan(tables, choices, pin_map, topology, global_batch, proposer)
    else:
        ranks, load = (assigner or GreedyRankAssigner()).assign(tables, choices, topology)
        placed = {}
        for t in tables:
            p = choices[t.name].placement
            kernel = "dense" if p == Placement.DATA_PARALLEL else ((pin_map.get(t.name) or TablePin()).compute_kernel or "fused")
            if t.name in stored and stored[t.name].option.kernel == "cached" and topology.compute_device == "cuda":
                kernel = "fused_uvm_caching"
            placed[t.name] = (Placement.ROW_WISE.value if p == Placement.HYBRID else p.value, ranks[t.name], kernel)

    out: Dict[str, TablePlan] = {}
    host_load = [0.0] * w
    for t in tables:
        chosen = choices[t.name].placement
        sharding_type, ranks_t, kernel = placed[t.name]
        placement = chosen if chosen in (Placement.HYBRID, Placement.DATA_PARALLEL) else Placement(sharding_type)
        nbytes, storage = table_bytes(t, placement, w, l, global_batch, exchange), None
        memory = table_memory(t, placement, w, l).memory_bytes
        if t.name in stored:  # compressed / cached: its own memory and bytes, the projection on every rank
            sc = storage_cost(t, stored[t.name].option, placement, topology, global_batch, stored[t.name].reason,
                              exchange)
            nbytes, memory, storage = sc.bytes_per_step, sc.memory_bytes + w * sc.extra_bytes_per_rank, sc.to_json(w)
            for r in range(w):
                load[r] += sc.extra_bytes_per_rank
            for r in ranks_t:
                host_load[r] += sc.host_memory_bytes / max(1, len(ranks_t))
        out[t.name] = TablePlan(
            name=t.name, placement=placement, sharding_type=sharding_type, ranks=tuple(ranks_t),
            hot_rows=t.hot_rows if placement == Placement.HYBRID else 0, predicted_bytes_per_step=nbytes,
            memory_bytes=memory, compute_kernel=str(kernel), storage=storage,
        )
    host_cap = host_capacity_bytes(topology)
    if stored and max(host_load) > host_cap:
        r = max(range(w), key=lambda i: host_load[i])
        raise PlanError(
            f"The cached tables do not fit host memory: rank {r} needs {host_load[r] / GiB:.2f} GiB of "
            f"{host_cap / GiB:.2f} GiB. Possible solutions: {STORAGE_REMEDIES}.", INSUFFICIENT_STORAGE)
    usage = tuple(RankUsage(r, int(load[r]), topology.capacity_bytes) for r in range(w))
    result = PlanResult(world_size=w, global_batch=global_batch, tables=out, ranks=usage, topology=topology,
                        engine=engine, sharding_plan=sharding_plan)
    return result


def _room_maker(tables: Sequence[TableSpec], result: PlanResult, pins: Mapping[str, TablePin],
                topology: ClusterTopology, global_batch: int) -> Optional[Tuple[str, TablePin]]:
    """The largest plainly stored table no pin fixes, with the first cache/compression pin that fits it."""
    candidates = sorted(
        (t for t in tables if result.tables[t.name].storage is None and _unpinned(pins.get(t.name))),
        key=lambda t: result.tables[t.name].memory_bytes, reverse=True)
    for t in candidates:
        for option in auto_options(t, topology):
            if BytesCostModel().stored_candidates(t, topology, global_batch, option, None):
                pin = pins.get(t.name) or TablePin()
                return t.name, replace(pin, storage=tuple(option.to_json().items()))
    return None


def _unpinned(pin: Optional[TablePin]) -> bool:
    """No pin fixes the table's placement or storage (``hybrid: false`` alone leaves both free)."""
    return pin is None or (pin.sharding is None and pin.hybrid is not True and not pin.storage
                           and not pin.compute_kernel)


def _without_host_cache(pins: Dict[str, TablePin], topology: ClusterTopology) -> Dict[str, TablePin]:
    """Pins with a cached kernel (``kernel: cached`` / ``compute_kernel: fused_uvm*``) made plain on CPU ranks.

    A device cache only helps where a slower, larger tier sits behind the device (host DDR behind HBM);
    on a CPU rank the table already lives in host memory, and TorchRec's CPU kernels have no UVM
    variant, so a job config written for GPUs runs on CPU with the plain fused kernel (logged).
    """
    if has_host_tier(topology):
        return pins
    out = dict(pins)
    for name, pin in pins.items():
        storage = dict(pin.storage)
        uvm = (pin.compute_kernel or "").startswith("fused_uvm")
        if storage.get("kernel") == "cached" or uvm:
            storage.pop("kernel", None)
            storage.pop("cache_load_factor", None)
            out[name] = replace(pin, storage=tuple(storage.items()), compute_kernel=None if uvm else pin.compute_kernel)
            logger.warning("table %s: the cached kernel needs a device with host memory behind it (CUDA); on %s "
                           "ranks the whole table is in host memory already, so it is planned with the fused kernel",
                           name, topology.compute_device)
    return out


__all__ = ["plan", "ENGINES", "TORCHREC_ENGINE_MAX_CELLS"]
