"""A job outlives its driver: the driver SIGKILLed mid-epoch, the same command run again continues the run.

Two real ``rayemb train`` driver processes on the shared local Ray, one after the other: the first is killed
once a step checkpoint at step 60 or later is complete; the second, the same command, continues the same job from
the newest intact checkpoint, in the same MLflow run (attempt 2, steps logged once each, in order), and ends
with the weights a clean ``--resume-from`` of that checkpoint ends with. A third run of the command trains
nothing: the job is finished.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayemb.checkpoint.reader import checkpoints_newest_first, verify
from rayemb.errors import DataError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "jobs" / "configs" / "synth_small.yaml"


def _command(data: str, runs: Path, *extra: str, name: str = "restartable"):
    return [sys.executable, "-m", "rayemb", "train", "--config", str(CONFIG),
            "--set", f"data.path={data}", "--set", f"tracking.output_dir={runs}", "--set", f"name={name}",
            "--set", f"tracking.experiment={name}", "--set", "data.batch_size=64", "--set", "train.epochs=2",
            "--set", "train.max_steps_per_epoch=50", "--set", "train.checkpoint_every_n_steps=15",
            "--set", "train.log_every_n_steps=5", "--set", "train.early_stopping_patience=null",
            "--set", "planner.calibrate=false", "--set", "model.embedding_dim=8", "--set", "model.bottom_mlp=[16,8]",
            "--set", "model.top_mlp=[16,1]", *extra]


def _env(ray_address: str):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return dict(env, RAY_ADDRESS=ray_address, PYTHONPATH=str(REPO))


def _intact_at_or_after(root: Path, step: int):
    """The newest checkpoint under ``root`` at or after ``step`` whose files are all there, else None."""
    if not root.is_dir():
        return None
    for path in checkpoints_newest_first(str(root)):
        try:
            meta = verify(path, hashes=False)
        except DataError:
            continue
        if int(meta["step"]) >= step:
            return path
    return None


def _tensors(checkpoint: str, tmp: Path):
    """Every tensor of a logical checkpoint (DCP files), by name."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{Path(checkpoint).name}-{time.monotonic_ns()}.pt"
    dcp_to_torch_save(checkpoint, str(out))
    return {k: v for k, v in torch.load(out, weights_only=False).items() if isinstance(v, torch.Tensor)}


def test_a_killed_driver_is_continued_by_rerunning_the_same_command(ray_2_cpus, tiny_data, tmp_path):
    from mlflow import MlflowClient

    from rayemb.train.driver.job_record import read_record

    ray_address = ray_2_cpus.get_runtime_context().gcs_address
    runs, log = tmp_path / "runs", tmp_path / "first.log"
    env = _env(ray_address)
    with open(log, "w") as out:
        first = subprocess.Popen(_command(tiny_data, runs), cwd=tmp_path, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, killed_after = time.monotonic() + 400, None
        while time.monotonic() < deadline and first.poll() is None:
            rec = read_record(str(runs), "restartable")
            if rec is not None:
                killed_after = _intact_at_or_after(runs / "ray_results" / rec.job_id, 60)
                if killed_after:
                    break
            time.sleep(0.2)
        assert killed_after, (first.poll(), log.read_text()[-3000:])
        os.kill(first.pid, signal.SIGKILL)  # the driver only: its workers go with it (Ray's owner fate-sharing)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)

    rec = read_record(str(runs), "restartable")
    assert rec.status == "RUNNING" and rec.attempt == 1 and rec.run_id
    root = runs / "ray_results" / rec.job_id
    newest = _intact_at_or_after(root, 0)
    resumed_step = json.loads((Path(newest) / "meta.json").read_text())["step"]
    assert 60 <= resumed_step < 100
    kept = tmp_path / "kept-checkpoint"
    shutil.copytree(newest, kept)  # the job's own rotation removes it while the rerun trains

    second = subprocess.run(_command(tiny_data, runs, "--result-json", str(tmp_path / "second.json")), cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, (second.stdout[-3000:], second.stderr[-3000:])
    assert f"attempt 2 of run {rec.job_id} continues from checkpoint" in second.stdout, second.stdout[-3000:]
    result = json.loads((tmp_path / "second.json").read_text())
    assert result["status"] == "FINISHED" and result["run_id"] == rec.run_id

    after = read_record(str(runs), "restartable")
    assert (after.status, after.attempt, after.job_id) == ("FINISHED", 2, rec.job_id)
    assert [a.get("ended") for a in after.attempts] == [None, "FINISHED"]  # the first never ended: killed

    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == "restartable"]
    (run,) = client.search_runs([exp.experiment_id])  # one run: the second attempt continued the first's
    assert run.info.status == "FINISHED" and run.data.tags["rayemb.attempt"] == "2"
    attempts = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "attempt"))
    assert attempts == [(0, 1.0), (resumed_step, 2.0)]
    steps = [m.step for m in sorted(client.get_metric_history(run.info.run_id, "train_loss"),
                                    key=lambda m: m.timestamp)]
    assert steps == sorted(set(steps)), steps  # no step twice, in order across the two attempts
    # every point after the checkpoint the second attempt continued from, and the first attempt's before it without
    # a hole: the only hole is what the killed driver had trained before that checkpoint but not yet written (its
    # MLflow writes trail its training, the more so on a loaded machine)
    before = [s for s in steps if s <= resumed_step]
    assert before == list(range(5, (before or [0])[-1] + 1, 5)), steps
    assert [s for s in steps if s > resumed_step] == list(range((resumed_step // 5 + 1) * 5, 101, 5)), steps

    # the same checkpoint resumed by hand as another job (its own record, run folder and MLflow experiment, in
    # the same output folder: a new MLflow store costs seconds of schema migrations): the same final weights
    clean = subprocess.run(_command(tiny_data, runs, "--resume-from", str(kept), "--result-json",
                                    str(tmp_path / "clean.json"), name="clean"), cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert clean.returncode == 0, (clean.stdout[-3000:], clean.stderr[-3000:])
    ours = _tensors(result["last_checkpoint"], tmp_path)
    theirs = _tensors(json.loads((tmp_path / "clean.json").read_text())["last_checkpoint"], tmp_path)
    assert ours.keys() == theirs.keys() and any(k.startswith("tables.") for k in ours)
    for k in ours:
        assert (ours[k].double() - theirs[k].double()).abs().max().item() <= 1e-6, k

    third = subprocess.run(_command(tiny_data, runs), cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert third.returncode == 0 and "FINISHED already" in third.stdout, (third.stdout[-2000:], third.stderr[-2000:])
    assert read_record(str(runs), "restartable").attempt == 2
