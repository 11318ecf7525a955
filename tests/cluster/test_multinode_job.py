"""The default job across 3 emulated nodes (shaped links, token auth) matches a one-node run's AUC.

The nodes do not export GLOO_SOCKET_IFNAME: inside a namespace the host name
resolves to 127.0.0.1, so gloo would bind loopback and the first collective
across nodes would wait forever. rayemb's RayembTorchConfig (and the
calibration actors) pin each rank to its node's Ray interface; this test
fails without it.
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from cluster.emulate import EmulatedCluster, EmulateError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _can_emulate() -> str:
    import shutil

    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "needs iproute2 (ip, tc)"
    return ""


def _overrides(data: str, out: str, workers: int):
    return [f"data.path={data}", f"tracking.output_dir={out}", "data.batch_size=256", "train.epochs=2",
            "train.early_stopping_patience=null", f"scaling.num_workers={workers}", "train.log_every_n_steps=10"]


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


@pytest.mark.skipif(bool(_can_emulate()), reason=_can_emulate() or "ok")
def test_default_job_on_three_nodes_matches_one_node(tiny_data, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "GLOO_SOCKET_IFNAME",
                        "NCCL_SOCKET_IFNAME", "MLFLOW_TRACKING_URI")}
    env["HOME"] = str(tmp_path / "home")
    os.makedirs(env["HOME"])

    # one node: a private local Ray, 3 workers sharing its CPUs
    one, _ = _train(lambda c: c, env, tiny_data, str(tmp_path / "one"), 3)
    assert one["status"] == "FINISHED"

    state = tempfile.mkdtemp(prefix="emj-", dir=str(tmp_path))
    cluster = None
    for suffix in ("", "b", "c"):  # another cluster on this machine may hold the derived subnet
        cluster = EmulatedCluster(f"emujob-{os.getpid()}{suffix}", nodes=3, cpus_per_node=2, bandwidth_mbit=200,
                                  state_dir=state, gloo_ifname=False)
        try:
            cluster.up()
            break
        except EmulateError as e:
            if "overlaps" not in str(e) or suffix == "c":
                raise
    try:
        # one worker per node (SPREAD), each node keeps a CPU for Ray Data; outputs on a path all nodes reach
        multi, out = _train(cluster.exec_argv, env, tiny_data, str(cluster.shared_dir / "job"), 3,
                            ["scaling.placement_strategy=SPREAD", "scaling.cpus_per_worker=1"])
    finally:
        cluster.down()
    assert multi["status"] == "FINISHED"
    assert "rayemb: calibrated" in out  # the step-time model was measured across the nodes
    # one split table, the final one: across nodes the hot sets come from the calibrated break-even
    assert out.count("rayemb: frequent-category split (") == 1, out[-4000:]
    assert "rayemb: frequent-category split (calibrated threshold" in out
    auc_one, auc_multi = one["metrics"]["best_valid_auc"], multi["metrics"]["best_valid_auc"]
    assert auc_one > 0.7
    assert abs(auc_multi - auc_one) <= 0.01, (auc_one, auc_multi)
    # every collective crossed the shaped links: the run counted bytes for them
    assert multi["metrics"]["bytes_per_step.total"] > 0
