"""The driver's plan stage (check_inputs -> statistics -> plan_job) makes the hot set of each world size an
elastic job may run at once, in :func:`rayemb.train.world_plan.plan_world`, sized for that world's batch.

On the shared local Ray (plan_job reads the live nodes' CPUs), with TorchRec loaded, so the plans are made in
this process; HugeCTR's split runs as it is, wrapped to record who calls it for which world.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from _split_calls import split_calls  # noqa: F401 - a fixture
from rayemb.batch_shape import BatchShape
from rayemb.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "jobs" / "configs" / "synth_small.yaml")


@pytest.mark.timeout(300)
def test_the_plan_stage_splits_once_per_world_size_each_for_its_batch(ray_2_cpus, tiny_data, tmp_path,
                                                                       split_calls):
    import torchrec  # noqa: F401 - the driver has TorchRec loaded: plan_job plans in this process, no Ray task

    from rayemb.train.driver.trainer import check_inputs, compute_statistics, job_topology, plan_job

    cfg = load_config(CONFIG, [f"data.path={tiny_data}", f"tracking.output_dir={tmp_path / 'runs'}",
                               "scaling.num_workers=[1, 2]", "planner.calibrate=false"])
    inputs = check_inputs(cfg)
    stats = compute_statistics(inputs)
    assert split_calls == []  # the statistics are the world's input, not split for one
    planned = plan_job(inputs, job_topology(cfg), stats)

    local = cfg.data.batch_size
    assert sorted(split_calls) == [(1, local, "plan_world"), (2, 2 * local, "plan_world")]
    assert sorted(planned.plans) == [1, 2]
    for world, plan in planned.plans.items():
        assert plan.batch == BatchShape(local, world) and plan.topology.world_size == world
        assert (plan.split.world_size, plan.split.global_batch_size) == (plan.batch.world, plan.batch.global_size)
        assert plan.job_plan.summary["world_size"] == world
        for table, ids in plan.job_plan.hot_ids.items():  # the hybrid tables replicate this world's hot set
            np.testing.assert_array_equal(ids, plan.split.hot_ids(table))
    # split.json and plan.json are the planned world's
    assert planned.split is planned.plans[2].split and planned.summary is planned.plans[2].job_plan.summary


@pytest.mark.timeout(300)
def test_the_plan_stage_refuses_an_early_stopping_metric_the_model_does_not_report(ray_2_cpus, tiny_data, tmp_path):
    """GAUC without a group column, or a hit rate of a ranking model: refused where the model is first built,
    before any worker starts or any output is written."""
    import torchrec  # noqa: F401 - plan_job plans in this process

    from rayemb.errors import ConfigError
    from rayemb.train.driver.trainer import check_inputs, compute_statistics, job_topology, plan_job

    out = tmp_path / "runs"
    for metric, said in (("valid_gauc", "needs a group column"), ("valid_hit_rate_at_10", "ranking model")):
        cfg = load_config(CONFIG, [f"data.path={tiny_data}", f"tracking.output_dir={out}", "planner.calibrate=false",
                                   f"train.early_stopping_metric={metric}"])
        inputs = check_inputs(cfg)
        with pytest.raises(ConfigError, match=said):
            plan_job(inputs, job_topology(cfg), compute_statistics(inputs))
    assert not out.exists() or not any(out.iterdir())
