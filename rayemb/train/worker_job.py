"""What the driver hands every Ray Train worker: one frozen, typed :class:`WorkerJob`.

The driver (:func:`rayemb.train.driver.trainer.train`) puts one ``WorkerJob`` in the object store and
gives Ray Train a loop bound to its reference (:func:`rayemb.train.worker.loop.worker_loop`), so Ray
Train's controller, which unpickles the loop, never loads the plans (they would import TorchRec
there); each worker fetches the job once. Large or TorchRec-typed parts travel as their own
object-store references inside it (the plans, the model spec).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from rayemb.batch_shape import BatchShape
from rayemb.config import JobConfig
from rayemb.data.schema import DatasetSchema


@dataclass(frozen=True)
class WorkerJob:
    cfg: JobConfig
    schema: DatasetSchema
    #: object ref of ``{world size: WorldPlan}`` (:mod:`rayemb.train.world_plan`): the planned world, and each
    #: smaller one an elastic job may restart at (its batch, hot set and shards)
    plans: Any
    #: object ref of the model's :class:`~rayemb.contract.factory.ModelSpec`, or None (the config names the model)
    model: Any
    #: the train split's rows (every world size's steps per epoch come from it)
    train_rows: int
    plan_fingerprint: str
    #: Ray Train's storage of this run's checkpoints (a path or a URI); a restarted group resumes from there
    checkpoint_root: str
    #: a checkpoint of an earlier job to start from (``train.resume_from``), or None
    resume_from: Optional[str] = None
    #: ranks keep their shard of the data in memory (else Ray Data streams it)
    in_memory: bool = False
    cpus_per_worker: float = 1.0
    #: split name -> a split the driver holds or each rank reads itself (rayemb.train.held_splits); the others
    #: are Ray Datasets given to Ray Train
    held_splits: Mapping[str, Any] = field(default_factory=dict)
    #: feature name -> its statistics (a retrieval model's logQ correction reads its item column's own counts)
    table_stats: Mapping[str, Any] = field(default_factory=dict)
    #: the driver's metrics queue (``ray.util.queue.Queue``): rank 0 puts its step metrics there; None reports them
    metrics_queue: Any = None
    #: ``{"step", "marker", "mode"}`` of ``$RAYEMB_FAULT_INJECTION`` (tests of recovery), or None
    fault_injection: Optional[Dict[str, Any]] = None

    def batch(self, world: int) -> BatchShape:
        """This job's batch on ``world`` ranks."""
        return BatchShape(self.cfg.data.batch_size, world)

    def steps_per_epoch(self, world: int) -> int:
        """Steps per epoch on ``world`` ranks (the driver checked the largest world has one)."""
        return self.batch(world).steps_per_epoch(self.train_rows, self.cfg.train.max_steps_per_epoch)


__all__ = ["WorkerJob"]
