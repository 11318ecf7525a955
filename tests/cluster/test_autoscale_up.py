"""A job that asks for more workers than the cluster has makes the Ray autoscaler add a node, and finishes.

The cluster is Ray's fake multi-node autoscaler (``cluster.fake_autoscaler``: a head started by
``ray start --head --block --autoscaling-config=...`` in its own session, stopped by its process
group and process tree, never ``ray stop``): a 2-CPU head and a node type ``cpu_worker``
({"CPU": 2}, 0 to 2 nodes) that the autoscaler starts when demand does not fit.

The job: 2 workers x 1 CPU, STRICT_SPREAD, submitted while only the head exists. rayemb plans for
the 2 workers it asked for (its "do not fit the live nodes" warning says the cluster must grow),
Ray Train's placement group waits, the autoscaler adds a node, the workers' group is placed on the
head and that new node, and the job finishes and learns (valid AUC > 0.6). The head keeps a CPU for
Ray Data's read tasks (1 of its 2 CPUs goes to a worker); Ray Data's queued read tasks often make
the autoscaler add the second allowed node as well. Once the job is done the idle nodes go away
again (``idle_timeout_minutes``).

Hermetic: the cluster's HOME, ``--temp-dir`` and ``RAY_TMPDIR`` are a private directory under
/tmp (removed afterwards), no token auth; the driver's HOME and RAY_TMPDIR point into tmp_path too.
After teardown no process the cluster started is alive.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from cluster.fake_autoscaler import FakeAutoscalingCluster  # noqa: E402

NODE_GONE_TIMEOUT_S = 180
WORKER_TYPE = {"cpu_worker": {"resources": {"CPU": 2, "object_store_memory": 300 * 2**20},
                              "min_workers": 0, "max_workers": 2}}


def _alive(nodes):
    return [n for n in nodes if n.get("Alive")]


def _wait(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s}s")
        time.sleep(1.0)


def test_job_needing_more_workers_than_exist_makes_a_node_appear_and_finishes(tiny_data, tmp_path, monkeypatch):
    import ray

    from rayemb.train.driver.trainer import run_training

    for var in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    os.makedirs(tmp_path / "home")
    if ray.is_initialized():
        ray.shutdown()

    # RAYEMB_TEST_KEEP_CLUSTER_DIR=1 keeps the cluster's directory (head.log, t/session_latest/logs/monitor.log)
    cluster = FakeAutoscalingCluster(head_cpus=2, worker_node_types=WORKER_TYPE, idle_timeout_minutes=0.2,
                                     keep_dir=bool(os.environ.get("RAYEMB_TEST_KEEP_CLUSTER_DIR")))
    samples = []  # (seconds since submit, alive node count) while the job runs
    stop_sampling = threading.Event()
    sampler = None
    try:
        cluster.start(timeout_s=180)
        monkeypatch.setenv("RAY_TMPDIR", cluster.dir)
        cluster.connect(logging_level="WARNING", runtime_env={
            "env_vars": {"PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}})
        start_nodes = _alive(ray.nodes())
        assert len(start_nodes) == 1, start_nodes
        assert ray.cluster_resources().get("CPU") == 2.0, ray.cluster_resources()

        # the job: 2 workers x 1 CPU, one per node, on a 1-node cluster
        before = ray.nodes()
        assert len(_alive(before)) == 1
        cfg = load_config("jobs/configs/synth_small.yaml", [
            f"data.path={tiny_data}", f"tracking.output_dir={tmp_path}/out", "data.batch_size=256",
            "train.epochs=1", "train.max_steps_per_epoch=30", "scaling.num_workers=2", "scaling.cpus_per_worker=1",
            "scaling.placement_strategy=STRICT_SPREAD", "planner.calibrate=false", "train.log_every_n_steps=10",
            "scaling.max_failures=1"])

        t_submit = time.monotonic()

        def sample():
            while not stop_sampling.is_set():
                samples.append((time.monotonic() - t_submit, len(cluster.alive_nodes(timeout_s=5))))
                cluster.processes()  # records the processes the job's nodes start
                stop_sampling.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        result = run_training(cfg)
        job_s = time.monotonic() - t_submit
        stop_sampling.set()
        sampler.join(timeout=10)
        after = ray.nodes()
        # Ray Train's worker group: its STRICT_SPREAD bundles on the head and on a node that was not there
        before_ids = {n["NodeID"] for n in before}
        spans = [set(t["bundles_to_node_id"].values()) for pid, t in ray.util.placement_group_table().items()
                 if t["strategy"] == "STRICT_SPREAD" and len(t["bundles"]) == 2]

        grew_at = next((t for t, n in samples if n >= 2), None)
        print(f"job: {result.status} in {job_s:.1f}s, second node alive at {grew_at}s after submit, "
              f"valid_auc {result.metrics.get('valid_auc')}, nodes registered {len(before)} -> {len(after)}",
              flush=True)
        assert result.status == "FINISHED", result
        assert len(after) > len(before), (before, after)  # a node registered during the job
        assert max(n for _, n in samples) >= 2, samples  # ... and was alive next to the head
        assert any(len(nodes) == 2 and nodes - before_ids for nodes in spans), (spans, before_ids)
        assert result.metrics["valid_auc"] > 0.6, result.metrics
        # ... and once the job is done, the idle node is removed again
        t_done = time.monotonic()
        _wait(lambda: len(_alive(ray.nodes())) == 1, NODE_GONE_TIMEOUT_S, "the idle node's removal after the job")
        print(f"the idle node was removed {time.monotonic() - t_done:.1f}s after the job ended", flush=True)
    finally:
        stop_sampling.set()
        if sampler is not None:
            sampler.join(timeout=15)
        if ray.is_initialized():
            ray.shutdown()
        t_stop = time.monotonic()
        cluster.stop()
        print(f"teardown: {time.monotonic() - t_stop:.1f}s, {len(cluster.recorded)} cluster processes recorded, "
              f"{len(cluster.sigkilled)} needed SIGKILL: {cluster.sigkilled}", flush=True)

    # nothing the cluster started is left (stop() raises if something is; checked here once more)
    seen = cluster.recorded
    assert len(seen) > 5, seen  # the head, its GCS, raylet, autoscaler, ... and the job's nodes
    assert cluster.processes() == []
    import psutil  # vendored by Ray (imported above)

    alive = []
    for pid, created in seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                alive.append((pid, p.cmdline()))
        except psutil.Error:
            continue
    assert not alive, alive
