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

The sweep, on the same cluster once that node is gone: two trials (a grid of two ``train.dense_lr``), FIFO, both
at once (``max_concurrent=2``), each trial's job 1 worker x 2 CPUs. A trial's own Tune process asks 0.01 CPU of
the head; its job's workers' placement group asks the 2 CPUs, which the head (2 CPUs, the trials' processes on
it) cannot give: both jobs' groups wait, the autoscaler lists them as its pending demand and adds a node for
each, both trials finish with their MLflow runs under the sweep's parent, and the idle nodes go away after.

Hermetic: the cluster's HOME, ``--temp-dir`` and ``RAY_TMPDIR`` are a private directory under
/tmp (removed afterwards), no token auth; the driver's HOME and RAY_TMPDIR point into pytest's tmp
folders too. One cluster serves the module (its start is most of a test's time); after its teardown no
process it started is alive.
"""

from __future__ import annotations

import json
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
#: a sweep trial's job: one worker of a whole worker node's CPUs, more than the head has left
SWEEP_WORKER_CPUS = 2.0
SWEEP_LRS = [0.002, 0.004]


def _alive(nodes):
    return [n for n in nodes if n.get("Alive")]


def _wait(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s}s")
        time.sleep(1.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One fake autoscaling cluster for the module's tests, this process its driver; after it is stopped, no
    process it started is alive."""
    import ray

    home = tmp_path_factory.mktemp("autoscale-home")
    # RAYEMB_TEST_KEEP_CLUSTER_DIR=1 keeps the cluster's directory (head.log, t/session_latest/logs/monitor.log)
    cluster = FakeAutoscalingCluster(head_cpus=2, worker_node_types=WORKER_TYPE, idle_timeout_minutes=0.2,
                                     keep_dir=bool(os.environ.get("RAYEMB_TEST_KEEP_CLUSTER_DIR")))
    with pytest.MonkeyPatch.context() as mp:
        for var in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "MLFLOW_TRACKING_URI"):
            mp.delenv(var, raising=False)
        mp.setenv("HOME", str(home))
        # one matplotlib font cache (a job's plan report draws) for this driver and the trials' processes
        mp.setenv("MPLCONFIGDIR", str(home / "matplotlib"))
        if ray.is_initialized():
            ray.shutdown()
        try:
            cluster.start(timeout_s=180)
            mp.setenv("RAY_TMPDIR", cluster.dir)
            cluster.connect(logging_level="WARNING", runtime_env={
                "env_vars": {"PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                             "MPLCONFIGDIR": os.environ["MPLCONFIGDIR"]}})
            yield cluster
        finally:
            if ray.is_initialized():
                ray.shutdown()
            t_stop = time.monotonic()
            # a test's cluster has nothing to flush: a short grace, as a GCS hung in its shutdown waits it out
            cluster.stop(grace_s=2.0)
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


def test_job_needing_more_workers_than_exist_makes_a_node_appear_and_finishes(cluster, tiny_data, tmp_path):
    import ray

    from rayemb.train.driver.trainer import run_training

    samples = []  # (seconds since submit, alive node count) while the job runs
    stop_sampling = threading.Event()
    sampler = None
    try:
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


def _pending_worker_groups():
    """How many placement groups of a sweep job's workers (one bundle of SWEEP_WORKER_CPUS) the autoscaler
    lists as pending demand in its last status (what it adds nodes for)."""
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    try:
        raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
        pg_demand = json.loads(raw)["load_metrics_report"]["pg_demand"] if raw else []
    except Exception:  # noqa: BLE001 - no status yet, or the GCS busy: nothing seen this time
        return 0
    return sum(count for pg, count in pg_demand
               if [b for b, _ in pg["bundles"]] == [{"CPU": SWEEP_WORKER_CPUS}])


def test_sweep_trials_pending_for_cpus_make_nodes_appear_and_finish(cluster, tiny_data, tmp_path):
    """Runs after the job test (its idle node gone): two trials at once whose jobs do not fit the head."""
    import ray
    from mlflow import MlflowClient

    import rayemb
    from rayemb.sweep.engine import TRIAL_DRIVER_CPUS, autoscaler_max_resources
    from rayemb.tracking.tags import TAG_KIND, TAG_PARENT_RUN_ID

    _wait(lambda: len(_alive(ray.nodes())) == 1, NODE_GONE_TIMEOUT_S, "a head alone before the sweep")
    # the v1 autoscaler publishes no limit: the default would count the head alone, max_concurrent asks for 2
    assert autoscaler_max_resources() is None
    head_id = _alive(ray.nodes())[0]["NodeID"]
    groups_before = set(ray.util.placement_group_table())
    samples = []  # (seconds since the sweep started, alive nodes, pending worker groups the autoscaler lists)
    stop_sampling = threading.Event()

    def sample():
        while not stop_sampling.is_set():
            samples.append((time.monotonic() - t_start, len(cluster.alive_nodes(timeout_s=5)),
                            _pending_worker_groups()))
            cluster.processes()  # records the processes the trials' nodes start
            stop_sampling.wait(1.0)

    t_start = time.monotonic()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = rayemb.run_sweep(
            "jobs/configs/synth_small.yaml", {"train.dense_lr": {"grid": SWEEP_LRS}}, scheduler="fifo",
            max_concurrent=2, name="grow", overrides=[
                f"data.path={tiny_data}", f"tracking.output_dir={tmp_path}/out", "tracking.experiment=grow",
                "data.batch_size=256", "train.epochs=1", "train.max_steps_per_epoch=10",
                "train.log_every_n_steps=5", "scaling.num_workers=1", f"scaling.cpus_per_worker={SWEEP_WORKER_CPUS}",
                "planner.calibrate=false", "planner.probe_steps=0", "scaling.max_failures=1"])
    finally:
        stop_sampling.set()
        sampler.join(timeout=15)
    sweep_s = time.monotonic() - t_start
    groups = {pg: t for pg, t in ray.util.placement_group_table().items() if pg not in groups_before}
    grew_at = next((t for t, n, _ in samples if n >= 2), None)
    print(f"sweep: {[(t['status'], t['value']) for t in result.trials]} in {sweep_s:.1f}s, most alive nodes "
          f"{max(n for _, n, _ in samples)} (a second at {grew_at}s), most pending worker groups the autoscaler "
          f"listed {max(p for _, _, p in samples)}", flush=True)

    # both trials finished, each its job's workers on a node the autoscaler added
    assert [t["status"] for t in result.trials] == ["FINISHED", "FINISHED"], result.trials
    assert all(t["value"] is not None and 0.0 < t["value"] <= 1.0 for t in result.trials), result.trials
    assert max(p for _, _, p in samples) >= 1, samples  # the jobs' pending groups reached the autoscaler
    assert max(n for _, n, _ in samples) >= 2, samples  # ... which added nodes while the trials waited
    # each trial's own process asked the head for almost nothing; its job's workers for their ScalingConfig
    trial_groups = [t for t in groups.values() if t["bundles"] == {0: {"CPU": TRIAL_DRIVER_CPUS}}]
    worker_groups = [t for t in groups.values() if t["bundles"] == {0: {"CPU": SWEEP_WORKER_CPUS}}]
    assert len(trial_groups) == 2 and len(worker_groups) == 2, groups
    assert all(set(t["bundles_to_node_id"].values()) == {head_id} for t in trial_groups), trial_groups
    assert all(head_id not in t["bundles_to_node_id"].values() for t in worker_groups), (head_id, worker_groups)

    # one parent run, a FINISHED child run with valid_auc per trial
    client = MlflowClient(result.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("grow").experiment_id])
    parents = [r for r in runs if r.data.tags.get(TAG_KIND) == "sweep"]
    children = [r for r in runs if r.data.tags.get(TAG_PARENT_RUN_ID) == result.parent_run_id]
    assert [p.info.run_id for p in parents] == [result.parent_run_id], runs
    assert parents[0].data.params["sweep.max_concurrent"] == "2"
    assert len(runs) == 3 and len(children) == 2, runs
    assert sorted(float(c.data.params["train.dense_lr"]) for c in children) == SWEEP_LRS
    assert all(c.info.status == "FINISHED" and "valid_auc" in c.data.metrics for c in children), children

    # ... and once the sweep is done, its idle nodes are removed again
    t_done = time.monotonic()
    _wait(lambda: len(_alive(ray.nodes())) == 1, NODE_GONE_TIMEOUT_S, "the idle nodes' removal after the sweep")
    print(f"the idle nodes were removed {time.monotonic() - t_done:.1f}s after the sweep ended", flush=True)
