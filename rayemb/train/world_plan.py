"""One world size's plan: its batch, its topology, its hot set and the TorchRec plan made with them.

HugeCTR's frequent-category rule decides an id is hot from the number of ranks and the global batch (across
nodes, from the calibrated break-even), so every world size a job may run at — the planned one and each smaller
one an elastic job restarts at — gets its own split. :func:`plan_world` is where that split is made, once per
world size, and handed on with the batch it was made for::

    world = plan_world(cfg, topology, stats, calibration, plan_fn=make_plan,
                       table_dims=schema.table_dims(cfg.model.embedding_dim))
    world.batch.global_size == world.split.global_batch_size     # the rows per step the hot set was sized for
    world.job_plan.hot_ids                                       # hybrid tables' replicated ids, from world.split

The driver (:func:`rayemb.train.driver.trainer.plan_job`) makes one per world size and the workers take the one of
their world (:class:`rayemb.train.worker_job.WorkerJob`); ``rayemb plan`` makes one without a ``plan_fn``
and plans the tables of its hot set with the engine it is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from rayemb.batch_shape import BatchShape
from rayemb.config import JobConfig
from rayemb.planner.tables import split_rule

#: how a world's :class:`~rayemb.train.sharding.JobPlan` is made from (config, split, topology), in the driver
#: (:func:`rayemb.train.driver.trainer.plan_job`)
PlanFn = Callable[[JobConfig, Any, Any], Any]


@dataclass(frozen=True)
class WorldPlan:
    """What a job runs with on ``batch.world`` ranks."""

    #: ``data.batch_size`` rows on each of the world's ranks
    batch: BatchShape
    #: the world's :class:`~rayemb.planner.types.ClusterTopology` (an elastic world: the job's, resized)
    topology: Any
    #: the world's :class:`~rayemb.planner.split.FrequentSplit` (None: planned without statistics)
    split: Any
    #: the world's :class:`~rayemb.train.sharding.JobPlan` (None: a what-if plan, ``rayemb plan``)
    job_plan: Any = None

    @property
    def world(self) -> int:
        return self.batch.world


def plan_world(cfg: JobConfig, topology: Any, stats: Any, calibration: Any = None,
               plan_fn: Optional[PlanFn] = None, table_dims: Optional[Mapping[str, int]] = None) -> WorldPlan:
    """The plan of ``cfg``'s job on ``topology``'s ranks: its batch, the frequent-category split of ``stats``
    sized for that batch and topology, and (``plan_fn``) the TorchRec plan of the model with that split.

    ``calibration``: the job's measured :class:`~rayemb.planner.step_time.Calibration` (None: uncalibrated);
    across nodes a measured one sets the hot threshold (:func:`~rayemb.planner.tables.split_rule`).
    ``table_dims``: table -> its dim (:meth:`~rayemb.data.schema.DatasetSchema.table_dims`), each table's hot rows,
    optimizer state and break-even priced at its own width; a table it does not name takes
    ``model.embedding_dim``.
    """
    batch = BatchShape(cfg.data.batch_size, topology.world_size)
    split = None
    if stats is not None:
        dim = int(cfg.model.embedding_dim)
        dims = {name: int((table_dims or {}).get(name, dim)) for name in stats.tables}
        split = split_rule(topology, batch.global_size, dims, cfg.model.embedding_bytes_per_element,
                           calibration=calibration, embedding_optimizer=cfg.train.embedding_optimizer).split(stats)
    return WorldPlan(batch, topology, split, plan_fn(cfg, split, topology) if plan_fn is not None else None)


__all__ = ["PlanFn", "WorldPlan", "plan_world"]
