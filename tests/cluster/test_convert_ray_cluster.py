"""``rayemb convert criteo --engine ray`` on an emulated 2-node cluster (1 CPU per node, token auth, shaped
links) gives the single-process engine's dataset: the driver runs in the head's namespace and joins the
cluster through ``$RAY_ADDRESS``, its tasks take both nodes' CPUs, and the vocabulary's per-table merge runs
across them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _convert_engines import REPO, assert_same_dataset, convert_argv, summary
from test_emulate import cluster, needs_root  # noqa: F401  (the module's 2-node cluster: a fixture)

from rayemb.cli import main
from rayemb.convert.synthetic import write_criteo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@needs_root
def test_ray_engine_on_two_nodes_equals_the_local_engine(cluster, tmp_path):  # noqa: F811
    inputs = [write_criteo(str(tmp_path / "part_0.gz"), 8_000, seed=1, bad_every=2000),
              write_criteo(str(tmp_path / "part_1.txt"), 12_000, seed=2)]
    options = ["--vocab-from-train", "--min-count", "2", "--rows-per-file", 5000, "--block-size-mib", 0.25]
    local, ray = str(tmp_path / "by_local"), str(tmp_path / "by_ray")
    assert main(convert_argv(inputs, local, "local", *options)) == 0
    argv = [sys.executable, "-m", "rayemb", *convert_argv(inputs, ray, "ray", *options, "--chunk-size-mib", 0.5)]
    proc = subprocess.run(cluster.exec_argv(argv), capture_output=True, text=True, timeout=400, cwd=REPO)
    assert proc.returncode == 0, f"convert failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert_same_dataset(local, ray)
    engine = summary(ray)["engine"]
    assert engine["name"] == "ray" and engine["cpus"] == 2 and engine["chunks"] >= 4  # both nodes' CPUs
