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


# ---- the shape a job asks for (issue 13): never a CPU head that happens to be up ----

from rayemb.planner.topology import job_topology_from_nodes  # noqa: E402

_CPU_HEAD = {"Alive": True, "Resources": {"CPU": 16.0, "memory": 64 * 2**30}}
_GPU_NODE = {"Alive": True, "Resources": {"CPU": 48.0, "GPU": 4.0, "memory": 180 * 2**30, "accelerator_type:A10G": 1}}


def test_gpu_job_on_a_cpu_head_plans_for_the_gpus_it_asks_for():
    topo = job_topology_from_nodes([_CPU_HEAD], num_workers=16, use_gpu=True, gpus_per_node=4, hbm_gib=24)
    assert (topo.compute_device, topo.num_nodes, topo.devices_per_node) == ("cuda", 4, 4)
    assert topo.hbm_bytes == 24 * 2**30
    default = job_topology_from_nodes([_CPU_HEAD], num_workers=16, use_gpu=True)
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
