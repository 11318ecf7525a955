"""A job survives losing its head node: every process of the head SIGKILLed mid-epoch, a new head started, the
same job submitted again continues the run from the newest checkpoint the lost attempt completed.

Two emulated nodes (head + 1 worker, 2 CPUs each, one rank per node). The job is submitted from the host with
``ray job submit`` to the head's dashboard under a fixed submission id, as KubeRay's RayJob submitter does, so
its driver runs on the head node. Once a checkpoint in the middle of the second epoch is complete, the head's
namespace loses every process at once (driver, GCS, raylet, dashboard, workers); the worker node's Ray, whose
GCS is gone, is killed too, and both nodes start again: a new head with an empty GCS. Then the same
``ray job submit`` again.

The driver's job record and the checkpoints live in ``tracking.output_dir``: a folder every node shares, or
``s3://`` on moto's S3 server, bound to the bridge address the nodes reach the host on (its credentials reach the
nodes through their environment, never through the job's runtime_env, whose values Ray logs). The head's own
disk (``$RAYEMB_WORKSPACE``) is lost with it. With a shared output folder the MLflow store lives there and the
second attempt continues the same MLflow run; with ``s3://`` it lived on the lost disk, and the second attempt
logs a new run in the new head's store.

Inside the namespaces the host name is the machine's and the PIDs are the machine's, so the second driver
sees that the first one's PID is dead and takes the job over at once (no lease to wait out).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _emulated import cannot_emulate, down, kill_node, needs_emulation

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cluster.emulate import EmulatedCluster, EmulateError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

NAME = "headloss"
BUCKET = "rayemb-headloss"
#: steps per epoch (2 epochs), the checkpoint interval, the logging interval
STEPS, EVERY, LOG_EVERY = 50, 10, 5
#: the head is killed once a checkpoint at this step or later is complete: 20 steps into the second epoch
KILL_FROM = STEPS + 20
LAST = 2 * STEPS
RAY = str(Path(sys.executable).parent / "ray")




def _free_port() -> int:
    """A port free on every address (the bridge's does not exist yet when the nodes' environment is made)."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _submit_argv(data: str, out: str, result_json: Path, head_disk: Path, name: str):
    """The job's `ray job submit`: the same argv for the first submission and the one after the head loss."""
    train = [sys.executable, str(REPO / "jobs" / "train.py"), "--config", str(REPO / "jobs/configs/synth_small.yaml"),
             "--result-json", str(result_json)]
    for o in (f"data.path={data}", f"tracking.output_dir={out}", f"name={name}", "tracking.experiment=headloss",
              "data.batch_size=64", "train.epochs=2", f"train.max_steps_per_epoch={STEPS}",
              f"train.checkpoint_every_n_steps={EVERY}", f"train.log_every_n_steps={LOG_EVERY}",
              "train.early_stopping_patience=null", "planner.calibrate=false", "planner.probe_steps=0",
              "model.embedding_dim=8", "model.bottom_mlp=[16,8]", "model.top_mlp=[16,1]",
              "scaling.num_workers=2", "scaling.cpus_per_worker=1", "scaling.placement_strategy=SPREAD"):
        train += ["--set", o]
    runtime_env = {"env_vars": {"RAYEMB_WORKSPACE": str(head_disk)}}  # the head's own disk: MLflow's local side
    return [RAY, "job", "submit", "--submission-id", name, "--runtime-env-json", json.dumps(runtime_env), "--",
            *train]


