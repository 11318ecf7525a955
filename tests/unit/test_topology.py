"""Topologies: described, from ray.nodes() records, from a live local Ray, and as TorchRec's Topology."""

from __future__ import annotations

import pytest

from rayemb.errors import PlanError
from rayemb.planner.topology import described_topology, topology_from_nodes, topology_from_ray
from rayemb.planner.types import GiB, ClusterTopology


def test_described_topology_units_and_capacity():
    t = described_topology(1024, 8, hbm_gib=80)
    assert (t.num_nodes, t.devices_per_node, t.world_size) == (128, 8, 1024)
    assert t.hbm_bytes == 80 * GiB and t.capacity_bytes == int(80 * GiB * 0.85)
    assert t.node_of(15) == 1
    cpu = described_topology(4, 2, ddr_gib=16, compute_device="cpu")
    assert cpu.device_bytes == 16 * GiB and cpu.hbm_bytes == 0


@pytest.mark.parametrize("kwargs", [dict(world_size=12, gpus_per_node=8), dict(world_size=0, gpus_per_node=1)])
def test_described_topology_rejects_bad_shapes(kwargs):
    with pytest.raises(PlanError) as e:
        described_topology(**kwargs)
    assert e.value.category == "invalid_topology"


def test_topology_from_gpu_node_records_uses_smallest_node_and_accelerator_memory():
    nodes = [
        {"Alive": True, "Resources": {"GPU": 8.0, "memory": 512 * GiB, "accelerator_type:H100": 1.0}},
        {"Alive": True, "Resources": {"GPU": 4.0, "memory": 256 * GiB, "accelerator_type:H100": 1.0}},
        {"Alive": True, "Resources": {"CPU": 16.0, "memory": 64 * GiB}},  # CPU-only head
        {"Alive": False, "Resources": {"GPU": 8.0}},
    ]
    t = topology_from_nodes(nodes)
    assert (t.compute_device, t.num_nodes, t.devices_per_node) == ("cuda", 2, 4)
    assert t.hbm_bytes == 80 * GiB and t.ddr_bytes == 64 * GiB


def test_topology_from_cpu_nodes_spreads_workers():
    t = topology_from_nodes([{"Resources": {"CPU": 2.0, "memory": 8 * GiB}}], num_workers=2)
    assert (t.compute_device, t.world_size, t.ddr_bytes) == ("cpu", 2, 4 * GiB)
    with pytest.raises(PlanError) as e:
        topology_from_nodes([])
    assert e.value.category == "invalid_topology"


def test_to_torchrec_topology_matches():
    from rayemb.planner.torchrec_plan import to_torchrec_topology

    t = described_topology(16, 8, hbm_gib=40, intra_node_bw=1e11, inter_node_bw=1e10)
    tr = to_torchrec_topology(t)
    assert tr.world_size == 16 and tr.local_world_size == 8 and tr.compute_device == "cuda"
    assert tr.devices[3].storage.hbm == 40 * GiB
    assert tr.intra_host_bw == pytest.approx(1e8) and tr.inter_host_bw == pytest.approx(1e7)  # bytes/ms


@pytest.mark.timeout(120)
def test_topology_from_live_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, address="local")
    try:
        t = topology_from_ray(num_workers=2)
    finally:
        ray.shutdown()
    assert isinstance(t, ClusterTopology)
    assert (t.compute_device, t.world_size, t.num_nodes) == ("cpu", 2, 1)
    assert t.ddr_bytes > 0


# ---- the shape a job asks for: never a CPU head that happens to be up ----

from rayemb.planner.topology import job_topology_from_nodes  # noqa: E402

_CPU_HEAD = {"Alive": True, "Resources": {"CPU": 16.0, "memory": 64 * 2**30}}
_GPU_NODE = {"Alive": True, "Resources": {"CPU": 48.0, "GPU": 4.0, "memory": 180 * 2**30, "accelerator_type:A10G": 1}}


def test_gpu_job_on_a_cpu_head_plans_for_the_gpus_it_asks_for():
    topo = job_topology_from_nodes([_CPU_HEAD], num_workers=16, use_gpu=True, gpus_per_node=4, hbm_gib=24)
    assert (topo.compute_device, topo.num_nodes, topo.devices_per_node) == ("cuda", 4, 4)
    assert topo.hbm_bytes == 24 * 2**30
    default = job_topology_from_nodes([_CPU_HEAD], num_workers=16, use_gpu=True, hbm_gib=80, node_types=[])
    assert (default.compute_device, default.devices_per_node, default.hbm_bytes) == ("cuda", 8, 80 * 2**30)
    # not the CPU head's 16 CPU ranks of 4 GiB
    assert job_topology_from_nodes([_CPU_HEAD], num_workers=16, use_gpu=False).compute_device == "cpu"


