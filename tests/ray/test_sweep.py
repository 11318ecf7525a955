"""`rayemb sweep`: three real jobs under Ray Tune's ASHA, one parent MLflow run, the trials ASHA stopped KILLED."""

import os

import pytest
import yaml
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_asha_sweep_makes_one_parent_and_a_child_per_trial(ray_2_cpus, tiny_data, tmp_path, capsys):
    from rayemb.cli import main

    space = tmp_path / "space.yaml"
    # the first trial learns; the other two barely move their embeddings (the dense part is frozen in all three),
    # so at the first validation they fall below the median of the trials there and ASHA stops them
    space.write_text(yaml.safe_dump({"train.embedding_lr": {"grid": [0.1, 1.0e-9, 2.0e-9]}}))
    out = tmp_path / "runs"
    rc = main(["sweep", "--config", "jobs/configs/synth_small.yaml", "--space", str(space),
               "--set", f"data.path={tiny_data}", "--set", f"tracking.output_dir={out}",
               "--set", "tracking.experiment=sweep", "--set", "train.max_steps_per_epoch=8",
               "--set", "train.log_every_n_steps=4", "--set", "train.epochs=2", "--set", "planner.calibrate=false",
               "--set", "train.dense_lr=1e-9", "--set", "train.early_stopping_patience=null",
               "--set", "scaling.num_workers=1", "--max-concurrent", "1", "--name", "lr"])
    printed = capsys.readouterr().out
    assert rc == 0, printed[-3000:]

    client = MlflowClient(f"sqlite:///{out}/mlflow.db")
    exp = client.get_experiment_by_name("sweep")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 3, [(r.info.run_name, r.data.tags) for r in runs]
    parent = parents[0]
    assert parent.data.tags["rayemb.kind"] == "sweep" and parent.info.status == "FINISHED"
    assert {k: v for k, v in parent.data.params.items() if k != "sweep.max_concurrent"} == {
        "sweep.keys": "train.embedding_lr", "sweep.metric": "valid_auc", "sweep.mode": "max",
        "sweep.search": "random", "sweep.scheduler": "asha", "sweep.num_samples": "1"}
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "sweep")] == ["sweep/space.yaml"]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}

    by_lr = {float(c.data.params["train.embedding_lr"]): c for c in children}
    assert sorted(by_lr) == [1.0e-9, 2.0e-9, 0.1]
    assert len({c.data.tags["rayemb.sweep.trial_id"] for c in children}) == 3
    learner = by_lr[0.1]
    assert learner.info.status == "FINISHED" and "rayemb.stopped_reason" not in learner.data.tags
    assert parent.data.tags["rayemb.sweep.best_run_id"] == learner.info.run_id
    assert parent.data.metrics["best_valid_auc"] == pytest.approx(
        max(m.value for m in client.get_metric_history(learner.info.run_id, "valid_auc")))
    for lr in (1.0e-9, 2.0e-9):
        stopped = by_lr[lr]
        assert stopped.info.status == "KILLED", (lr, stopped.info.status, stopped.data.tags)
        reason = stopped.data.tags["rayemb.stopped_reason"]
        assert reason.startswith("asha: valid_auc=") and "below the median" in reason and "epoch 1" in reason
        # stopped after its first epoch: its validation logged, its checkpoint kept in the trial's folder
        assert [m.step for m in client.get_metric_history(stopped.info.run_id, "valid_auc")] == [8]
        trial_dir = out / "sweeps" / "lr" / stopped.data.tags["rayemb.sweep.trial_id"]
        kept = [d for _, dirs, _ in os.walk(trial_dir) for d in dirs if d.startswith("checkpoint")]
        assert kept, sorted(os.listdir(trial_dir))
    assert f"best valid_auc={parent.data.metrics['best_valid_auc']:.4f}: run {learner.info.run_id}" in printed

    # the same command again: the sweep exists
    rc = main(["sweep", "--config", "jobs/configs/synth_small.yaml", "--space", str(space),
               "--set", f"data.path={tiny_data}", "--set", f"tracking.output_dir={out}", "--name", "lr"])
    assert rc == 2 and "Pass --resume to continue it" in capsys.readouterr().err
    assert len(client.search_runs([exp.experiment_id])) == 4


def _finished_children(db, experiment):
    if not (db.parent / "sweeps" / "resumable" / "sweep.json").exists():  # the store is made before it
        return []
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return [r for r in client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'")
            if "mlflow.parentRunId" in r.data.tags]


def test_a_sweep_whose_driver_died_resumes_in_its_parent_run(ray_2_cpus, tiny_data, tmp_path, capsys):
    """The sweep's driver SIGKILLed once its first trial finished; the same command with --resume runs the
    second trial only, in the same parent run."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from rayemb.cli import main

    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"train.dense_lr": {"grid": [0.05, 0.02]}}))
    out = tmp_path / "runs"
    argv = ["sweep", "--config", "jobs/configs/synth_small.yaml", "--space", str(space),
            "--set", f"data.path={tiny_data}", "--set", f"tracking.output_dir={out}",
            "--set", "tracking.experiment=resumed", "--set", "train.max_steps_per_epoch=8",
            "--set", "train.log_every_n_steps=4", "--set", "train.epochs=1", "--set", "planner.calibrate=false",
            "--set", "scaling.num_workers=1", "--scheduler", "fifo", "--max-concurrent", "1", "--name", "resumable"]
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(RAY_ADDRESS=ray_2_cpus.get_runtime_context().gcs_address, PYTHONPATH=repo)
    driver = subprocess.Popen([sys.executable, "-m", "rayemb", *argv], cwd=repo, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not _finished_children(out / "mlflow.db", "resumed"):
            assert driver.poll() is None, "the sweep ended before it was killed"
            assert time.monotonic() < deadline, "no trial finished"
            time.sleep(2)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    first = _finished_children(out / "mlflow.db", "resumed")
    assert len(first) == 1
    parent_id = json.loads((out / "sweeps" / "resumable" / "sweep.json").read_text())["parent_run_id"]

    assert main(argv + ["--resume"]) == 0, capsys.readouterr().out[-3000:]
    client = MlflowClient(f"sqlite:///{out}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("resumed").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert [p.info.run_id for p in parents] == [parent_id] and parents[0].info.status == "FINISHED"
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    assert sorted(c.data.params["train.dense_lr"] for c in children) == ["0.02", "0.05"]
    # the finished trial was not run again: its run is the one it was, its end unchanged
    again = next(c for c in children if c.info.run_id == first[0].info.run_id)
    assert again.info.end_time == first[0].info.end_time
    assert parents[0].data.tags["rayemb.sweep.best_run_id"] in {c.info.run_id for c in children}
