"""The default job across 3 emulated nodes (shaped links, token auth) learns as on one node, and
``rayemb predict`` of its exported model, scored on the other nodes, brings every row back to the driver.

The nodes do not export GLOO_SOCKET_IFNAME: inside a namespace the host name
resolves to 127.0.0.1, so gloo would bind loopback and the first collective
across nodes would wait forever. rayemb's RayembTorchConfig (and the
calibration actors) pin each rank to its node's Ray interface; this test
fails without it.

The nodes other than the head have a node-local directory of their own (as
the machines of a real cluster have their own disks): the predictions go
there, so output written by a scoring actor on its node is lost to the driver.
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest
from _emulated import HOLD_HEAD_CPUS, down, needs_emulation, up_cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _overrides(data: str, out: str, workers: int):
    return [f"data.path={data}", f"tracking.output_dir={out}", "data.batch_size=256", "train.epochs=1",
            f"scaling.num_workers={workers}", "train.log_every_n_steps=10"]


#: in the head's namespace: export the run's model, hold the head's CPUs (so Ray Data's scoring actors and tasks
#: run on the other nodes), then `rayemb predict`; prints where the scoring actors ran
_PREDICT_DRIVER = r"""
import json, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from ray.util.state import list_actors
from rayemb._ray import init_ray
from rayemb.cli import main

export, predict = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert main(export) == 0
init_ray()
""" + HOLD_HEAD_CPUS + r"""code = main(predict)
scorers = [a.node_id for a in list_actors(limit=1000) if "_Scorer" in a.class_name and a.node_id]  # placed
print("PREDICT=" + json.dumps({"code": code, "head": head, "scorers": scorers}), flush=True)
"""


def _predict_on_cluster(cluster, env, run, tiny_data, model, preds):
    """Exports ``run``'s best checkpoint to ``model`` and scores ``tiny_data``'s valid split into ``preds``."""
    export = ["export", "--run-id", run["run_id"], "--tracking-uri", run["tracking_uri"], "--out", model]
    predict = ["predict", "--model", model, "--data", os.path.join(tiny_data, "valid"), "--out", preds,
               "--num-workers", "2", "--keep-columns", "C1"]
    proc = subprocess.run(cluster.exec_argv([sys.executable, "-c", _PREDICT_DRIVER, json.dumps(export),
                                             json.dumps(predict)]),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PREDICT=")]
    why = f"predict driver failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0 and lines, why
    scored = json.loads(lines[-1][len("PREDICT="):])
    assert scored["code"] == 0, why
    return scored


def _train(argv_wrap, env, data, out, workers, extra=()):
    result = os.path.join(out, "result.json")
    cmd = [sys.executable, "-m", "rayemb", "train", "--config", os.path.join(REPO, "jobs/configs/synth_small.yaml"),
           "--result-json", result]
    for o in _overrides(data, out, workers) + list(extra):
        cmd += ["--set", o]
    proc = subprocess.run(argv_wrap(cmd), cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"rayemb train failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    with open(result) as f:
        return json.load(f), proc.stdout


@needs_emulation
def test_default_job_on_three_nodes_learns_and_predicts_from_every_node(tiny_data, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "GLOO_SOCKET_IFNAME",
                        "NCCL_SOCKET_IFNAME", "MLFLOW_TRACKING_URI")}
    env["HOME"] = str(tmp_path / "home")
    os.makedirs(env["HOME"])

    state = tempfile.mkdtemp(prefix="emj-", dir=str(tmp_path))
    node_local = tmp_path / "node_local"
    cluster = up_cluster("emujob", nodes=3, cpus_per_node=2, bandwidth_mbit=200, state_dir=state, gloo_ifname=False,
                         node_local_dirs=[str(node_local)])
    try:
        # one worker per node (SPREAD), each node keeps a CPU for Ray Data; outputs on a path all nodes reach
        multi, out = _train(cluster.exec_argv, env, tiny_data, str(cluster.shared_dir / "job"), 3,
                            ["scaling.placement_strategy=SPREAD", "scaling.cpus_per_worker=1",
                             # the probe's rank actors are the calibration's (run_on_ranks), measured across the
                             # nodes here; the probe's choice is tests/ray/test_plan_probe.py's
                             "planner.probe_steps=0"])
        assert multi["status"] == "FINISHED"
        model, preds = str(cluster.shared_dir / "model"), str(node_local / "preds")
        scored = _predict_on_cluster(cluster, env, multi, tiny_data, model, preds)
    finally:
        down(cluster)
    assert "rayemb: calibrated" in out  # the step-time model was measured across the nodes
    # one split table, the final one: across nodes the hot sets come from the calibrated break-even
    assert out.count("rayemb: frequent-category split (") == 1, out[-4000:]
    assert "rayemb: frequent-category split (calibrated threshold" in out
    # the same model as on one node: training across ranks equals one process's training on the global batch to
    # 1e-5 for every plan and world size (tests/dist/test_hybrid_equivalence.py); here it must learn as the
    # default job does on one node
    assert multi["metrics"]["best_valid_auc"] > 0.7, multi["metrics"]
    # every collective crossed the shaped links: the run counted bytes for them
    assert multi["metrics"]["bytes_per_step.total"] > 0

    # the scoring actors ran on the other nodes only, yet every row came back, in order, scored as the model does
    assert scored["scorers"] and scored["head"] not in scored["scorers"], scored
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayemb.serve.model import InferenceModel

    files = sorted(node_local.joinpath("preds").glob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f) for f in files])
    valid = pq.read_table(os.path.join(tiny_data, "valid"))
    assert table.num_rows == valid.num_rows == 4000 and table.column_names == ["prediction", "label", "C1"]
    assert table.column("label").equals(valid.column("label")) and table.column("C1").equals(valid.column("C1"))
    np.testing.assert_allclose(table.column("prediction").to_numpy(), InferenceModel.load(model).predict(valid),
                               rtol=0, atol=1e-6)
    assert sorted(p.name for p in node_local.iterdir()) == ["preds"]  # no staging directory left
