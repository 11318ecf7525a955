"""TorchRec glue of the planner: TorchRec topologies, the ``torchrec`` engine, and module plans from fast plans.

Only the worker / plan-task side imports this module (it imports torch and
torchrec); :func:`rayemb.planner.planner.plan` imports it lazily when the
engine is ``torchrec``. The torch-free core (types, traffic, cost, assigners)
never does.

* :func:`to_torchrec_topology`: a :class:`ClusterTopology` as TorchRec's ``Topology``.
* :func:`torchrec_plan`: TorchRec's ``EmbeddingShardingPlanner`` on a
  meta-device ``HybridEmbeddingBagCollection`` built from the specs, steered by
  the module's own ``parameter_constraints`` (fed the cost model's choices)
  and :class:`~rayemb.planner.proposers.MemoryBinnedKnapsackProposer`.
* :func:`to_sharding_plan`: the fast engine's exact ranks as a TorchRec module plan.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torchrec.distributed import sharding_plan as sp
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import HardwareConfig, KernelConfig, PlannerError, TopologyFactory, TrainerConfig
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig

from rayemb.batch_shape import BatchShape
from rayemb.embedding.compression_math import (BLOCK_SUFFIX, QR_QUOTIENT_SUFFIX, QR_REMAINDER_SUFFIX,
                                                CompressionSpec, physical_tables)
from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
from rayemb.embedding.remap import COLD_SUFFIX, HOT_SUFFIX
from rayemb.embedding.sharders import CpuCapableEmbeddingBagCollectionSharder, cpu_capable_sharders
from rayemb.errors import PlanError
from rayemb.planner.cost import stored_row_bytes
from rayemb.planner.proposers import MemoryBinnedKnapsackProposer
from rayemb.planner.pins import TablePin
from rayemb.planner.types import (
    INSUFFICIENT_STORAGE,
    INVALID_PIN,
    STORAGE_REMEDIES,
    ClusterTopology,
    Cost,
    GiB,
    Placement,
    PlanResult,
    TableSpec,
)


def to_torchrec_topology(topology: ClusterTopology) -> Any:
    """TorchRec ``Topology`` with the same devices, memory and bandwidths (TorchRec wants bytes/ms)."""
    trainer = TrainerConfig(
        world_size=topology.world_size,
        local_world_size=topology.devices_per_node,
        hbm_cap_bytes=topology.hbm_bytes if topology.compute_device == "cuda" else None,
        ddr_cap_bytes=topology.ddr_bytes,
    )
    hardware = HardwareConfig(intra_host_bw=topology.intra_node_bw / 1e3, inter_host_bw=topology.inter_node_bw / 1e3)
    kernel = KernelConfig(compute_device=topology.compute_device, use_hardware_based_bandwidth=True)
    return TopologyFactory.create_topology(trainer, hardware, kernel)


def _sharding_types_for(placement: Placement, pin: Optional[TablePin], topology: ClusterTopology,
                        exact: bool = False) -> List[str]:
    if exact or placement == Placement.DATA_PARALLEL or (pin is not None and pin.sharding is not None):
        return [placement.value]
    # the cost model's split-or-not decision stands (a table it splits for balance is never whole);
    # among the remaining pooled types the proposer chooses by TorchRec's perf estimate
    options = [placement.value, Placement.ROW_WISE.value, Placement.COLUMN_WISE.value]
    if placement == Placement.TABLE_WISE:
        options.append(Placement.TABLE_WISE.value)
    if topology.num_nodes > 1:
        options.append(Placement.TABLE_ROW_WISE.value)
    return list(dict.fromkeys(options))


def compression_of(choices: Mapping[str, Cost]) -> Dict[str, CompressionSpec]:
    """Compressed table -> its spec, from the planner's choices (a ``StoredCost``'s ``option``).

    Cached tables (``compression: none``) are plain tables here: only their kernel differs.
    """
    out = {}
    for name, c in choices.items():
        option = getattr(c, "option", None)
        if option is not None and option.compression != "none":
            out[name] = option.compression_spec()
    return out


#: TableSpec.bytes_per_element -> the TorchRec data type of a table stored that wide
_DATA_TYPES = {4: DataType.FP32, 2: DataType.FP16}


def _data_type(t: TableSpec) -> DataType:
    if t.bytes_per_element not in _DATA_TYPES:
        raise PlanError(f"Table {t.name!r} has bytes_per_element={t.bytes_per_element}; the torchrec engine plans "
                        "fp32 (4) or fp16 (2) tables.", INVALID_PIN)
    return _DATA_TYPES[t.bytes_per_element]


def _planning_module(tables: Sequence[TableSpec], choices: Mapping[str, Cost],
                     compressed: Mapping[str, CompressionSpec]) -> HybridEmbeddingBagCollection:
    """A meta-device module with the shape the job's will have.

    Hybrid tables get |F| hot rows; compressed ones their physical tables
    (``T__q``/``T__r`` or ``T__block``; data-parallel QR-mult rows are dense,
    outside TorchRec's plan), as :func:`rayemb.embedding.placements.hybrid_from_placements` builds them.
    """
    # the tables' stored dtype: TorchRec's storage estimates read the planned parameters' element size
    configs = [
        EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name],
                           data_type=_data_type(t))
        for t in tables
    ]
    hot_ids = {
        t.name: np.arange(t.hot_rows, dtype=np.int64) for t in tables if choices[t.name].placement == Placement.HYBRID
    }
    dp = [t.name for t in tables if choices[t.name].placement == Placement.DATA_PARALLEL]
    return HybridEmbeddingBagCollection(configs, hot_ids=hot_ids, device=torch.device("meta"),
                                        compression=compressed, data_parallel=dp)


def _logical_name(sub: str) -> str:
    """The logical table of a planned (physical) table: hybrid halves and compressed parts map back."""
    for suffix in (HOT_SUFFIX, COLD_SUFFIX, QR_QUOTIENT_SUFFIX, QR_REMAINDER_SUFFIX, BLOCK_SUFFIX):
        if sub.endswith(suffix):
            return sub[: -len(suffix)]
    return sub


def torchrec_plan(
    tables: Sequence[TableSpec],
    choices: Mapping[str, Cost],
    pins: Mapping[str, TablePin],
    topology: ClusterTopology,
    global_batch: int,
    proposer: Any = None,
    exact: bool = False,
) -> Tuple[Any, Dict[str, Tuple[str, Tuple[int, ...], str]], List[int]]:
    """Runs TorchRec's planner; returns (ShardingPlan, {table: (sharding_type, ranks, kernel)}, per-rank bytes).

    Hybrid cold halves are planned row-wise; plain tables may take the pooled
    types :func:`_sharding_types_for` allows around the cost model's choice,
    or (``exact``) keep the chooser's type, TorchRec placing ranks only.
    """
    compressed = compression_of(choices)
    module = _planning_module(tables, choices, compressed)
    constraints = module.parameter_constraints(
        cold_sharding_type="row_wise",
        plain_sharding_types={
            # a compressed table keeps the placement its storage cost was computed for
            t.name: [choices[t.name].placement.value] if t.name in compressed else
            _sharding_types_for(choices[t.name].placement, pins.get(t.name), topology, exact)
            for t in tables if choices[t.name].placement != Placement.HYBRID
        },
        compute_kernels={name: pin.compute_kernel for name, pin in pins.items() if pin.compute_kernel},
        pooling_factors={t.name: t.pooling_factor for t in tables},
        hot_shares={t.name: t.hot_share for t in tables},
    )
    planner = EmbeddingShardingPlanner(
        topology=to_torchrec_topology(topology),
        batch_size=BatchShape.of_global(global_batch, topology.world_size).local,
        constraints=constraints,
        proposer=proposer if proposer is not None else MemoryBinnedKnapsackProposer(),
        storage_reservation=FixedPercentageStorageReservation(topology.reserved_fraction),
    )
    try:
        sharding_plan = planner.plan(module, cpu_capable_sharders())
    except PlannerError as e:
        raise PlanError(
            f"TorchRec's planner found no placement of {len(tables)} tables on {topology.world_size} ranks of "
            f"{topology.device_bytes / GiB:.1f} GiB ({type(e).__name__}: {str(e).splitlines()[0]}). Possible "
            f"solutions: {STORAGE_REMEDIES}.", INSUFFICIENT_STORAGE,
        ) from None

    by_table: Dict[str, Tuple[str, Tuple[int, ...], str]] = {}
    load = [0] * topology.world_size
    spec = {t.name: t for t in tables}
    # (rows, dim) of every planned table: logical, hybrid hot half, compressed parts
    shape = {t.name: (t.rows, t.dim) for t in tables}
    shape.update({t.name + HOT_SUFFIX: (t.hot_rows, t.dim) for t in tables})
    shape.update({t.name + p.suffix: (p.rows, p.dim) for t in tables if t.name in compressed
                  for p in physical_tables(t.rows, t.dim, compressed[t.name])})
    everywhere = tuple(range(topology.world_size))
    for module_plan in sharding_plan.plan.values():
        for sub, ps in module_plan.items():
            name = _logical_name(sub)
            t = spec[name]
            if ps.sharding_type == Placement.DATA_PARALLEL.value:
                rows, dim = shape[sub]
                for r in range(topology.world_size):
                    load[r] += rows * stored_row_bytes(t, dim)
                shard_ranks = everywhere
            else:
                for sh in ps.sharding_spec.shards:
                    rr, cc = sh.shard_sizes
                    load[sh.placement.rank()] += rr * stored_row_bytes(t, cc)
                shard_ranks = tuple(sorted({sh.placement.rank() for sh in ps.sharding_spec.shards}))
            if sub.endswith(HOT_SUFFIX) and name in by_table:
                continue  # the cold half decides a hybrid table's sharding type and ranks
            sharding_type = Placement.DATA_PARALLEL.value if sub.endswith(HOT_SUFFIX) else ps.sharding_type
            if name in compressed and name in by_table:  # a QR table's second part: the ranks of both
                shard_ranks = tuple(sorted(set(by_table[name][1]) | set(shard_ranks)))
            by_table[name] = (sharding_type, shard_ranks, ps.compute_kernel)
    for name in compressed:  # data-parallel QR-mult rows: dense replicated parameters, not in TorchRec's plan
        if name not in by_table:
            t = spec[name]
            for p in physical_tables(t.rows, t.dim, compressed[name]):
                for r in everywhere:
                    load[r] += p.rows * stored_row_bytes(t, p.dim)
            by_table[name] = (Placement.DATA_PARALLEL.value, everywhere, "dense")
    return sharding_plan, by_table, load


def to_sharding_plan(result: PlanResult, module: Any, local_world_size: Optional[int] = None) -> Any:
    """TorchRec ``EmbeddingModuleShardingPlan`` for ``module`` (an ``EmbeddingBagCollection``) from ``result``.

    Exact ranks of the fast engine become TorchRec parameter shardings
    (``table_wise(rank)``, ``row_wise()``, ``column_wise(ranks)``,
    ``table_row_wise(host_index)``, ``data_parallel()``). Hybrid tables are
    planned by the ``torchrec`` engine (``result.sharding_plan``).
    """
    topo = result.topology
    l = local_world_size or (topo.devices_per_node if topo else result.world_size)
    per_param = {}
    for name, t in result.tables.items():
        p = t.placement
        if p == Placement.DATA_PARALLEL:
            per_param[name] = sp.data_parallel()
        elif p == Placement.TABLE_WISE:
            per_param[name] = sp.table_wise(rank=t.ranks[0], compute_kernel=t.compute_kernel)
        elif p == Placement.ROW_WISE:
            per_param[name] = sp.row_wise(compute_kernel=t.compute_kernel)
        elif p in (Placement.COLUMN_WISE, Placement.TABLE_COLUMN_WISE):
            per_param[name] = sp.column_wise(ranks=list(t.ranks), compute_kernel=t.compute_kernel)
        elif p == Placement.TABLE_ROW_WISE:
            per_param[name] = sp.table_row_wise(host_index=t.ranks[0] // l)
        else:
            raise PlanError(
                f"Table {name!r} is hybrid; build its TorchRec plan with engine='torchrec' (PlanResult.sharding_plan) "
                "or HybridEmbeddingBagCollection.parameter_constraints.", INVALID_PIN,
            )
    device = topo.compute_device if topo else "cpu"
    return sp.construct_module_sharding_plan(
        module, per_param, sharder=CpuCapableEmbeddingBagCollectionSharder(), local_size=l,
        world_size=result.world_size, device_type=device,
    )


__all__ = ["to_torchrec_topology", "torchrec_plan", "to_sharding_plan"]
