"""Cluster topologies: from the live Ray cluster, from a description, and as TorchRec's ``Topology``.

The driver plans for the cluster it finds (:func:`topology_from_ray`); users
also plan for clusters they do not have (:func:`described_topology`,
``rayemb plan --world-size 1024 --gpus-per-node 8 --hbm-gib 80``). Both return
a :class:`~rayemb.planner.types.ClusterTopology`;
:func:`rayemb.planner.torchrec_plan.to_torchrec_topology` converts it for
TorchRec's planner.

Ray reports per node its ``GPU`` count and ``memory`` (bytes of object-store-free
host memory Ray may schedule) in ``ray.nodes()[i]["Resources"]``; GPU memory is
not a Ray resource, so it comes from ``hbm_bytes`` (the job's
``scaling.gpu_memory_gib``) or from the GPU model: the ``accelerator_type:A100``
resource or ``ray.io/accelerator-type`` label Ray gives a GPU node, with
:data:`KNOWN_GPU_HBM_BYTES`. Before any GPU node is up (an autoscaling cluster),
the model comes from the GPU node types the autoscaler may start
(:func:`gpu_node_types_from_ray`; cluster/aws.yaml and cluster/gcp.yaml name it
in their GPU type's resources). Where none of these tells, planning a GPU job
fails asking for ``scaling.gpu_memory_gib``: a guessed HBM size plans tables
into memory the GPUs may not have. Host memory per rank is the smallest node's
memory divided by its ranks.

Example::

    >>> t = described_topology(world_size=1024, gpus_per_node=8, hbm_gib=80)
    >>> t.num_nodes, t.capacity_bytes // 2**30
    (128, 68)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

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

#: PlanError category: a GPU job whose GPU memory nothing tells (set scaling.gpu_memory_gib)
UNKNOWN_GPU_MEMORY = "unknown_gpu_memory"
#: the config key that states HBM per GPU where the cluster cannot tell it
GPU_MEMORY_KEY = "scaling.gpu_memory_gib"
#: Ray's accelerator-type label and resource prefix on a GPU node
ACCELERATOR_LABEL = "ray.io/accelerator-type"
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"
#: the autoscaler config a launcher cluster's head runs with (cluster/*.yaml pass it to `ray start --head`)
LAUNCHER_AUTOSCALING_CONFIG = "~/ray_bootstrap_config.yaml"

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
        hbm = hbm_bytes or hbm_from_accelerator_types(gpu_nodes)
        if not hbm:
            raise unknown_gpu_memory_error(
                f"no GPU model of known memory is named by the GPU nodes that are up "
                f"({_accelerator_names(gpu_nodes) or 'they name none'})")
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
    node_types: Optional[Sequence[Mapping[str, Any]]] = None,
) -> ClusterTopology:
    """The topology a job of ``num_workers`` ranks plans for: the shape it asks for, not whatever node is up.

    * ``use_gpu`` with GPU nodes alive: their GPUs per node and HBM (``hbm_gib`` overrides);
    * ``use_gpu`` with none alive (an autoscaling cluster whose GPU workers start from zero, a CPU head
      up): the requested shape, never the CPU head's cores and memory. GPUs per node:
      ``gpus_per_node``, else the most that divides the world up to the GPU node types' count (8 when
      no type is known). HBM per GPU: ``hbm_gib``, else the GPU model the GPU node types name, else a
      PlanError naming ``scaling.gpu_memory_gib``. ``node_types`` are the types' resource dicts (None:
      looked up with :func:`gpu_node_types_from_ray`);
    * CPU jobs: CPU ranks on the alive nodes, even where nodes also have GPUs.

    ``memory_per_worker_gib`` sets the host memory per rank. Then cut to ``num_workers`` ranks.
    """
    alive = [n for n in nodes if n.get("Alive", True) and n.get("Resources")]
    gpu_alive = [n for n in alive if float(n["Resources"].get("GPU", 0)) >= 1]
    if use_gpu and not gpu_alive:
        types: List[Mapping[str, Any]] = []
        if gpus_per_node is None or hbm_gib is None:
            types = gpu_node_types_from_ray() if node_types is None else list(node_types)
        type_gpus = min((int(float(r["GPU"])) for r in types), default=0)
        per_node = gpus_per_node or max(d for d in range(1, min(num_workers, type_gpus or 8) + 1)
                                        if num_workers % d == 0)
        if num_workers % per_node:
            raise PlanError(f"scaling.num_workers={num_workers} is not a multiple of scaling.gpus_per_node="
                            f"{per_node}. Use a world size the GPU nodes divide.", INVALID_TOPOLOGY)
        if hbm_gib is None:
            hbm = hbm_from_accelerator_types({"Resources": r} for r in types)
            if not hbm:
                named = _accelerator_names({"Resources": r} for r in types)
                detail = (f"they name {named}" if named else
                          f"{len(types)} of them, none with an {ACCELERATOR_RESOURCE_PREFIX}<model> resource"
                          if types else "none is known")
                raise unknown_gpu_memory_error(
                    f"no GPU node is up yet, and no GPU model of known memory is named by the GPU node types "
                    f"the autoscaler may start ({detail})")
            hbm_gib = hbm / GiB
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


def _accelerators(node: Mapping[str, Any]) -> List[str]:
    """GPU models a node record (or a node type's ``{"Resources": ...}``) names: resources and label."""
    names = [k[len(ACCELERATOR_RESOURCE_PREFIX):] for k in node.get("Resources") or {}
             if k.startswith(ACCELERATOR_RESOURCE_PREFIX)]
    label = (node.get("Labels") or {}).get(ACCELERATOR_LABEL)
    return names + ([label] if label else [])


def _accelerator_names(nodes: Iterable[Mapping[str, Any]]) -> str:
    return ", ".join(sorted({a for n in nodes for a in _accelerators(n)}))


def hbm_from_accelerator_types(nodes: Iterable[Mapping[str, Any]]) -> Optional[int]:
    """HBM per GPU of the smallest known GPU model the nodes (or node types) name; None when none is known.

    >>> hbm_from_accelerator_types([{"Resources": {"GPU": 4, "accelerator_type:A10G": 1}}]) // GiB
    24
    """
    found = [KNOWN_GPU_HBM_BYTES[a] for n in nodes for a in _accelerators(n) if a in KNOWN_GPU_HBM_BYTES]
    return min(found) if found else None


def unknown_gpu_memory_error(why: str) -> PlanError:
    """The PlanError of a GPU job whose HBM per GPU nothing tells: ``why``, then the fix."""
    known = ", ".join(f"{k} {v // GiB}" for k, v in sorted(KNOWN_GPU_HBM_BYTES.items(), key=lambda kv: kv[1]))
    return PlanError(
        f"Cannot plan a GPU job (scaling.use_gpu=true): {why}, so the GPU memory per device is unknown. "
        f"Set {GPU_MEMORY_KEY} to it in GiB (e.g. --set {GPU_MEMORY_KEY}=24 for A10G or L4, 40 for A100 "
        f"40GB, 80 for H100), or name the GPU model in the GPU node type's resources "
        f"({ACCELERATOR_RESOURCE_PREFIX}<model>: 1, as cluster/aws.yaml and cluster/gcp.yaml do; models "
        f"with known memory in GiB: {known}), or bring a GPU node up before the job starts.",
        UNKNOWN_GPU_MEMORY,
    )


def gpu_node_types_from_ray() -> List[Dict[str, float]]:
    """Resources of the GPU node types the connected cluster's autoscaler may start (empty when unknown).

    From the cluster config the autoscaler reports to the GCS when it does; else from the
    autoscaler config a launcher cluster's head runs with (:data:`LAUNCHER_AUTOSCALING_CONFIG`,
    where the job's driver runs under `ray job submit`). Types that can have no node
    (max 0) are left out.
    """
    import ray

    types: List[Dict[str, float]] = []
    config = None
    if ray.is_initialized():
        try:
            import ray._private.state

            config = ray._private.state.state.get_cluster_config()
        except Exception as e:  # a Ray without the call, or a GCS that does not answer it: the file is next
            logger.debug("no cluster config from the GCS: %s", e)
    if config is not None:
        types = [dict(g.resources) for g in config.node_group_configs
                 if g.max_count != 0 and float(g.resources.get("GPU", 0)) >= 1]
    if not types:
        types = gpu_node_types_from_launcher_config(os.path.expanduser(LAUNCHER_AUTOSCALING_CONFIG))
    return types


def gpu_node_types_from_launcher_config(path: str) -> List[Dict[str, float]]:
    """Resources of the GPU node types (``GPU >= 1``, ``max_workers > 0``) of a cluster launcher config file."""
    if not os.path.isfile(path):
        return []
    import yaml

    try:
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        logger.warning("cannot read the autoscaler config %s: %s", path, e)
        return []
    out = []
    for node_type in (config.get("available_node_types") or {}).values():
        resources = dict((node_type or {}).get("resources") or {})
        if float(resources.get("GPU", 0)) >= 1 and (node_type or {}).get("max_workers", 1) > 0:
            out.append(resources)
    return out


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
    "described_topology", "topology_from_nodes", "topology_from_ray", "job_topology_from_nodes",
    "gpu_node_types_from_ray", "gpu_node_types_from_launcher_config", "hbm_from_accelerator_types",
    "KNOWN_GPU_HBM_BYTES", "GPU_MEMORY_KEY", "UNKNOWN_GPU_MEMORY",
]
