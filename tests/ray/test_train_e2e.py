"""A real training job on a local 2-CPU Ray (``e2e_job``): 2 gloo workers, sharded DLRM, MLflow sqlite store, a worker
failure it recovers from."""

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from _servers import free_port
from mlflow.tracking import MlflowClient


pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def job(e2e_job):
    out, result, _ = e2e_job
    return out, result


def test_job_resumes_from_the_epoch_checkpoint_after_a_failure(e2e_job):
    _, result, marker = e2e_job
    assert marker.exists(), "the fault was not injected"
    assert result.status == "FINISHED"
    epoch_ends = [r for r in result.reports if r.get("epoch_end")]
    # epoch 0 ran once (not repeated after the restart), epoch 1 completed after resuming at step 70
    assert [(r["epoch"], r["step"]) for r in epoch_ends] == [(0, 70), (1, 140)]
    steps = [r["step"] for r in result.reports if "train_loss" in r]
    # attempt 1 logged steps 10..90 and died at 100; attempt 2 resumed after step 70 and logged 80..140
    assert [steps.count(s) for s in (60, 70, 80, 90, 100, 140)] == [1, 1, 2, 2, 1, 1]
    client = MlflowClient(result.tracking_uri)
    assert [m.step for m in client.get_metric_history(result.run_id, "valid_auc")] == [70, 140]