def _client_env(cluster: EmulatedCluster):
    """This (host) process's environment for the `ray job` CLI of the cluster, through the bridge."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "MLFLOW_TRACKING_URI")}
    env.update(cluster.env())
    return env


def _newest_intact(root: str, at_least: int = 0):
    """(path, meta) of the newest checkpoint under ``root`` whose files are all there, at or after a step."""
    from rayemb import storage
    from rayemb.checkpoint.reader import checkpoints_newest_first, verify
    from rayemb.errors import DataError

    if not storage.isdir(root):
        return None
    for path in checkpoints_newest_first(root):
        try:
            meta = verify(path, hashes=False)
        except DataError:
            continue
        return (path, meta) if int(meta["step"]) >= at_least else None
    return None


def _head_logs(cluster: EmulatedCluster) -> str:
    """The lost head's job driver logs (its Ray temp dir stays on this machine's disk), for failure messages."""
    logs = sorted(Path(cluster.node_tmp(0)).glob("session_*/logs/job-driver-*.log"))
    return "\n".join(f"== {p}\n{p.read_text(errors='replace')[-3000:]}" for p in logs[-2:])


def _train_steps(tracking_uri: str, run_id: str):
    from mlflow import MlflowClient

    history = MlflowClient(tracking_uri).get_metric_history(run_id, "train_loss")
    return [m.step for m in sorted(history, key=lambda m: m.timestamp)]


def _nodes_up(cluster: EmulatedCluster, state: dict) -> None:
    """Both nodes running (a new head, its worker joined) where an earlier test stopped before starting them."""
    if not state["up"]:
        for k in (0, 1):
            kill_node(cluster, k)
        cluster.start_node(0)
        cluster.start_node(1)
        state["up"] = True


@pytest.fixture(scope="module")
def head_loss_cluster(tmp_path_factory):
    """(cluster, S3 server, {"up": whether both nodes run}) shared by both variants: bringing a cluster up and
    down is most of what a variant would add. Every node, from its first start on, has the S3 server's address and
    credentials in its environment (EmulatedCluster.node_env reads this process's); the server binds the bridge's
    address once it exists."""
    from _servers import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, MotoS3Server

    if cannot_emulate():
        pytest.skip(cannot_emulate())
    tmp, s3_port = tmp_path_factory.mktemp("headloss"), _free_port()
    cluster, server = None, None
    with pytest.MonkeyPatch.context() as mp:
        try:
            for suffix in ("", "b", "c"):  # another cluster on this machine may hold the derived subnet
                cluster = EmulatedCluster(f"headloss-{os.getpid()}{suffix}", nodes=2, cpus_per_node=2,
                                          bandwidth_mbit=200, state_dir=str(tmp / f"emu{suffix}"), gloo_ifname=False)
                for k, v in {"AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_ACCESS_KEY,
                             "AWS_DEFAULT_REGION": "us-east-1",
                             "AWS_ENDPOINT_URL": f"http://{cluster.bridge_ip}:{s3_port}",
                             "AWS_EC2_METADATA_DISABLED": "true"}.items():
                    mp.setenv(k, v)
                try:
                    cluster.up()
                    break
                except EmulateError as e:
                    if "overlaps" not in str(e) or suffix == "c":
                        raise
            server = MotoS3Server(host=cluster.bridge_ip, port=s3_port).start()
            assert server.env["AWS_ENDPOINT_URL"] == os.environ["AWS_ENDPOINT_URL"]
            server.create_bucket(BUCKET)
            yield cluster, server, {"up": True}
        finally:
            try:
                if cluster is not None:
                    down(cluster)
            finally:
                if server is not None:
                    server.stop()


@needs_emulation
@pytest.mark.parametrize("where", ["shared", "s3"])
def test_job_survives_losing_its_head_node(where, head_loss_cluster, tiny_data, tmp_path, monkeypatch):
    from _servers import FAKE_SECRET_ACCESS_KEY
    from mlflow import MlflowClient

    from rayemb import storage
    from rayemb.checkpoint.reader import verify
    from rayemb.train.driver.job_record import read_record

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cluster, server, nodes = head_loss_cluster
    first = None
    name = f"{NAME}-{where}"  # one submission id per job on the shared cluster, as Ray requires
    head_disk = tmp_path / "head-disk"
    result_json = tmp_path / "result.json"
    out = f"s3://{BUCKET}/runs" if where == "s3" else str(tmp_path / "shared" / "runs")

    try:
        _nodes_up(cluster, nodes)
        env = _client_env(cluster)
        argv = _submit_argv(tiny_data, out, result_json, head_disk, name)

        # ---- attempt 1: submitted, its logs tailed (as KubeRay's submitter does) until the head is lost
        log = tmp_path / "first-submit.log"
        with open(log, "w") as f:
            first = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline, seen = time.monotonic() + 900, None
        while time.monotonic() < deadline and first.poll() is None:
            rec = read_record(out, name)
            if rec is not None:
                seen = _newest_intact(storage.join(out, "ray_results", rec.job_id), KILL_FROM)
                if seen:
                    break
            time.sleep(0.5)
        assert seen, (first.poll(), log.read_text()[-4000:], _head_logs(cluster))
        nodes["up"] = False
        killed = kill_node(cluster, 0)  # the head: every process in its namespace, the job's driver among them
        kill_node(cluster, 1)  # its raylet and workers belong to a GCS that is gone
        assert killed
        first.wait(timeout=120)  # the submitter loses the dashboard and gives up

        rec = read_record(out, name)
        assert (rec.status, rec.attempt) == ("RUNNING", 1) and rec.run_id, rec
        assert rec.pid in killed and rec.host == socket.gethostname(), rec  # same host name inside the namespace
        root = storage.join(out, "ray_results", rec.job_id)
        newest, meta = _newest_intact(root)
        done = int(meta["step"])
        assert int(seen[1]["step"]) <= done < LAST and not meta.get("epoch_complete", False), meta
        if where == "shared":
            first_store = f"sqlite:///{Path(out) / 'mlflow.db'}"
        else:  # read from a copy: this process would keep reading the removed file through MLflow's cached engine
            for f in (head_disk / "runs").glob("mlflow.db*"):  # with a journal the killed driver may have left
                shutil.copy(f, tmp_path / f.name.replace("mlflow.db", "lost-head-mlflow.db"))
            first_store = f"sqlite:///{tmp_path / 'lost-head-mlflow.db'}"
        first_steps = _train_steps(first_store, rec.run_id)
        if head_disk.exists():
            shutil.rmtree(head_disk)  # the head's own disk goes with it

        # ---- a new head, the same submission
        cluster.start_node(0)
        cluster.start_node(1)
        nodes["up"] = True
        second = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
        why = (second.returncode, second.stdout[-5000:], second.stderr[-3000:])
        assert second.returncode == 0 and f"Job '{name}' succeeded" in second.stdout, why

        # ---- the job, continued: same run folder, attempt 2, from the newest checkpoint attempt 1 completed
        m = re.search(rf"attempt 2 of run {re.escape(rec.job_id)} continues from checkpoint (\S+) "
                      r"\(epoch (\d+), step (\d+)\)", second.stdout)
        assert m, why
        assert (m.group(1).rstrip("/").rsplit("/", 1)[-1], int(m.group(3))) == \
            (newest.rstrip("/").rsplit("/", 1)[-1], done), (m.group(0), newest, done)
        result = json.loads(result_json.read_text())
        assert result["status"] == "FINISHED", result
        after = read_record(out, name)
        assert (after.status, after.attempt, after.job_id) == ("FINISHED", 2, rec.job_id), after
        assert [a.get("ended") for a in after.attempts] == [None, "FINISHED"], after.attempts
        assert result["last_checkpoint"].startswith(root) and _newest_intact(root)[0] == result["last_checkpoint"]
        last = verify(result["last_checkpoint"])
        assert (last["step"], last["epoch"], last["epoch_complete"], last["world_size"]) == (LAST, 1, True, 2), last
        assert FAKE_SECRET_ACCESS_KEY not in second.stdout + second.stderr

        # ---- MLflow: nothing lost beyond one checkpoint interval
        # attempt 1's last logged step (its MLflow points trail its training: it may lie before the checkpoint)
        # is within one interval of the checkpoint attempt 2 continued from
        assert first_steps and first_steps[-1] <= done + EVERY + LOG_EVERY, (done, first_steps)
        if where == "shared":  # the store outlived the head: the same run continues, each step logged once
            assert after.run_id == rec.run_id == result["run_id"]
            steps = _train_steps(first_store, rec.run_id)
            assert steps == sorted(set(steps)) and steps[-1] == LAST, steps
            assert steps[:len(first_steps)] == first_steps, (first_steps, steps)
            # attempt 1's points without a hole, then every point after the checkpoint attempt 2 continued from:
            # the only hole is what attempt 1 trained before that checkpoint but had not logged when it died (its
            # driver's MLflow writes trail its training, the more so on a loaded machine)
            assert first_steps == list(range(LOG_EVERY, first_steps[-1] + 1, LOG_EVERY)), first_steps
            first_point = (done // LOG_EVERY + 1) * LOG_EVERY
            assert [s for s in steps if s > done] == list(range(first_point, LAST + 1, LOG_EVERY)), (done, steps)
            client = MlflowClient(first_store)
            run = client.get_run(rec.run_id)
            assert run.info.status == "FINISHED" and run.data.tags["rayemb.attempt"] == "2"
            attempts = sorted((m.step, m.value) for m in client.get_metric_history(rec.run_id, "attempt"))
            assert attempts == [(0, 1.0), (done, 2.0)], attempts
        else:  # the store was on the lost disk: a new run in the new head's store, from the checkpoint on
            store = f"sqlite:///{head_disk / 'runs' / 'mlflow.db'}"
            assert after.run_id == result["run_id"] != rec.run_id, (after.run_id, rec.run_id, result["run_id"])
            steps = _train_steps(store, result["run_id"])
            assert steps == sorted(set(steps)) and done < steps[0] <= done + LOG_EVERY and steps[-1] == LAST, \
                (done, steps)
            client = MlflowClient(store)
            assert client.get_run(after.run_id).data.tags["rayemb.attempt"] == "2"
            assert [(m.step, m.value) for m in client.get_metric_history(after.run_id, "attempt")] == [(done, 2.0)]
            assert server.keys(BUCKET, f"runs/ray_results/{rec.job_id}/"), "no checkpoint in the bucket"
    finally:
        if first is not None and first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
