"""An elastic job (``scaling.num_workers: [1, 2]``) loses a whole Ray node mid-run and finishes on one worker.

Two Ray nodes on 127.0.0.1 (``ray.cluster_utils.Cluster``: processes started and stopped by their
handles), 3 CPUs each, one 2-CPU worker per node, one CPU per node left to Ray Data. (Ray Train
restarts an elastic group with as many workers as fit: with 1-CPU workers both fitted on the head
after the loss and Ray Data starved — rayemb said so within 90 s.) Once the job has written a checkpoint,
the test removes the second node (its raylet and workers die). Ray Train restarts the group with
the one worker the cluster can still grant; that worker takes the plan made for 1 rank (another
hot set and placement), loads the 2-rank logical checkpoint re-partitioned, skips the samples of
the epoch already trained, and finishes.
"""

from __future__ import annotations

import glob
import json
import os
import threading
import time

import pytest

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def two_node_cluster():
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=3)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}})
    try:
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_elastic_job_survives_losing_a_node(two_node_cluster, tiny_data, tmp_path, monkeypatch):
    from rayemb.checkpoint.reader import verify
    from rayemb.errors import DataError
    from rayemb.train.driver.trainer import run_training

    # Right after the loss Ray still counts the lost node's CPUs, so Ray Train first tries 2 workers again and
    # waits out its group start timeout (60 s by default) before it shrinks to 1: a shorter wait, same path.
    # A group starts here in ~12 s; Ray Train passes the variable from this driver to its controller.
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "30")

    cluster, worker = two_node_cluster
    out = str(tmp_path / "out")
    cfg = load_config("jobs/configs/synth_small.yaml", [
        f"data.path={tiny_data}", f"tracking.output_dir={out}", "data.batch_size=256", "train.epochs=1",
        "scaling.num_workers=[1, 2]", "scaling.cpus_per_worker=2",
        "scaling.placement_strategy=SPREAD", "scaling.max_failures=3", "train.log_every_n_steps=10",
        "train.checkpoint_every_n_steps=10", "planner.calibrate=false", "data.in_memory=true"])
    removed = []

    def complete(meta_path: str) -> bool:
        """Every rank's files are in place: ranks persist their parts of a checkpoint each on its own, so
        rank 0's meta.json can be there before another rank's file is (a node lost then leaves it partial)."""
        try:
            verify(os.path.dirname(meta_path), hashes=False)
            return True
        except DataError:
            return False

    def remove_node_after_a_checkpoint():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            steps = [json.load(open(m))["step"]
                     for m in glob.glob(os.path.join(out, "ray_results", "*", "checkpoint_*", "meta.json"))
                     if complete(m)]
            if steps and max(steps) >= 10:
                cluster.remove_node(worker)
                removed.append(max(steps))
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=remove_node_after_a_checkpoint, daemon=True)
    watcher.start()
    result = run_training(cfg)
    watcher.join(timeout=5)
    assert removed, "the node was never removed"
    assert result.status == "FINISHED"
    end = [r for r in result.reports if r.get("epoch_end")]
    seen = [(r.get("step"), r.get("epoch_end"), r.get("world_size"), r.get("resumed_at_step"))
            for r in result.reports]
    assert len(end) == 1 and end[0]["world_size"] == 1, (removed, seen)  # finished on the one worker left
    assert end[0]["resumed_at_step"] >= 10, (removed, seen)  # from a 2-rank checkpoint, not from scratch
    meta = json.load(open(os.path.join(result.last_checkpoint, "meta.json")))
    assert meta["world_size"] == 1 and meta["epoch_complete"]
    assert result.metrics["valid_auc"] > 0.6, result.metrics
