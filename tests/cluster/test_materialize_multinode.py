"""``EmbeddingTrainer(datasets={...})`` on 2 emulated nodes: rows of blocks produced on the other node reach the
driver's dataset folder, every one, in order.

The node that is not the head has a node-local directory of its own (a tmpfs only it sees, as a real cluster's
machines have their own disks; see ``EmulatedCluster(node_local_dirs=...)``), and the dataset folder is written
there. The driver holds the head's CPU, so Ray Data runs every task of the datasets (the caller's preprocessing,
and any write task) on the other node: a parquet file written by such a task lands on that node's tmpfs, which
the driver, the job's workers and this test never see.
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


pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TRAIN_ROWS, VALID_ROWS = 3_000, 1_000




#: in the head's namespace: hold the head's CPU (every Ray Data task then runs on the other node), build the
#: datasets with a preprocessing step that records the node it ran on, and write them with write_dataset_folder
_DRIVER = r"""
import json, sys
import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rayemb._ray import init_ray
from rayemb.data.materialize import write_dataset_folder

folder, train_rows, valid_rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
init_ray()
""" + HOLD_HEAD_CPUS + r"""
def preprocess(batch):
    ids = batch["id"]
    node = ray.get_runtime_context().get_node_id()
    return {"id": ids, "label": (ids % 2).astype("float32"), "I1": ids.astype("float32"), "C1": ids % 10,
            "node": np.full(len(ids), node)}

schema = {"label": "label", "dense": ["I1"], "sparse": [{"name": "C1", "num_embeddings": 10}]}
datasets = {"train": ray.data.range(train_rows, override_num_blocks=6).map_batches(preprocess, batch_size=None),
            "valid": ray.data.range(valid_rows, override_num_blocks=2).map_batches(preprocess, batch_size=None)}
write_dataset_folder(datasets, schema, folder)
print("WROTE=" + json.dumps({"head": head}), flush=True)
"""


@needs_emulation
def test_rows_produced_on_another_node_reach_the_drivers_dataset_folder(tmp_path):
    import pyarrow.parquet as pq

    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "GLOO_SOCKET_IFNAME",
                        "NCCL_SOCKET_IFNAME", "MLFLOW_TRACKING_URI")}
    env["HOME"] = str(tmp_path / "home")
    os.makedirs(env["HOME"])
    state = tempfile.mkdtemp(prefix="emm-", dir=str(tmp_path))
    node_local = tmp_path / "node_local"
    folder = node_local / "datasets" / "job"
    cluster = up_cluster("emumat", nodes=2, cpus_per_node=1, bandwidth_mbit=200, state_dir=state, gloo_ifname=False,
                         node_local_dirs=[str(node_local)])
    try:
        proc = subprocess.run(cluster.exec_argv([sys.executable, "-c", _DRIVER, str(folder), str(TRAIN_ROWS),
                                                 str(VALID_ROWS)]),
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    finally:
        down(cluster)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("WROTE=")]
    assert proc.returncode == 0 and lines, f"driver failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n" \
                                           f"{proc.stderr[-4000:]}"
    head = json.loads(lines[-1][len("WROTE="):])["head"]

    assert sorted(os.listdir(node_local / "datasets")) == ["job"]  # no staging folder left
    assert sorted(os.listdir(folder)) == ["schema.yaml", "train", "valid"]
    for split, rows in (("train", TRAIN_ROWS), ("valid", VALID_ROWS)):
        table = pq.read_table(folder / split)
        assert table.num_rows == rows and table.column("id").to_pylist() == list(range(rows)), split
        nodes = set(table.column("node").to_pylist())
        assert head not in nodes and len(nodes) == 1, (split, head, nodes)  # produced on the other node only
