"""An embedding optimizer without a CPU kernel for a planned placement stops the job when the driver plans it.

The driver's plan (``rayemb.train.sharding.make_job_plan``, from the dataset's statistics) of a CPU job with
``train.embedding_optimizer: adam`` shards tables with FBGEMM's fused kernel, which has no CPU Adam: one
ConfigError names a table and its placement and the fixes. The same job with every table pinned data-parallel
(replicated rows: Adam in torch) plans, and so does the default optimizer.
"""

from __future__ import annotations

from typing import Any, Dict

import pytest

from rayemb.errors import ConfigError


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Dict[str, Any]:
    from tests._export import small_dataset_to_plan

    return small_dataset_to_plan(str(tmp_path_factory.mktemp("adam_plan") / "data"))


def _plan(dataset: Dict[str, Any], optimizer: str, pins: Dict[str, Any]) -> Any:
    from rayemb.config import config_from_dict
    from rayemb.planner.topology import described_topology
    from rayemb.train.sharding import make_job_plan
    from rayemb.train.world_plan import plan_world

    cfg = config_from_dict({"name": "adam-plan", "data": {"path": dataset["path"], "batch_size": 32},
                            "model": {"embedding_dim": 8, "bottom_mlp": [8]},
                            "planner": {"tables": pins, "calibrate": False},
                            "train": {"embedding_optimizer": optimizer}})
    schema, stats = dataset["schema"], dataset["stats"]
    return plan_world(cfg, described_topology(2, 1, compute_device="cpu"), stats,
                      plan_fn=lambda c, split, topo: make_job_plan(c, schema, stats, split, topo)).job_plan


@pytest.mark.parametrize("optimizer", ["adam", "rowwise_adam"])
def test_adam_on_sharded_cpu_tables_is_refused_when_planned(dataset, optimizer):
    with pytest.raises(ConfigError) as e:
        _plan(dataset, optimizer, {"C1": {"sharding": "row_wise"}})
    message = str(e.value)
    assert f"train.embedding_optimizer: {optimizer!r}" in message and "is placed" in message, message
    assert "use_gpu" in message and "data_parallel" in message and "rowwise_adagrad" in message, message


def test_adam_on_data_parallel_tables_and_the_default_optimizer_plan(dataset):
    every = {t: {"sharding": "data_parallel"} for t in dataset["schema"].table_names}
    plan = _plan(dataset, "adam", every)
    assert {str(p.placement.value) for p in plan.placements.values()} == {"data_parallel"}
    assert _plan(dataset, "rowwise_adagrad", {"C1": {"sharding": "row_wise"}}).placements["C1"].placement.value \
        == "row_wise"