def test_gpu_job_with_gpu_nodes_up_takes_their_shape_and_cpu_job_ignores_gpus():
    topo = job_topology_from_nodes([_CPU_HEAD, _GPU_NODE, _GPU_NODE], num_workers=8, use_gpu=True)
    assert (topo.compute_device, topo.num_nodes, topo.devices_per_node, topo.hbm_bytes) == ("cuda", 2, 4, 24 * 2**30)
    cpu = job_topology_from_nodes([_CPU_HEAD, _GPU_NODE], num_workers=2, use_gpu=False, memory_per_worker_gib=3)
    assert (cpu.compute_device, cpu.world_size, cpu.ddr_bytes) == ("cpu", 2, 3 * 2**30)


def test_requested_gpus_per_node_must_divide_the_world():
    with pytest.raises(PlanError, match="scaling.gpus_per_node"):
        job_topology_from_nodes([_CPU_HEAD], num_workers=6, use_gpu=True, gpus_per_node=4)


# ---- HBM per GPU: stated, or named by the GPU nodes / node types, never guessed ----

import os  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

from rayemb.planner.topology import (  # noqa: E402
    GPU_MEMORY_KEY, UNKNOWN_GPU_MEMORY, gpu_node_types_from_launcher_config, gpu_node_types_from_ray,
)

REPO = Path(__file__).resolve().parents[2]
_A10G_TYPE = {"CPU": 48.0, "GPU": 4.0, "accelerator_type:A10G": 1.0}
_A100_TYPE = {"CPU": 96.0, "GPU": 8.0, "accelerator_type:A100": 1.0}


def test_gpu_job_before_any_gpu_node_takes_shape_and_hbm_from_the_gpu_node_types():
    topo = job_topology_from_nodes([_CPU_HEAD], num_workers=8, use_gpu=True, node_types=[_A10G_TYPE])
    assert (topo.compute_device, topo.num_nodes, topo.devices_per_node, topo.hbm_bytes) == ("cuda", 2, 4, 24 * GiB)
    # several GPU types: the smallest GPU count and memory, so the plan fits whichever type comes
    mixed = job_topology_from_nodes([_CPU_HEAD], num_workers=16, use_gpu=True, node_types=[_A100_TYPE, _A10G_TYPE])
    assert (mixed.devices_per_node, mixed.hbm_bytes) == (4, 24 * GiB)
    # a stated shape and memory win over the types
    stated = job_topology_from_nodes([_CPU_HEAD], num_workers=16, use_gpu=True, gpus_per_node=8, hbm_gib=40,
                                     node_types=[_A10G_TYPE])
    assert (stated.devices_per_node, stated.hbm_bytes) == (8, 40 * GiB)


@pytest.mark.parametrize("node_types, detail", [
    ([], "none is known"),
    ([{"CPU": 48.0, "GPU": 4.0}], "1 of them, none with an accelerator_type:<model> resource"),
    ([{"CPU": 48.0, "GPU": 4.0, "accelerator_type:MI300X": 1.0}], "they name MI300X"),
])
def test_gpu_job_with_unknown_gpu_memory_fails_naming_the_config_key(node_types, detail):
    with pytest.raises(PlanError) as e:
        job_topology_from_nodes([_CPU_HEAD], num_workers=8, use_gpu=True, node_types=node_types)
    assert e.value.category == UNKNOWN_GPU_MEMORY and e.value.exit_code == 2
    assert GPU_MEMORY_KEY in str(e.value) and detail in str(e.value)
    # the key it names is the fix
    assert job_topology_from_nodes([_CPU_HEAD], num_workers=8, use_gpu=True, hbm_gib=24,
                                   node_types=node_types).hbm_bytes == 24 * GiB


def test_live_gpu_nodes_name_their_model_by_resource_or_label_and_unknown_ones_fail():
    labelled = {"Alive": True, "Resources": {"CPU": 48.0, "GPU": 8.0, "memory": 512 * GiB},
                "Labels": {"ray.io/accelerator-type": "H100"}}
    assert job_topology_from_nodes([_CPU_HEAD, labelled], num_workers=8, use_gpu=True).hbm_bytes == 80 * GiB
    unnamed = {"Alive": True, "Resources": {"CPU": 48.0, "GPU": 4.0, "memory": 180 * GiB}}
    with pytest.raises(PlanError) as e:
        job_topology_from_nodes([_CPU_HEAD, unnamed], num_workers=4, use_gpu=True)
    assert e.value.category == UNKNOWN_GPU_MEMORY and GPU_MEMORY_KEY in str(e.value)
    assert job_topology_from_nodes([_CPU_HEAD, unnamed], num_workers=4, use_gpu=True,
                                   hbm_gib=48).hbm_bytes == 48 * GiB
    # the stated memory wins over the model the nodes name
    assert job_topology_from_nodes([_CPU_HEAD, _GPU_NODE], num_workers=4, use_gpu=True,
                                   hbm_gib=20).hbm_bytes == 20 * GiB