def test_job_learns_and_is_tracked(job):
    tmp_path, result = job
    assert result.status == "FINISHED"
    assert result.metrics["valid_auc"] > 0.7, result.metrics
    assert result.tracking_uri == f"sqlite:///{tmp_path}/mlflow.db"

    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["data.batch_size"] == "256"
    auc_hist = client.get_metric_history(result.run_id, "valid_auc")
    assert len(auc_hist) == 2 and abs(auc_hist[-1].value - result.metrics["valid_auc"]) < 1e-9
    # the best epoch is reported, logged and its checkpoint kept (with its meta.json)
    best = max(auc_hist, key=lambda m: m.value)
    assert abs(result.metrics["best_valid_auc"] - best.value) < 1e-9
    assert [m.value for m in client.get_metric_history(result.run_id, "best_epoch")][-1] == auc_hist.index(best)
    assert run.data.tags["rayemb.best_checkpoint"] == result.best_checkpoint
    meta = json.loads((Path(result.best_checkpoint) / "meta.json").read_text())
    assert meta["epoch"] == auc_hist.index(best) and abs(meta["best_valid_auc"] - best.value) < 1e-9
    assert meta["epoch_complete"] and meta["world_size"] == 2 and meta["format"] == "rayemb-logical-v1"
    assert sorted(p.name for p in Path(result.best_checkpoint).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    # the last checkpoint is the second epoch's, and tagged
    assert run.data.tags["rayemb.last_checkpoint"] == result.last_checkpoint
    assert json.loads((Path(result.last_checkpoint) / "meta.json").read_text())["epoch"] == 1
    loss_hist = client.get_metric_history(result.run_id, "train_loss")
    # every reported point, the steps the restart redid included (test_job_resumes_from_the_epoch_checkpoint...)
    assert sorted(m.step for m in loss_hist) == sorted(r["step"] for r in result.reports if "train_loss" in r)
    by_step = sorted(loss_hist, key=lambda m: (m.step, m.timestamp))
    assert len(by_step) >= 4 and by_step[-1].value < by_step[0].value
    artifacts = {a.path for a in client.list_artifacts(result.run_id)}
    assert {"config.yaml", "plan.json", "stats.json", "split.json"} <= artifacts
    charts = {a.path for a in client.list_artifacts(result.run_id, "charts")}
    assert {"charts/frequencies.png", "charts/training_curves.png", "charts/memory_per_rank.png"} <= charts
    local = client.download_artifacts(result.run_id, "charts/training_curves.png", str(tmp_path / "dl"))
    with open(local, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # the stats pass saw every train row; the split's hot rows are whole multiples of the world size
    stats = json.loads(open(client.download_artifacts(result.run_id, "stats.json", str(tmp_path / "dl"))).read())
    assert stats["rows"] == 36_000 and set(stats["tables"]) == {f"C{i}" for i in range(1, 9)}
    hot = {k: v for k, v in run.data.metrics.items() if k.startswith("split.hot_rows.")}
    assert len(hot) == 8 and all(v % 2 == 0 for v in hot.values()) and sum(hot.values()) > 0
    # per-rank peak memory and the step-time breakdown are stepped metrics
    assert run.data.metrics["peak_memory_bytes.rank0"] > 50e6 and run.data.metrics["peak_memory_bytes.rank1"] > 50e6
    for phase in ("data_wait", "forward", "backward", "optimizer"):
        assert run.data.metrics[f"time_s.{phase}"] > 0
    plan = result.plan
    assert plan["world_size"] == 2 and len(plan["tables"]) == 8
    # the plan probe timed the model's plan (and the other side of the hybrid choice) before training; the
    # trained plan is the one it chose. plan.json keeps the two figures apart: predicted_step_time_s is the
    # step-time model's for that plan (as the probe's record lists it per candidate, planned before any
    # probing), probed_step_time_s the probe's median step; each is logged against the measured step
    probe = plan["plan_probe"]
    chosen = probe["candidates"][probe["chosen"]]
    assert 1 <= len(probe["candidates"]) <= 2 and all(c["probed_step_time_s"] > 0 for c in probe["candidates"])
    assert probe["schedule"] == "interleaved"  # two tiny plans fit a rank's memory together
    # the faster trains, unless the two read within the probe's noise: then the model's plan does
    assert chosen["probed_step_time_s"] == min(c["probed_step_time_s"] for c in probe["candidates"]) or (
        probe["within_noise"] and probe["chosen"] == 0)
    assert plan["probed_step_time_s"] == chosen["probed_step_time_s"]
    assert plan["predicted_step_time_s"] == chosen["predicted_step_time_s"] > 0
    assert plan["predicted_step_time_s"] == pytest.approx(sum(plan["predicted_step_time_components_s"].values()))
    assert "model_predicted_step_time_s" not in plan and plan["schema_version"] == 2
    placements = [t["placement"] for t in plan["tables"].values()]
    assert chosen["placements"] == {p: placements.count(p) for p in set(placements)}
    assert run.data.metrics["step_time_predicted_s"] == pytest.approx(plan["predicted_step_time_s"])
    assert run.data.metrics["step_time_probed_s"] == pytest.approx(plan["probed_step_time_s"])
    assert run.data.metrics["step_time_probed_over_measured"] == pytest.approx(
        plan["probed_step_time_s"] / run.data.metrics["step_time_measured_s"])
    # the first job on its key had no ratio to apply; it left its measured over predicted step for the next one
    learned = plan["learned_ratio"]
    assert learned["applied"] is None and learned["jobs"] == 0 and learned["file"].endswith(".ratio")
    kept = json.loads((Path(tmp_path) / learned["file"]).read_text())
    assert kept["ratios"] == [pytest.approx(run.data.metrics["step_time_measured_s"] / plan["predicted_step_time_s"])]


def test_mlflow_ui_command_shows_the_charts(job):
    """The `mlflow ui` command rayemb prints serves the run's charts."""
    from rayemb.cli.train import print_result as _print_result

    tmp_path, result = job
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _print_result(result)
    cmd = re.search(r"browse it with:\s+(mlflow ui .*)$", buf.getvalue(), re.M).group(1).split()
    port = free_port()
    cmd = [os.path.join(os.path.dirname(sys.executable), "mlflow"), *cmd[1:]]
    cmd[cmd.index("--port") + 1] = str(port)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}/get-artifact?path=charts/training_curves.png&run_uuid={result.run_id}"
        # a readiness wait, not a speed check: the server imports MLflow's whole app before it listens, which
        # took over 120 s on this 2-core machine while the other test stream ran
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    body = r.read()
                break
            except OSError:
                assert proc.poll() is None, "mlflow ui exited"
                assert time.monotonic() < deadline, "mlflow ui did not answer"
                time.sleep(0.5)
        assert body[:8] == b"\x89PNG\r\n\x1a\n" and len(body) > 5000
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
