"""Planner: where each embedding table's rows live on a cluster, and what that costs per step.

Tables (:class:`TableSpec`, with hot sets from stats; :mod:`.tables`) and a
cluster (:class:`ClusterTopology`, from the live Ray cluster or described;
:mod:`.topology`) go in; :func:`plan` (:mod:`.planner`) chooses a placement
per table by the bytes cost model (:mod:`.cost`, traffic from
:mod:`.traffic`: data-parallel, pooled model-parallel TW/RW/CW/TWRW/TWCW, or
hybrid), places shards with the fast engine (:mod:`.assigners`) or TorchRec's
planner (:mod:`.torchrec_plan` with the knapsack proposer of
:mod:`.proposers`), and returns a :class:`PlanResult` whose ``to_json()`` is
``plan.json`` (:mod:`.report`). The vocabulary is :mod:`.types`.

Importing this package imports neither torch nor torchrec: the fast engine,
the cost and traffic model, and plan.json work on a CPU-only head. Only
:mod:`rayemb.planner.torchrec_plan` and :mod:`rayemb.planner.proposers` need
torchrec; import them directly.
"""

from rayemb.planner.cost import BytesCostModel, table_cost
from rayemb.planner.planner import plan
from rayemb.planner.report import load_plan_json, plot_plan, save_plan_json, summary_table
from rayemb.planner.tables import criteo_1tb_tables, split_rule, tables_from_schema
from rayemb.planner.topology import described_topology, topology_from_ray
from rayemb.planner.traffic import predict_bytes_per_step, predict_table_bytes
from rayemb.planner.pins import TablePin
from rayemb.planner.types import ClusterTopology, Placement, PlanResult, TableSpec

__all__ = [
    "BytesCostModel", "ClusterTopology", "Placement", "PlanResult", "TablePin", "TableSpec",
    "criteo_1tb_tables", "described_topology", "load_plan_json", "plan",
    "plot_plan", "predict_bytes_per_step", "predict_table_bytes", "save_plan_json", "split_rule", "summary_table",
    "table_cost", "tables_from_schema", "topology_from_ray",
]