def test_the_shipped_launcher_configs_name_their_gpu_model():
    aws = gpu_node_types_from_launcher_config(str(REPO / "cluster" / "aws.yaml"))
    gcp = gpu_node_types_from_launcher_config(str(REPO / "cluster" / "gcp.yaml"))
    assert len(aws) == len(gcp) == 1
    for types, hbm in ((aws, 24), (gcp, 40)):  # g5.12xlarge: 4 x A10G 24 GB; a2-highgpu-4g: 4 x A100 40 GB
        topo = job_topology_from_nodes([_CPU_HEAD], num_workers=8, use_gpu=True, node_types=types)
        assert (topo.num_nodes, topo.devices_per_node, topo.hbm_bytes) == (2, 4, hbm * GiB)
    assert gpu_node_types_from_launcher_config(str(REPO / "no-such-config.yaml")) == []


@pytest.mark.timeout(120)
def test_gpu_node_types_from_a_live_ray(ray_2_cpus, tmp_path, monkeypatch):
    """The launcher's autoscaler config on the head when the GCS has no cluster config; the GCS's when it has."""
    from ray.core.generated import autoscaler_pb2

    monkeypatch.setenv("HOME", str(tmp_path))
    assert gpu_node_types_from_ray() == []
    shutil.copy(REPO / "cluster" / "aws.yaml", tmp_path / "ray_bootstrap_config.yaml")
    assert gpu_node_types_from_ray() == [{"CPU": 48, "GPU": 4, "accelerator_type:A10G": 1}]

    config = autoscaler_pb2.ClusterConfig()
    group = config.node_group_configs.add(name="gpu", max_count=2)
    group.resources.update({"CPU": 96, "GPU": 8, "accelerator_type:H100": 1})
    config.node_group_configs.add(name="gone", max_count=0).resources.update({"GPU": 1, "accelerator_type:T4": 1})
    gcs = ray_2_cpus._private.worker.global_worker.gcs_client
    gcs.report_cluster_config(config.SerializeToString())
    try:
        assert gpu_node_types_from_ray() == [{"CPU": 96, "GPU": 8, "accelerator_type:H100": 1}]
        topo = job_topology_from_nodes(ray_2_cpus.nodes(), num_workers=16, use_gpu=True)
        assert (topo.num_nodes, topo.devices_per_node, topo.hbm_bytes) == (2, 8, 80 * GiB)
    finally:
        gcs.report_cluster_config(autoscaler_pb2.ClusterConfig().SerializeToString())


@pytest.mark.timeout(300)
def test_plan_cli_exits_2_naming_the_key_and_takes_the_memory_from_the_node_types(
        ray_2_cpus, tiny_data, tmp_path, monkeypatch, capsys):
    import json

    from rayemb.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = os.path.join(REPO, "jobs", "configs", "synth_small.yaml")
    args = ["plan", "--config", cfg, "--set", f"data.path={tiny_data}", "--set", "scaling.use_gpu=true",
            "--set", "scaling.num_workers=8"]
    assert main(args + ["--out", str(tmp_path / "a.json")]) == 2
    err = capsys.readouterr().err
    assert GPU_MEMORY_KEY in err and "no GPU node is up" in err
    assert not (tmp_path / "a.json").exists()

    assert main(args + ["--hbm-gib", "16", "--out", str(tmp_path / "b.json")]) == 0
    shutil.copy(REPO / "cluster" / "aws.yaml", tmp_path / "ray_bootstrap_config.yaml")
    assert main(args + ["--out", str(tmp_path / "c.json")]) == 0
    b, c = (json.loads((tmp_path / n).read_text())["topology"] for n in ("b.json", "c.json"))
    assert (b["hbm_bytes"], b["devices_per_node"]) == (16 * GiB, 8)
    assert (c["hbm_bytes"], c["devices_per_node"], c["num_nodes"]) == (24 * GiB, 4, 2)


@pytest.mark.parametrize("value", ["0", "-24"])
def test_gpu_memory_key_must_be_positive(value):
    from rayemb.config import load_config
    from rayemb.errors import ConfigError

    cfg = os.path.join(REPO, "jobs", "configs", "synth_small.yaml")
    with pytest.raises(ConfigError, match=GPU_MEMORY_KEY):
        load_config(cfg, [f"{GPU_MEMORY_KEY}={value}"])
    assert load_config(cfg, [f"{GPU_MEMORY_KEY}=24"]).scaling.gpu_memory_gib == 24
