"""`rayemb sweep`: one real sweep of three jobs under Ray Tune's ASHA, run as a user meets its failures.

The sweep's driver runs as its own process. Trial 1 (a learner) loses its Ray Train worker to a SIGKILL mid-epoch
and resumes from its step checkpoint; trial 2 (embeddings frozen in effect) falls below trial 1 at the first
validation and ASHA stops it; then the driver itself is SIGKILLed, and the same command with ``--resume`` runs
what is left in the same parent MLflow run. Each test reads one part of that one sweep.
"""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: the grid, in the order Tune runs it (one trial at a time): a learner, a trial ASHA stops, another learner
LEARNER, FROZEN, SECOND = 0.1, 1.0e-9, 0.2
#: 8 steps, validated at step 4 (ASHA's first rung) and 8; a step checkpoint at 4; the worker killed at step 6
STEPS, EVAL_AT, KILL_AT = 8, 4, 6
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _children(client, experiment):
    """The trials' runs that logged their params (a run is made a moment before)."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return [r for r in client.search_runs([exp.experiment_id])
            if "mlflow.parentRunId" in r.data.tags and "train.embedding_lr" in r.data.params]


@pytest.fixture(scope="module")
def sweep(shared_ray, tiny_data, tmp_path_factory):
    """The sweep, killed and resumed as the module's docstring says. Returns what the tests read: the output
    folder, the MLflow client, the fault marker, the three trials' runs by embedding_lr before the driver was
    killed (``before``) and after the resume (``after``), the parent run id of ``sweep.json``, the codes and
    output of the refused plain rerun and of the resume."""
    from rayemb.cli import main
    from rayemb.constants import FAULT_INJECTION_ENV_VAR

    ray = shared_ray.ensure()  # before the driver's environment is copied: it names the cluster and its token
    tmp = tmp_path_factory.mktemp("sweep")
    space, out, marker = tmp / "space.yaml", tmp / "runs", tmp / "worker-killed"
    # the dense part frozen in all three: only the embeddings' learning rate sets the trials apart
    space.write_text(yaml.safe_dump({"train.embedding_lr": {"grid": [LEARNER, FROZEN, SECOND]}}))
    argv = ["sweep", "--config", "jobs/configs/synth_small.yaml", "--space", str(space),
            "--set", f"data.path={tiny_data}", "--set", f"tracking.output_dir={out}",
            "--set", "tracking.experiment=sweep", "--set", f"train.max_steps_per_epoch={STEPS}",
            "--set", f"train.eval_every_n_steps={EVAL_AT}", "--set", f"train.checkpoint_every_n_steps={EVAL_AT}",
            "--set", f"train.log_every_n_steps={EVAL_AT}", "--set", "train.epochs=1",
            "--set", "planner.calibrate=false", "--set", "planner.probe_steps=0",
            "--set", "train.dense_lr=1e-9", "--set", "train.early_stopping_patience=null",
            "--set", "scaling.num_workers=1", "--set", "scaling.max_failures=1",
            "--max-concurrent", "1", "--name", "lr"]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    # every trial's job driver (a Tune process) reads the fault hook; the first to reach the step kills its worker
    env.update(RAY_ADDRESS=ray.get_runtime_context().gcs_address, PYTHONPATH=REPO,
               RAY_JOB_CONFIG_JSON_ENV_VAR=json.dumps(
                   {"runtime_env": {"env_vars": {FAULT_INJECTION_ENV_VAR: f"{KILL_AT}:{marker}:kill"}}}),
               # Tune records each trial's end at once: the driver killed below leaves no finished trial unrecorded
               TUNE_GLOBAL_CHECKPOINT_S="0")
    client = MlflowClient(f"sqlite:///{out}/mlflow.db")
    log = tmp / "driver.log"
    with open(log, "w") as f:
        driver = subprocess.Popen([sys.executable, "-m", "rayemb", *argv], cwd=REPO, env=env, stdout=f,
                                  stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        # killed once the third trial's run exists: the first finished, the second stopped by ASHA
        while len(_children(client, "sweep") if (out / "sweeps" / "lr" / "sweep.json").exists() else []) < 3:
            assert driver.poll() is None, "the sweep ended before it was killed:\n" + log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the third trial did not start:\n" + log.read_text()[-3000:]
            time.sleep(1)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    before = {float(c.data.params["train.embedding_lr"]): c for c in _children(client, "sweep")}
    parent_run_id = json.loads((out / "sweeps" / "lr" / "sweep.json").read_text())["parent_run_id"]

    # the same command without --resume is refused: the sweep exists
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            refused = main(argv)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            resumed = main(argv + ["--resume"])
    after = {float(c.data.params["train.embedding_lr"]): c for c in _children(client, "sweep")}
    return {"out": out, "client": client, "marker": marker, "before": before, "after": after,
            "parent_run_id": parent_run_id, "refused": (refused, err.getvalue()),
            "resumed": (resumed, printed.getvalue()), "log": log}


def _steps(client, run, key):
    return [m.step for m in client.get_metric_history(run.info.run_id, key)]


def test_one_parent_and_a_child_per_trial(sweep):
    client, after = sweep["client"], sweep["after"]
    rc, printed = sweep["resumed"]
    assert rc == 0, printed[-3000:]
    exp = client.get_experiment_by_name("sweep")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [p.info.run_id for p in parents] == [sweep["parent_run_id"]], [(r.info.run_name, r.data.tags) for r in runs]
    parent = parents[0]
    assert parent.data.tags["rayemb.kind"] == "sweep" and parent.info.status == "FINISHED"
    assert {k: v for k, v in parent.data.params.items() if k != "sweep.max_concurrent"} == {
        "sweep.keys": "train.embedding_lr", "sweep.metric": "valid_auc", "sweep.mode": "max",
        "sweep.search": "random", "sweep.scheduler": "asha", "sweep.num_samples": "1"}
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "sweep")] == ["sweep/space.yaml"]
    assert sorted(after) == sorted([LEARNER, FROZEN, SECOND]) and len(runs) == 4
    assert {c.data.tags["mlflow.parentRunId"] for c in after.values()} == {parent.info.run_id}
    assert len({c.data.tags["rayemb.sweep.trial_id"] for c in after.values()}) == 3
    # the best trial: the child whose best validation is highest, as the parent records and the command prints
    best_auc = {lr: max(m.value for m in client.get_metric_history(c.info.run_id, "valid_auc"))
                for lr, c in after.items()}
    best = after[max(best_auc, key=best_auc.get)]
    assert best.info.status == "FINISHED"
    assert parent.data.tags["rayemb.sweep.best_run_id"] == best.info.run_id
    assert parent.data.metrics["best_valid_auc"] == pytest.approx(max(best_auc.values()))
    assert f"best valid_auc={parent.data.metrics['best_valid_auc']:.4f}: run {best.info.run_id}" in printed


def test_a_trial_whose_worker_was_killed_resumes_from_its_checkpoint(sweep):
    client, after = sweep["client"], sweep["after"]
    assert sweep["marker"].exists(), "the worker was not killed"
    learner = after[LEARNER]
    assert learner.info.status == "FINISHED" and "rayemb.stopped_reason" not in learner.data.tags
    # the restarted group continued after the step-4 checkpoint: one validation each at 4 and 8, one loss each
    assert _steps(client, learner, "valid_auc") == [EVAL_AT, STEPS]
    assert _steps(client, learner, "train_loss") == [EVAL_AT, STEPS]
    resumed = [(m.step, m.value) for m in client.get_metric_history(learner.info.run_id, "resumed_at_step")]
    assert resumed == [(STEPS, EVAL_AT)]
    # the other trials' workers were never restarted; they trained and validated as a trial does
    assert [(m.step, m.value) for m in client.get_metric_history(after[SECOND].info.run_id, "resumed_at_step")] \
        == [(STEPS, -1.0)]
    assert _steps(client, after[SECOND], "valid_auc") == [EVAL_AT, STEPS]
    assert _steps(client, after[SECOND], "train_loss") == [EVAL_AT, STEPS]


def test_asha_stops_a_trial_below_the_median_and_keeps_its_checkpoint(sweep):
    client, out = sweep["client"], sweep["out"]
    stopped = sweep["after"][FROZEN]
    assert stopped.info.status == "KILLED", (stopped.info.status, stopped.data.tags)
    reason = stopped.data.tags["rayemb.stopped_reason"]
    assert reason.startswith("asha: valid_auc=") and "below the median" in reason and "epoch 1" in reason, reason
    # stopped at its first validation: logged, and its checkpoint of that step kept in the trial's folder
    assert _steps(client, stopped, "valid_auc") == [EVAL_AT]
    # its job ended its run before Tune ended the trial's process: its phases are logged, the stop is its reason
    assert "phase_s.wall" in stopped.data.metrics, sorted(stopped.data.metrics)
    assert "rayemb.failure_reason" not in stopped.data.tags, stopped.data.tags
    trial_dir = out / "sweeps" / "lr" / stopped.data.tags["rayemb.sweep.trial_id"]
    kept = [d for _, dirs, _ in os.walk(trial_dir) for d in dirs if d.startswith("checkpoint")]
    assert kept, sorted(os.listdir(trial_dir))


def test_a_sweep_whose_driver_died_resumes_in_its_parent_run(sweep):
    refused, err = sweep["refused"]
    assert refused == 2 and "Pass --resume to continue it" in err, err
    before, after = sweep["before"], sweep["after"]
    # killed with the first trial finished and the second stopped: neither ran again, their runs unchanged
    assert before[LEARNER].info.status == "FINISHED" and before[FROZEN].info.status == "KILLED"
    for lr in (LEARNER, FROZEN):
        assert after[lr].info.run_id == before[lr].info.run_id
        assert after[lr].info.end_time == before[lr].info.end_time, lr
    # the third trial, cut off by the kill, continued its own run to the end (its job's second attempt)
    assert before[SECOND].info.status == "RUNNING"
    assert after[SECOND].info.run_id == before[SECOND].info.run_id and after[SECOND].info.status == "FINISHED"
    attempts = sweep["client"].get_metric_history(after[SECOND].info.run_id, "attempt")
    assert sorted(m.value for m in attempts) == [1.0, 2.0]


def test_trials_share_the_kept_statistics(sweep):
    """One statistics pass for the sweep: every trial's kept statistics are the sweep's output folder's."""
    out = sweep["out"]
    kept = sorted(os.listdir(out / "stats"))
    assert len(kept) == 1 and kept[0].startswith("train-"), kept
    for run in sweep["after"].values():
        trial_dir = out / "sweeps" / "lr" / run.data.tags["rayemb.sweep.trial_id"]
        assert os.path.realpath(trial_dir / "stats") == str(out / "stats")
