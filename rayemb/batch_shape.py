"""The shape of a training step's batch: ``local`` rows on each of ``world`` ranks.

The one place the global batch is a product and steps are a division, so a job, its
elastic worlds, its checkpoints and its progress line agree on them::

    >>> shape = BatchShape(local=256, world=2)
    >>> shape.global_size
    512
    >>> shape.steps_per_epoch(36_000), shape.steps_per_epoch(36_000, max_steps=50)
    (70, 50)
    >>> shape.resized(3).steps_in(512 * 10)   # another world size resumes at the same samples
    6
    >>> BatchShape.of_global(1024, world=4).local   # a what-if plan, given only the global batch
    256
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class BatchShape:
    #: rows per rank per step (``data.batch_size``)
    local: int
    #: ranks
    world: int

    @classmethod
    def of_global(cls, global_size: int, world: int) -> "BatchShape":
        """The shape whose ``world`` ranks share ``global_size`` rows per step: each rank's share rounded down, at
        least one row, as TorchRec's planner takes a rank's batch (a plan made from the global batch alone)."""
        return cls(max(1, global_size // world), world)

    @property
    def global_size(self) -> int:
        """Rows per step over every rank."""
        return self.local * self.world

    def steps_per_epoch(self, rows: int, max_steps: Optional[int] = None) -> int:
        """Full steps ``rows`` make (each rank's equal share of them, in local batches), at least 1, capped at
        ``max_steps`` (``train.max_steps_per_epoch``)."""
        steps = max(1, self.full_steps(rows))
        return min(steps, max_steps) if max_steps else steps

    def full_steps(self, rows: int) -> int:
        """Full steps ``rows`` make, possibly 0 (a split too small for one step)."""
        return rows // self.global_size

    def steps_in(self, samples: int) -> int:
        """Whole steps of this shape that ``samples`` already trained hold (rounded down)."""
        return samples // self.global_size

    def resized(self, world: int) -> "BatchShape":
        """The same local batch on ``world`` ranks (an elastic restart)."""
        return replace(self, world=world)


__all__ = ["BatchShape"]
