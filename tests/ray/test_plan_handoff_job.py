"""A job whose plan measures nothing on the cluster launches Ray Train's workers first and hands them its plan and
MLflow run when they are ready (rayemb.train.driver.handoff): the same job as one planned before the launch; a plan
that fails after the launch is the job's error, the workers end, and nothing of the job is left in Ray Train's
storage."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rayemb.config import load_config
from rayemb.errors import DataError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "jobs" / "configs" / "synth_small.yaml")


def _cfg(data, out):
    return load_config(CONFIG, [f"data.path={data}", f"tracking.output_dir={out}", "planner.calibrate=false",
                                "train.epochs=1", "train.max_steps_per_epoch=6", "train.log_every_n_steps=3",
                                "data.batch_size=256", "tracking.experiment=handoff"])


def _created_groups():
    import ray

    return {pg_id for pg_id, pg in ray.util.placement_group_table().items() if pg.get("state") == "CREATED"}


def _after_the_workers_launch(real, before):
    """``real`` (the rest of the plan), called once Ray Train's worker group holds its placement group."""
    def planned_late(*args, **kwargs):
        deadline = time.monotonic() + 600
        while not (_created_groups() - before):
            assert time.monotonic() < deadline, "Ray Train's workers were not launched before the plan was made"
            time.sleep(0.2)
        planned_late.launched_first = True
        return real(*args, **kwargs)

    planned_late.launched_first = False
    return planned_late


def test_workers_launched_before_the_plan_train_the_job_planned_first(ray_2_cpus, tiny_data, tmp_path, monkeypatch):
    import rayemb.train.driver.trainer as trainer

    with monkeypatch.context() as m:  # today's order: the plan, then the launch
        m.setattr(trainer.PlanStart, "measures_nothing_more", property(lambda self: False))
        first = trainer.run_training(_cfg(tiny_data, tmp_path / "planned-first"))
    late = _after_the_workers_launch(trainer.finish_plan, _created_groups())
    monkeypatch.setattr(trainer, "finish_plan", late)
    handed = trainer.run_training(_cfg(tiny_data, tmp_path / "handed"))

    assert late.launched_first
    assert first.status == handed.status == "FINISHED"
    assert handed.plan == first.plan
    assert handed.metrics["step"] == first.metrics["step"] == 6
    for name in ("train_loss", "valid_auc", "valid_logloss"):
        assert handed.metrics[name] == pytest.approx(first.metrics[name], rel=1e-5), name
    assert handed.metrics["phase_s.plan_wait"] >= 0  # rank 0's wait for its job: what the workers' start did not hide


def test_a_plan_failing_after_the_launch_is_the_jobs_error_and_leaves_nothing(ray_2_cpus, tiny_data, tmp_path,
                                                                              monkeypatch):
    import rayemb.train.driver.trainer as trainer

    def failing(start):
        raise DataError("the plan failed (a test's)", category="invalid_config")

    before = _created_groups()
    late = _after_the_workers_launch(failing, before)
    monkeypatch.setattr(trainer, "finish_plan", late)
    out = tmp_path / "runs"
    with pytest.raises(DataError, match="the plan failed"):
        trainer.run_training(_cfg(tiny_data, out))

    assert late.launched_first
    assert not _created_groups() - before  # the worker group ended
    results = out / "ray_results"
    assert not results.exists() or not any(results.iterdir()), list(results.iterdir())
