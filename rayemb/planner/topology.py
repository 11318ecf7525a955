"""Cluster topologies: from the live Ray cluster, from a description, and as TorchRec's ``Topology``.

The driver plans for the cluster it finds (:func:`topology_from_ray`); users
also plan for clusters they do not have (:func:`described_topology`,
``rayemb plan --world-size 1024 --gpus-per-node 8 --hbm-gib 80``). Both return
a :class:`~rayemb.planner.types.ClusterTopology`;
:func:`rayemb.planner.torchrec_plan.to_torchrec_topology` converts it for
TorchRec's planner.

Ray reports per node its ``GPU`` count and ``memory`` (bytes of object-store-free
host memory Ray may schedule) in ``ray.nodes()[i]["Resources"]``; GPU memory is
not a Ray resource, so it comes from an accelerator-type label when known
(``accelerator_type:A100`` etc. with :data:`KNOWN_GPU_HBM_BYTES`) or from
``hbm_bytes``. Host memory per rank is the smallest node's memory divided by
its ranks.

Example::

    >>> t = described_topology(world_size=1024, gpus_per_node=8, hbm_gib=80)
    >>> t.num_nodes, t.capacity_bytes // 2**30
    (128, 68)
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence

from rayemb.errors import PlanError
from rayemb.planner.types import (
    DEFAULT_CPU_INTER_NODE_BW,
    DEFAULT_CPU_INTRA_NODE_BW,
    DEFAULT_DDR_BYTES,
    DEFAULT_HBM_BYTES,
    DEFAULT_INTER_NODE_BW,
    DEFAULT_INTRA_NODE_BW,
    DEFAULT_RESERVED_FRACTION,
    INVALID_TOPOLOGY,
    ClusterTopology,
    GiB,
)

logger = logging.getLogger(__name__)

#: HBM per device of common accelerators (Ray's ``accelerator_type:*`` resource names)
KNOWN_GPU_HBM_BYTES: Dict[str, int] = {
    "A100": 40 * GiB,
    "A100-80G": 80 * GiB,
    "H100": 80 * GiB,
    "H200": 141 * GiB,
    "A10G": 24 * GiB,
    "L4": 24 * GiB,
    "T4": 16 * GiB,
    "V100": 16 * GiB,
}


def described_topology(
    world_size: int,
    gpus_per_node: int = 8,
    hbm_gib: Optional[float] = None,
    ddr_gib: Optional[float] = None,
    compute_device: str = "cuda",
    intra_node_bw: Optional[float] = None,
    inter_node_bw: Optional[float] = None,
    reserved_fraction: float = DEFAULT_RESERVED_FRACTION,
) -> ClusterTopology:
    """A cluster of ``world_size`` ranks, ``gpus_per_node`` per node, none of whose hardware is needed.

    Bandwidths are bytes/s per rank (defaults: NVLink-class inside a node,
    a 200 Gb/s NIC per GPU across nodes; ethernet-class for ``cpu``).
    """
    if world_size < 1 or gpus_per_node < 1 or world_size % gpus_per_node:
        raise PlanError(
            f"Cannot describe a cluster of --world-size {world_size} with --gpus-per-node {gpus_per_node}: the "
            "world size must be a positive multiple of the devices per node (e.g. --world-size 64 "
            "--gpus-per-node 8).", INVALID_TOPOLOGY,
        )
    cpu = compute_device == "cpu"
    return ClusterTopology(
        num_nodes=world_size // gpus_per_node,
        devices_per_node=gpus_per_node,
        compute_device=compute_device,
        hbm_bytes=0 if cpu and hbm_gib is None else int((hbm_gib if hbm_gib is not None else DEFAULT_HBM_BYTES / GiB) * GiB),
        ddr_bytes=int(ddr_gib * GiB) if ddr_gib is not None else DEFAULT_DDR_BYTES,
        intra_node_bw=intra_node_bw or (DEFAULT_CPU_INTRA_NODE_BW if cpu else DEFAULT_INTRA_NODE_BW),
        inter_node_bw=inter_node_bw or (DEFAULT_CPU_INTER_NODE_BW if cpu else DEFAULT_INTER_NODE_BW),
        reserved_fraction=reserved_fraction,
    )


def topology_from_nodes(
    nodes: Sequence[Mapping[str, Any]],
    num_workers: Optional[int] = None,
    hbm_bytes: Optional[int] = None,
    intra_node_bw: Optional[float] = None,
    inter_node_bw: Optional[float] = None,
    reserved_fraction: float = DEFAULT_RESERVED_FRACTION,
) -> ClusterTopology:
    """Topology from ``ray.nodes()`` records (pure; :func:`topology_from_ray` feeds it the live cluster).

    With GPUs: one rank per GPU, ``devices_per_node`` the smallest GPU count of
    any GPU node (a planner topology is uniform). Without GPUs: ``cpu`` with
    ``num_workers`` ranks (the job's ``scaling.num_workers``) spread over the
    alive nodes.
    """
    alive = [n for n in nodes if n.get("Alive", True) and n.get("Resources")]
    if not alive:
        raise PlanError(
            "The Ray cluster reports no alive nodes with resources. Start Ray (`ray start --head`), or plan "
            "for a described cluster with --world-size N --gpus-per-node G --hbm-gib X.", INVALID_TOPOLOGY,
        )
    gpu_nodes = [n for n in alive if float(n["Resources"].get("GPU", 0)) >= 1]
    if gpu_nodes:
        per_node = min(int(float(n["Resources"]["GPU"])) for n in gpu_nodes)
        hbm = hbm_bytes or _hbm_from_labels(gpu_nodes) or DEFAULT_HBM_BYTES
        ddr = min(int(float(n["Resources"].get("memory", DEFAULT_DDR_BYTES * per_node))) // per_node for n in gpu_nodes)
        return ClusterTopology(
            num_nodes=len(gpu_nodes), devices_per_node=per_node, compute_device="cuda", hbm_bytes=int(hbm),
            ddr_bytes=max(ddr, 1), intra_node_bw=intra_node_bw or DEFAULT_INTRA_NODE_BW,
            inter_node_bw=inter_node_bw or DEFAULT_INTER_NODE_BW, reserved_fraction=reserved_fraction,
        )
    ranks = num_workers or len(alive)
    num_nodes = min(len(alive), ranks)
    while ranks % num_nodes:
        num_nodes -= 1
    per_node = ranks // num_nodes
    ddr = min(int(float(n["Resources"].get("memory", DEFAULT_DDR_BYTES))) for n in alive) // per_node
    return ClusterTopology(
        num_nodes=num_nodes, devices_per_node=per_node, compute_device="cpu", hbm_bytes=0, ddr_bytes=max(ddr, 1),
        intra_node_bw=intra_node_bw or DEFAULT_CPU_INTRA_NODE_BW,
        inter_node_bw=inter_node_bw or DEFAULT_CPU_INTER_NODE_BW, reserved_fraction=reserved_fraction,
    )


def job_topology_from_nodes(
    nodes: Sequence[Mapping[str, Any]],
    num_workers: int,
    use_gpu: bool,
    gpus_per_node: Optional[int] = None,
    hbm_gib: Optional[float] = None,
    memory_per_worker_gib: Optional[float] = None,
) -> ClusterTopology:
    """The topology a job of ``num_workers`` ranks plans for: the shape it asks for, not whatever node is up.

    * ``use_gpu`` with GPU nodes alive: their GPUs per node and HBM (``hbm_gib`` overrides);
    * ``use_gpu`` with none alive (an autoscaling cluster whose GPU workers start from zero, a CPU head
      up): the requested shape — ``gpus_per_node`` (default: up to 8, dividing the world), ``hbm_gib``
      (default 80) — never the CPU head's cores and memory;
    * CPU jobs: CPU ranks on the alive nodes, even where nodes also have GPUs.

    ``memory_per_worker_gib`` sets the host memory per rank. Then cut to ``num_workers`` ranks.
    """
    alive = [n for n in nodes if n.get("Alive", True) and n.get("Resources")]
    gpu_alive = [n for n in alive if float(n["Resources"].get("GPU", 0)) >= 1]
    if use_gpu and not gpu_alive:
        per_node = gpus_per_node or max(d for d in range(1, min(num_workers, 8) + 1) if num_workers % d == 0)
        if num_workers % per_node:
            raise PlanError(f"scaling.num_workers={num_workers} is not a multiple of scaling.gpus_per_node="
                            f"{per_node}. Use a world size the GPU nodes divide.", INVALID_TOPOLOGY)
        topo = described_topology(num_workers, per_node, hbm_gib=hbm_gib, ddr_gib=memory_per_worker_gib,
                                  compute_device="cuda")
        logger.info("no GPU node is alive yet: planning for the requested %d x %d GPUs", topo.num_nodes, per_node)
        return topo
    if use_gpu:
        topo = topology_from_nodes(gpu_alive, num_workers=num_workers,
                                   hbm_bytes=int(hbm_gib * GiB) if hbm_gib else None)
    else:
        cpu_view = [{**n, "Resources": {k: v for k, v in n["Resources"].items() if k != "GPU"}} for n in alive]
        topo = topology_from_nodes(cpu_view, num_workers=num_workers)
    topo = resize_topology(topo, num_workers)
    if memory_per_worker_gib:
        topo = dataclasses.replace(topo, ddr_bytes=int(memory_per_worker_gib * GiB))
    return topo


def resize_topology(topo: ClusterTopology, world: int) -> ClusterTopology:
    """``topo`` cut (or grown) to ``world`` ranks, keeping ranks per node where they divide it."""
    if topo.world_size != world:  # a GPU cluster larger (or smaller, before it scales up) than the job
        per_node = min(topo.devices_per_node, world)
        if world % per_node:
            per_node = world
        topo = dataclasses.replace(topo, num_nodes=world // per_node, devices_per_node=per_node)
    return topo


def _hbm_from_labels(nodes: Sequence[Mapping[str, Any]]) -> Optional[int]:
    found: List[int] = []
    for n in nodes:
        for key in n["Resources"]:
            if key.startswith("accelerator_type:"):
                hbm = KNOWN_GPU_HBM_BYTES.get(key.split(":", 1)[1])
                if hbm:
                    found.append(hbm)
    return min(found) if found else None


def topology_from_ray(num_workers: Optional[int] = None, **kwargs: Any) -> ClusterTopology:
    """Topology of the live Ray cluster this process is connected to (``ray.init`` first)."""
    import ray

    if not ray.is_initialized():
        raise PlanError(
            "Not connected to a Ray cluster. Call ray.init(address=...) / run under `ray job submit`, or plan "
            "for a described cluster with --world-size N --gpus-per-node G --hbm-gib X.", INVALID_TOPOLOGY,
        )
    topo = topology_from_nodes(ray.nodes(), num_workers=num_workers, **kwargs)
    logger.info("planning for the live Ray cluster: %s", topo.to_dict())
    return topo


__all__ = [
    "described_topology", "topology_from_nodes", "topology_from_ray", "KNOWN_GPU_HBM_BYTES",
]
