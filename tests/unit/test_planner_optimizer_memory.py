"""The planner's memory counts the optimizer state ``train.embedding_optimizer`` really keeps per row.

FBGEMM's fused optimizers (sharded rows) and rayemb's replicated-row optimizers keep, per row of width D, in
fp32: row-wise Adagrad 1 value, Adagrad D, SGD none, Adam 2·D, row-wise Adam D + 1 (one row-wise value per
column shard). Every placement's bytes are computed here by hand from those counts; a table that fits a rank
under row-wise Adagrad but not under Adam is planned differently, and a job config's optimizer reaches the plan.
"""

from __future__ import annotations

import math
from typing import Any, Dict

import pytest

from rayemb.errors import PlanError
from rayemb.planner import plan
from rayemb.planner.compression import StorageOption
from rayemb.planner.cost import storage_cost, table_memory
from rayemb.planner.tables import split_rule
from rayemb.planner.topology import described_topology
from rayemb.planner.types import Placement, TableSpec

ROWS, DIM, HOT, WORLD = 1000, 64, 100, 4
#: optimizer -> state bytes of one row 64 wide, and of one 32-wide column shard row (4 bytes per fp32 value)
STATE = {
    "rowwise_adagrad": (4, 4),
    "adagrad": (64 * 4, 32 * 4),
    "sgd": (0, 0),
    "adam": (2 * 64 * 4, 2 * 32 * 4),
    "rowwise_adam": (64 * 4 + 4, 32 * 4 + 4),
}


