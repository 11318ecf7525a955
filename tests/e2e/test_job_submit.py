"""cluster/local_head.sh: its auth token, its client environment, and `ray job submit --working-dir .
-- python jobs/train.py` against it.

Every test runs the script and its clients with HOME pointed at an empty directory of its own and
without RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, RAY_ADDRESS or RAY_API_SERVER_ADDRESS, as on a fresh
machine: no ~/.ray/auth_token to fall back on, so the head must bring its own token
($RAYEMB_HEAD_DIR/auth_token) and clients must get it from `local_head.sh env`. The head is
started and stopped by the script, which signals the PID it started (never `ray stop`); each
test stops the head it started and checks that PID is gone.
"""

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _servers import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
HEAD = os.path.join(REPO, "cluster", "local_head.sh")
# what a user's shell may carry; the tests set up the head's token and address themselves
CLIENT_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")


def head_env(tmp_path: Path, **extra: str) -> dict:
    """Environment for local_head.sh and its clients: free ports, a head dir and an empty HOME under tmp_path."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_VARS}
    env.update({
        "HOME": str(home),
        "RAY_HEAD_PORT": str(free_port()),
        "RAY_DASHBOARD_PORT": str(free_port()),
        "RAY_DASHBOARD_AGENT_PORT": str(free_port()),
        "RAY_HEAD_EXTRA_ARGS": f"--metrics-export-port {free_port()} --dashboard-agent-grpc-port {free_port()} "
        f"--runtime-env-agent-port {free_port()} --ray-client-server-port {free_port()}",
        "RAYEMB_HEAD_DIR": str(tmp_path / "head"),
        "RAY_HEAD_NUM_CPUS": "2",
        **extra,
    })
    return env


def head(cmd: str, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", HEAD, cmd], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def as_client(argv: list, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Runs argv the documented way: `eval "$(bash cluster/local_head.sh env)"; <argv>`."""
    script = 'eval "$(bash "$0" env)" && exec "$@"'
    return subprocess.run(["bash", "-c", script, HEAD, *argv], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def stop_head(env: dict, pid: int) -> None:
    stop = head("stop", env, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def exports(text: str) -> dict:
    return dict(re.findall(r"^export (\w+)=(\S+)$", text, flags=re.M))


@pytest.mark.timeout(300)
def test_head_creates_private_token_without_home_token(tmp_path):
    env = head_env(tmp_path)
    token = tmp_path / "head" / "auth_token"
    start = head("start", env)
    assert start.returncode == 0, start.stdout + start.stderr
    pid = int((tmp_path / "head" / "head.pid").read_text())
    try:
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        first = token.read_text()
        assert re.fullmatch(r"[0-9a-f]{64}", first)
        env_sh = (tmp_path / "head" / "env.sh").read_text()
        assert stat.S_IMODE((tmp_path / "head" / "env.sh").stat().st_mode) == 0o600
        assert exports(env_sh) == {
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_ADDRESS": f"127.0.0.1:{env['RAY_HEAD_PORT']}",
            "RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{env['RAY_DASHBOARD_PORT']}",
        }
        printed = head("env", env, timeout=30)
        assert printed.returncode == 0 and printed.stdout == env_sh, printed.stdout + printed.stderr
        # a client with the head's environment is let in; one without the token is not
        ok = as_client([os.path.join(BIN, "ray"), "job", "list"], env, timeout=120)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        no_token = subprocess.run([os.path.join(BIN, "ray"), "job", "list", "--address",
                                   f"http://127.0.0.1:{env['RAY_DASHBOARD_PORT']}"],
                                  env={**env, "RAY_AUTH_MODE": "token"}, cwd=REPO, capture_output=True, text=True,
                                  timeout=120)
        assert no_token.returncode != 0 and "token" in (no_token.stdout + no_token.stderr).lower()
    finally:
        stop_head(env, pid)
    # the token is created once and reused by the next start
    start = head("start", env)
    assert start.returncode == 0, start.stdout + start.stderr
    pid = int((tmp_path / "head" / "head.pid").read_text())
    try:
        assert token.read_text() == first and stat.S_IMODE(token.stat().st_mode) == 0o600
    finally:
        stop_head(env, pid)
    assert not (tmp_path / "home" / ".ray").exists(), "the head must not write ~/.ray"


@pytest.mark.timeout(300)
def test_user_token_path_is_used_and_left_untouched(tmp_path):
    import secrets

    user_token = tmp_path / "my_token"
    user_token.write_text(secrets.token_hex(32))
    user_token.chmod(0o400)
    before = (user_token.read_bytes(), user_token.stat().st_mode, user_token.stat().st_mtime_ns)
    env = head_env(tmp_path, RAY_AUTH_TOKEN_PATH=str(user_token))
    start = head("start", env)
    assert start.returncode == 0, start.stdout + start.stderr
    pid = int((tmp_path / "head" / "head.pid").read_text())
    try:
        assert not (tmp_path / "head" / "auth_token").exists(), "a user's token must not be replaced"
        assert exports((tmp_path / "head" / "env.sh").read_text())["RAY_AUTH_TOKEN_PATH"] == str(user_token)
        # a client that only has the user's token file (no env.sh) is let in
        ok = subprocess.run([os.path.join(BIN, "ray"), "job", "list", "--address",
                             f"http://127.0.0.1:{env['RAY_DASHBOARD_PORT']}"],
                            env={**env, "RAY_AUTH_MODE": "token"}, cwd=REPO, capture_output=True, text=True,
                            timeout=120)
        assert ok.returncode == 0, ok.stdout + ok.stderr
    finally:
        stop_head(env, pid)
    assert (user_token.read_bytes(), user_token.stat().st_mode, user_token.stat().st_mtime_ns) == before
    assert not (tmp_path / "head" / "auth_token").exists()


@pytest.mark.timeout(60)
def test_missing_user_token_path_fails_before_starting(tmp_path):
    env = head_env(tmp_path, RAY_AUTH_TOKEN_PATH=str(tmp_path / "nope"))
    start = head("start", env, timeout=30)
    assert start.returncode != 0 and "RAY_AUTH_TOKEN_PATH" in start.stderr, start.stdout + start.stderr
    assert not (tmp_path / "head" / "head.pid").exists() and not (tmp_path / "head" / "auth_token").exists()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_ray_job_submit_against_local_head(tmp_path, tiny_data):
    env = head_env(tmp_path)
    start = head("start", env)
    assert start.returncode == 0, start.stdout + start.stderr
    pid = int((tmp_path / "head" / "head.pid").read_text())
    train = ["python", "jobs/train.py", "--config", "jobs/configs/synth_small.yaml",
             "--set", f"data.path={tiny_data}", "--set", f"tracking.output_dir={tmp_path}/out",
             "--set", "data.batch_size=256", "--set", "train.epochs=1", "--set", "train.max_steps_per_epoch=20",
             # the submission path is under test; the calibrated plan is the e2e and 3-node tests'
             "--set", "planner.calibrate=false"]
    try:
        # no --address: RAY_API_SERVER_ADDRESS from `local_head.sh env` names the head
        sub = as_client(
            [os.path.join(BIN, "ray"), "job", "submit",
             "--submission-id", "rayemb-e2e", "--working-dir", ".", "--", *train],
            env, timeout=900,
        )
        out = sub.stdout + sub.stderr
        assert sub.returncode == 0, out[-4000:]
        status = as_client(
            [sys.executable, "-c", "from ray.job_submission import JobSubmissionClient as C; "
             "print(C().get_job_info('rayemb-e2e').status.value)"],
            env, timeout=120,
        )
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.strip().splitlines()[-1] == "SUCCEEDED", status.stdout + status.stderr
        assert "FINISHED" in out and "valid_auc=" in out
        assert (tmp_path / "out" / "mlflow.db").exists()
        # logs a person can read: no third-party dumps, progress lines from the driver
        for noise in ("SplitTableBatchedEmbeddingBagsCodegen Arguments", "Sharding spec not found"):
            assert noise not in out, noise
        assert re.search(r"rayemb: epoch 1/1 step \d+/20 \(\d+%\) loss \d\.\d{4} \| [\d,]+ samples/s \| ETA \d+", out), out[-4000:]
        assert re.search(r"rayemb: epoch 1/1 done: valid_auc 0\.\d{4} valid_logloss \d\.\d{4} \(best so far\)", out)
        assert re.search(r"rayemb: statistics pass over .*train", out)
        # the job resubmitted (KubeRay's retry of a RayJob, say): the finished job is not trained again
        again = as_client([os.path.join(BIN, "ray"), "job", "submit", "--submission-id", "rayemb-e2e-again",
                           "--working-dir", ".", "--", *train], env, timeout=600)
        assert again.returncode == 0 and "FINISHED already" in again.stdout + again.stderr, again.stdout[-3000:]
        assert "statistics pass" not in again.stdout + again.stderr
    finally:
        stop_head(env, pid)
    assert not (tmp_path / "home" / ".ray").exists(), "the head and its job must not write ~/.ray"
