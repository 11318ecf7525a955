"""The plan stage makes the job's TorchRec plan in the driver, with no Ray task: the JobPlan holds TorchRec's
ShardingPlan, so a driver receiving it from a task loaded TorchRec all the same, after a task worker had started
and loaded it too."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayemb.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "jobs" / "configs" / "synth_small.yaml")


@pytest.mark.timeout(300)
def test_the_plan_stage_plans_in_the_driver_without_a_ray_task(ray_2_cpus, tiny_data, tmp_path, monkeypatch):
    import ray

    import rayemb.train.driver.trainer as trainer

    made = []
    real = trainer._make_plan

    def counted(**what):
        made.append(what["split"].world_size)
        return real(**what)

    def no_task(*args, **kwargs):
        raise AssertionError("the plan stage started a Ray task or actor")

    monkeypatch.setattr(trainer, "_make_plan", counted)
    cfg = load_config(CONFIG, [f"data.path={tiny_data}", f"tracking.output_dir={tmp_path / 'runs'}",
                               "planner.calibrate=false"])
    inputs = trainer.check_inputs(cfg)
    stats = trainer.compute_statistics(inputs)
    topology = trainer.job_topology(cfg)
    monkeypatch.setattr(ray, "remote", no_task)
    planned = trainer.plan_job(inputs, topology, stats)

    assert made == [2]
    assert planned.plans[2].job_plan.sharding_plan is not None


@pytest.mark.timeout(300)
def test_the_tracking_stage_leaves_the_charts_to_a_thread_beside_the_workers_start(ray_2_cpus, tiny_data, tmp_path,
                                                                                 monkeypatch):
    import threading

    import rayemb.data.stats_report as stats_report
    import rayemb.planner as planner
    import rayemb.train.driver.trainer as trainer
    from rayemb.train.driver.attempt import claim_attempt

    drawn = {}
    for module, name in ((stats_report, "plot_frequencies"), (planner, "plot_plan")):
        def on_thread(*args, _real=getattr(module, name), _name=name, **kwargs):
            drawn[_name] = threading.current_thread().name
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, on_thread)
    cfg = load_config(CONFIG, [f"data.path={tiny_data}", f"tracking.output_dir={tmp_path / 'runs'}",
                               "planner.calibrate=false"])
    inputs = claim_attempt(trainer.check_inputs(cfg))
    planned = trainer.plan_job(inputs, trainer.job_topology(cfg), trainer.compute_statistics(inputs))
    tracking = trainer.start_tracking(inputs, planned)
    try:
        tracking.charts.join()
        assert drawn == {"plot_frequencies": "rayemb-job-charts", "plot_plan": "rayemb-job-charts"}
        assert {"frequencies.png", "plan.png", "plan.json", "stats.json"} <= set(
            p.name for p in Path(tracking.job_dir).iterdir())
    finally:
        tracking.run_logger.finish("FINISHED")


@pytest.mark.timeout(300)
def test_a_new_run_in_a_kept_store_is_created_beside_the_workers_start(ray_2_cpus, tiny_data, tmp_path, monkeypatch):
    """The first job creates the store (here, before any worker); the next one's run is created by the RunLogger's
    writer thread, and the job record gets its id from there."""
    import threading

    from rayemb.tracking.run_logger import RunLogger
    import rayemb.train.driver.trainer as trainer
    from rayemb.train.driver.attempt import claim_attempt
    from rayemb.train.driver.job_record import Heartbeat, read_record

    created = []
    real = RunLogger._create_run

    def on_thread(self, client):
        created.append(threading.current_thread().name)
        return real(self, client)

    monkeypatch.setattr(RunLogger, "_create_run", on_thread)
    cfg = load_config(CONFIG, [f"data.path={tiny_data}", f"tracking.output_dir={tmp_path / 'runs'}",
                               "planner.calibrate=false"])
    run_ids = []
    for _ in range(2):
        inputs = claim_attempt(trainer.check_inputs(cfg), new_run=True)
        planned = trainer.plan_job(inputs, trainer.job_topology(cfg), trainer.compute_statistics(inputs))
        heartbeat = Heartbeat(inputs.out_dir, inputs.attempt).start()
        tracking = trainer.start_tracking(inputs, planned, on_run=heartbeat.set_run_id)
        run_id = tracking.run_logger.wait_for_run(timeout_s=60)
        tracking.charts.join()
        assert tracking.run_logger.finish("FINISHED")
        heartbeat.stop("FINISHED", {"run_id": run_id})
        assert run_id and read_record(inputs.out_dir, cfg.name).run_id == run_id
        run_ids.append(run_id)
    assert created == ["MainThread", "rayemb-mlflow-writer"]
    assert len(set(run_ids)) == 2
