"""`ray job submit --working-dir . -- python jobs/train.py` against the cluster/ local head script.

The head is started and stopped by cluster/local_head.sh, which signals the PID it
started (never `ray stop`); the test checks that PID is gone afterwards.
"""

import os
import subprocess
import sys

import pytest
from _servers import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_ray_job_submit_against_local_head(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # the SDK client below sends the head's token
    dash = free_port()
    env = {
        **os.environ,
        "RAY_HEAD_PORT": str(free_port()),
        "RAY_DASHBOARD_PORT": str(dash),
        "RAY_DASHBOARD_AGENT_PORT": str(free_port()),
        "RAY_HEAD_EXTRA_ARGS": f"--metrics-export-port {free_port()} --dashboard-agent-grpc-port {free_port()} "
        f"--runtime-env-agent-port {free_port()} --ray-client-server-port {free_port()}",
        "RAYEMB_HEAD_DIR": str(tmp_path / "head"),
        "RAY_HEAD_NUM_CPUS": "2",
        "RAY_AUTH_MODE": "token",
    }
    head = os.path.join(REPO, "cluster", "local_head.sh")
    start = subprocess.run(["bash", head, "start"], env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert start.returncode == 0, start.stdout + start.stderr
    pid = int((tmp_path / "head" / "head.pid").read_text())
    try:
        sub = subprocess.run(
            [os.path.join(BIN, "ray"), "job", "submit", "--address", f"http://127.0.0.1:{dash}",
             "--submission-id", "rayemb-e2e", "--working-dir", ".", "--",
             "python", "jobs/train.py", "--config", "jobs/configs/synth_small.yaml",
             "--set", f"data.path={tiny_data}", "--set", f"tracking.output_dir={tmp_path}/out",
             "--set", "data.batch_size=256", "--set", "train.epochs=1"],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=900,
        )
        out = sub.stdout + sub.stderr
        assert sub.returncode == 0, out[-4000:]
        from ray.job_submission import JobStatus, JobSubmissionClient

        info = JobSubmissionClient(f"http://127.0.0.1:{dash}").get_job_info("rayemb-e2e")
        assert info.status == JobStatus.SUCCEEDED
        assert "FINISHED" in out and "valid_auc=" in out
        assert (tmp_path / "out" / "mlflow.db").exists()
    finally:
        stop = subprocess.run(["bash", head, "stop"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