def _expected(optimizer: str, elem: int) -> Dict[Placement, tuple]:
    """(memory over all ranks, largest shard) of a ROWS x DIM table with HOT hot rows on WORLD ranks of one node."""
    full, half = STATE[optimizer]
    row = DIM * elem + full
    k = 2  # column shards of a 64-wide table: 32 columns each
    return {
        Placement.TABLE_WISE: (ROWS * row, ROWS * row),
        Placement.ROW_WISE: (ROWS * row, math.ceil(ROWS / WORLD) * row),
        Placement.COLUMN_WISE: (ROWS * k * (DIM // k * elem + half), ROWS * (DIM // k * elem + half)),
        Placement.DATA_PARALLEL: (WORLD * ROWS * row, ROWS * row),
        Placement.HYBRID: (WORLD * HOT * row + (ROWS - HOT) * row,
                           HOT * row + math.ceil((ROWS - HOT) / WORLD) * row),
    }


@pytest.mark.parametrize("elem", [4, 2], ids=["fp32", "fp16"])
@pytest.mark.parametrize("optimizer", sorted(STATE))
def test_table_memory_counts_each_optimizers_state_on_every_placement(optimizer, elem):
    table = TableSpec("C1", rows=ROWS, dim=DIM, bytes_per_element=elem, hot_rows=HOT, hot_share=0.5,
                      embedding_optimizer=optimizer)
    expected = _expected(optimizer, elem)
    costs = {p: table_memory(table, p, WORLD, WORLD) for p in expected}
    assert {p: (c.memory_bytes, c.max_shard_bytes) for p, c in costs.items()} == expected


def test_the_optimizers_priced_are_the_configs():
    from rayemb.config import EMBEDDING_OPTIMIZERS

    assert sorted(STATE) == sorted(EMBEDDING_OPTIMIZERS)
    with pytest.raises(PlanError, match=r"'C1'.*'lamb'.*rowwise_adagrad"):
        TableSpec("C1", rows=10, dim=8, embedding_optimizer="lamb")


def test_a_cached_table_keeps_its_optimizer_state_on_the_host():
    topo = described_topology(4, 4, hbm_gib=1, ddr_gib=8)
    costs = {o: storage_cost(TableSpec("C1", rows=ROWS, dim=DIM, hot_rows=HOT, hot_share=0.5, embedding_optimizer=o),
                             StorageOption(kernel="cached", cache_load_factor=0.5), Placement.ROW_WISE, topo, 4096)
             for o in ("sgd", "adam")}
    shard = math.ceil(ROWS / 4)
    assert costs["adam"].max_host_shard_bytes == shard * (DIM * 4 + STATE["adam"][0])
    assert costs["sgd"].max_host_shard_bytes == shard * DIM * 4
    assert costs["adam"].max_shard_bytes == costs["sgd"].max_shard_bytes  # the device cache holds weights only


def test_the_split_budgets_each_replicated_row_with_its_optimizers_state():
    topo = described_topology(4, 4, hbm_gib=1)
    assert split_rule(topo, 4096, DIM).optimizer_bytes_per_row == 4
    assert split_rule(topo, 4096, {"C1": DIM, "C2": 16}, embedding_optimizer="adam").optimizer_bytes_per_row \
        == {"C1": 2 * DIM * 4, "C2": 2 * 16 * 4}


def _fitting_table(optimizer: str, topo: Any) -> TableSpec:
    """A table whose row-wise shard takes 65 % of a rank under row-wise Adagrad (260 B a row), 192 % under Adam."""
    per_rank = int(0.65 * topo.capacity_bytes) // (DIM * 4 + 4)
    return TableSpec("C1", rows=per_rank * topo.world_size, dim=DIM, embedding_optimizer=optimizer)


def test_adam_changes_the_plan_of_a_table_that_fits_under_rowwise_adagrad():
    topo = described_topology(2, 1, ddr_gib=0.05, compute_device="cpu")
    small = _fitting_table("rowwise_adagrad", topo)
    plain = plan([small], topo, 4096, engine="fast")
    assert plain.tables["C1"].placement == Placement.ROW_WISE and plain.tables["C1"].storage is None
    assert [r.memory_bytes for r in plain.ranks] == [small.rows // 2 * (DIM * 4 + 4)] * 2
    assert plain.all_fit()

    big = _fitting_table("adam", topo)
    stored = plan([big], topo, 4096, engine="fast")  # no plain placement fits: compressed to fit
    assert stored.tables["C1"].storage is not None and stored.tables["C1"].storage["compression"] != "none"
    assert stored.all_fit()
    with pytest.raises(PlanError, match="C1") as e:
        plan([big], topo, 4096, pins={"C1": {"compression": "none"}}, engine="fast")
    assert e.value.category == "insufficient_storage"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Dict[str, Any]:
    from tests._export import small_dataset_to_plan

    return small_dataset_to_plan(str(tmp_path_factory.mktemp("optimizer_memory") / "data"))


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "adam"])
def test_the_jobs_optimizer_reaches_the_planned_memory(dataset, optimizer):
    from rayemb.config import config_from_dict
    from rayemb.train.sharding import make_job_plan
    from rayemb.train.world_plan import plan_world

    schema, stats = dataset["schema"], dataset["stats"]
    every = {t: {"sharding": "data_parallel"} for t in schema.table_names}  # Adam runs on CPU for replicated rows
    cfg = config_from_dict({"name": "optimizer-memory", "data": {"path": dataset["path"], "batch_size": 32},
                            "model": {"embedding_dim": 8, "bottom_mlp": [8]},
                            "planner": {"tables": every, "calibrate": False},
                            "train": {"embedding_optimizer": optimizer}})
    job = plan_world(cfg, described_topology(2, 1, compute_device="cpu"), stats,
                     plan_fn=lambda c, split, topo: make_job_plan(c, schema, stats, split, topo)).job_plan
    rows = {t.name: int(t.num_embeddings) for t in schema.tables}
    state = {"rowwise_adagrad": 4, "adam": 2 * 8 * 4}[optimizer]
    assert {n: t["memory_bytes"] for n, t in job.summary["tables"].items()} == {
        n: 2 * r * (8 * 4 + state) for n, r in rows.items()}
