"""Planner: where each embedding table's rows live on a cluster, and what that costs per step.

Tables (:class:`TableSpec`, with hot sets from stats) and a cluster
(:class:`ClusterTopology`, from the live Ray cluster or described) go in;
:func:`plan` chooses a placement per table by the bytes cost model
(data-parallel, pooled model-parallel TW/RW/CW/TWRW/TWCW, or hybrid), places
shards with TorchRec's planner (our DP proposer) or a fast grouping engine,
and returns a :class:`PlanResult` whose ``to_json()`` is ``plan.json``.
Importing this package does not import torchrec (plan.json is readable on a
CPU-only head); the TorchRec proposers live in :mod:`rayemb.planner.proposers`.
"""

from rayemb.planner.cost import BytesCostModel, table_cost
from rayemb.planner.planner import (
    add_plan_arguments,
    criteo_1tb_tables,
    load_plan_json,
    plan,
    plan_main,
    plot_plan,
    save_plan_json,
    summary_table,
    tables_from_schema,
    to_sharding_plan,
)
from rayemb.planner.topology import described_topology, to_torchrec_topology, topology_from_ray
from rayemb.planner.types import ClusterTopology, Placement, PlanResult, TablePin, TableSpec

__all__ = [
    "BytesCostModel", "ClusterTopology", "Placement", "PlanResult", "TablePin", "TableSpec",
    "add_plan_arguments", "criteo_1tb_tables", "described_topology", "load_plan_json", "plan", "plan_main",
    "plot_plan", "save_plan_json", "summary_table", "table_cost", "tables_from_schema", "to_sharding_plan",
    "to_torchrec_topology", "topology_from_ray",
]
