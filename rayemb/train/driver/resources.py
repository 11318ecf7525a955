"""What each worker gets, decided once per job on the driver: CPUs, whether its data fits in memory, and warnings.

* ``cpus_per_worker``: the config's value, else a share of the cluster's CPUs
  that leaves ``RESERVED_DATA_CPUS`` free for Ray Data's read tasks (capped at 1);
* ``in_memory``: ``data.in_memory``, else whether the rank's converted
  train + valid shard (estimated from the statistics) stays under
  ``data.in_memory_max_gib``;
* ``warnings``: e.g. that once the workers are packed onto the live nodes no
  node keeps a CPU for Ray Data — the job would wait for its first batch
  (the worker then fails after ``data.first_batch_timeout_s`` with the cause).
  Only streamed data needs Ray Data's read tasks: in-memory shards are read by
  the ranks themselves (:mod:`rayemb.train.held_splits`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Sequence, Tuple

from rayemb.config import JobConfig
from rayemb.constants import MIN_CPUS_PER_WORKER, RESERVED_DATA_CPUS

#: CPUs one Ray Data read task asks for (Ray's default for tasks)
READ_TASK_CPUS = 1.0
#: converted batches hold tensors, a KJT and Python objects around the raw bytes
IN_MEMORY_OVERHEAD = 1.5


@dataclass(frozen=True)
class WorkerResources:
    cpus_per_worker: float
    in_memory: bool
    #: estimated bytes of one rank's converted train + valid batches
    shard_bytes: int
    warnings: Tuple[str, ...] = field(default_factory=tuple)


def live_node_cpus() -> List[float]:
    """CPUs of every alive node of the connected Ray cluster."""
    import ray

    return [float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]


def resolve_cpus_per_worker(cfg: JobConfig, cluster_cpus: float) -> float:
    if cfg.scaling.cpus_per_worker is not None:
        return cfg.scaling.cpus_per_worker
    share = (cluster_cpus - RESERVED_DATA_CPUS) / cfg.scaling.num_workers
    return max(MIN_CPUS_PER_WORKER, min(1.0, round(share, 2)))


def free_cpus_after_packing(node_cpus: Sequence[float], workers: int, cpus_per_worker: float,
                            strategy: str = "PACK") -> List[float]:
    """Each node's CPUs left once ``workers`` bundles are placed as Ray's ``strategy`` would.

    PACK: the tightest node that fits; SPREAD: the node with fewest workers that fits; STRICT_SPREAD:
    one per node. Raises ``ValueError`` when the workers do not fit at all (Ray would wait for nodes).
    """
    free = list(node_cpus)
    placed = [0] * len(free)
    for _ in range(workers):
        fits = [i for i, f in enumerate(free) if f + 1e-9 >= cpus_per_worker
                and not (strategy == "STRICT_SPREAD" and placed[i])]
        if not fits:
            raise ValueError("the workers do not fit")
        if strategy == "PACK":
            i = min(fits, key=lambda j: free[j])
        else:
            i = min(fits, key=lambda j: (placed[j], -free[j]))
        free[i] -= cpus_per_worker
        placed[i] += 1
    return free


def data_starvation_warning(node_cpus: Sequence[float], workers: int, cpus_per_worker: float,
                            strategy: str = "PACK") -> List[str]:
    try:
        free = free_cpus_after_packing(node_cpus, workers, cpus_per_worker, strategy)
    except ValueError:
        return [f"{workers} workers x {cpus_per_worker:g} CPU do not fit the live nodes' CPUs {list(node_cpus)}: "
                "Ray waits for the cluster to grow (an autoscaler), else lower scaling.cpus_per_worker or "
                "scaling.num_workers."]
    if max(free, default=0.0) + 1e-9 >= READ_TASK_CPUS:
        return []
    return [f"after placing {workers} workers x {cpus_per_worker:g} CPU on nodes with {list(node_cpus)} CPUs, no node "
            f"keeps the {READ_TASK_CPUS:g} CPU a Ray Data read task needs, so the workers would wait for data; the "
            "job fails after data.first_batch_timeout_s unless a node joins. Lower scaling.cpus_per_worker."]


def shard_bytes(cfg: JobConfig, schema: Any, stats: Any, train_rows: int, valid_rows: int) -> int:
    """Estimated bytes of one rank's converted train + valid batches (dense fp32, labels, ids int64, lengths)."""
    per_row = 4 * len(schema.dense) + 4
    for feat in schema.sparse:
        table = stats.tables.get(feat.name) if stats is not None else None
        pooling = float(table.pooling_mean) if table is not None else 1.0
        per_row += int(8 * pooling) + 4
    rows = (train_rows + valid_rows) / cfg.scaling.num_workers
    return int(rows * per_row * IN_MEMORY_OVERHEAD)


def worker_resources(cfg: JobConfig, schema: Any, stats: Any, train_rows: int, valid_rows: int) -> WorkerResources:
    """The job's :class:`WorkerResources` on the connected Ray cluster (module docstring)."""
    nodes = live_node_cpus()
    cpw = resolve_cpus_per_worker(cfg, sum(nodes) or 1.0)
    size = shard_bytes(cfg, schema, stats, train_rows, valid_rows)
    in_memory = cfg.data.in_memory if cfg.data.in_memory is not None else size <= cfg.data.in_memory_max_gib * 2**30
    warnings = () if in_memory else \
        data_starvation_warning(nodes, cfg.scaling.num_workers, cpw, cfg.scaling.placement_strategy)
    return WorkerResources(cpw, bool(in_memory), size, tuple(warnings))


__all__ = ["WorkerResources", "worker_resources", "resolve_cpus_per_worker", "free_cpus_after_packing",
           "data_starvation_warning", "shard_bytes"]
