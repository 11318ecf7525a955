"""What a training checkpoint records of the job that wrote it: where it was, what planned it, early stopping.

The training loop writes a :class:`CheckpointMeta` into every checkpoint's
``meta.json`` (:func:`rayemb.checkpoint.store.save_logical` adds the store's own
entries: format, tables, files, RNG states); everything that reads a checkpoint's
position or provenance reads it back through :meth:`CheckpointMeta.from_dict`, so
the key names and the defaults of checkpoints written before an entry existed live
here only::

    >>> meta = CheckpointMeta(epoch=1, step=130, epoch_complete=False, epoch_samples=30 * 512)
    >>> meta.next_epoch, meta.skip_steps(BatchShape(local=256, world=2))
    (1, 30)
    >>> CheckpointMeta.from_dict({"epoch": 0, "step": 3}).epoch_complete   # older: epoch ends only
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, TypeVar

from rayemb.batch_shape import BatchShape
from rayemb.data.transforms import CHECKPOINT_KEY as DENSE_TRANSFORMS_KEY
from rayemb.errors import DataError

#: early-stopping entries besides ``best_<metric>``
_EARLY_STOPPING_KEYS = ("best_epoch", "epochs_without_gain")

_T = TypeVar("_T")


def _is_early_stopping(key: str) -> bool:
    return key.startswith("best_") or key in _EARLY_STOPPING_KEYS


@dataclass(frozen=True)
class CheckpointMeta:
    """A checkpoint's position, provenance and early-stopping state (the training part of its ``meta.json``).

    ``None`` stands for an entry the checkpoint does not have (written before it existed); it
    is left out of :meth:`to_dict` so a checkpoint read and written again has the same entries.
    """

    #: the epoch the checkpoint was written in (0-based)
    epoch: int = 0
    #: optimizer steps taken, all epochs
    step: int = 0
    #: written at the end of ``epoch`` (else in the middle of it, after ``epoch_samples``)
    epoch_complete: bool = True
    #: samples of ``epoch`` already trained, over every rank
    epoch_samples: int = 0
    #: the plan's fingerprint (:attr:`rayemb.train.worker_job.WorkerJob.plan_fingerprint`)
    plan_fingerprint: Optional[str] = None
    #: rows per step over every rank when it was written
    global_batch: Optional[int] = None
    #: table -> placement name of the plan that wrote it
    placements: Optional[Mapping[str, str]] = None
    #: the world size the plan was made for
    world_size_planned: Optional[int] = None
    #: ``best_<metric>``, ``best_epoch``, ``epochs_without_gain`` (:class:`rayemb.train.worker.loop.EarlyStopping`)
    early_stopping: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: dense column -> its schema.yaml transform (:func:`rayemb.data.transforms.checkpoint_entry`)
    dense_transforms: Optional[Mapping[str, Any]] = None
    #: ranks that wrote it (the store records it; a value given here is replaced on saving)
    world_size: Optional[int] = None

    def __post_init__(self) -> None:
        bad = sorted(k for k in self.early_stopping if not _is_early_stopping(k))
        if bad:
            raise ValueError(f"CheckpointMeta.early_stopping: {bad} are not early-stopping entries (best_<metric>, "
                             f"{', '.join(_EARLY_STOPPING_KEYS)})")

    def at(self, *, epoch: int, step: int, epoch_complete: bool, epoch_samples: int,
           early_stopping: Mapping[str, Any]) -> "CheckpointMeta":
        """This job's meta at a checkpoint: where it is now, and its early stopping's state."""
        return dataclasses.replace(self, epoch=epoch, step=step, epoch_complete=epoch_complete,
                                   epoch_samples=epoch_samples, early_stopping=dict(early_stopping))

    @property
    def next_epoch(self) -> int:
        """The first epoch a job resumed from it runs."""
        return self.epoch + int(self.epoch_complete)

    def trained_all(self, epochs: int) -> bool:
        """Whether it ends the last of ``epochs`` (``train.epochs``): a resume has nothing left to train."""
        return self.epoch_complete and self.epoch + 1 >= epochs

    def skip_steps(self, shape: BatchShape) -> int:
        """Steps of :attr:`next_epoch` already trained, in steps of ``shape`` (any world size: rounded down)."""
        return 0 if self.epoch_complete else shape.steps_in(self.epoch_samples)

    def to_dict(self) -> Dict[str, Any]:
        """The ``meta.json`` entries (JSON types; early stopping's at the top level, as they were always written)."""
        out: Dict[str, Any] = {"epoch": self.epoch, "step": self.step, "epoch_complete": self.epoch_complete,
                               "epoch_samples": self.epoch_samples}
        optional = {"plan_fingerprint": self.plan_fingerprint, "global_batch": self.global_batch,
                    "placements": None if self.placements is None else dict(self.placements),
                    "world_size_planned": self.world_size_planned, "world_size": self.world_size,
                    DENSE_TRANSFORMS_KEY: None if self.dense_transforms is None else dict(self.dense_transforms)}
        out.update({k: v for k, v in optional.items() if v is not None})
        out.update(self.early_stopping)
        return out

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any], shown: str = "the checkpoint") -> "CheckpointMeta":
        """The entries of a checkpoint's ``meta.json`` (the store's own ones ignored).

        A checkpoint written before an entry existed reads as it always did: at the end of
        its epoch, with no samples into the next, no plan recorded. ``shown`` names the
        checkpoint in the :class:`~rayemb.errors.DataError` (``bad_checkpoint``) an entry of
        the wrong type raises.
        """
        def read(key: str, kind: Callable[[Any], _T], default: Optional[_T]) -> Optional[_T]:
            value = meta.get(key)
            if value is None:
                return default
            try:
                return kind(value)
            except (TypeError, ValueError):
                raise DataError(f"{shown} has meta.json entry {key!r} = {value!r}, not a {kind.__name__}: it was "
                                "not written by rayemb. Use another checkpoint, or start fresh.",
                                category="bad_checkpoint") from None

        return cls(epoch=read("epoch", int, 0), step=read("step", int, 0),
                   epoch_complete=read("epoch_complete", bool, True), epoch_samples=read("epoch_samples", int, 0),
                   plan_fingerprint=read("plan_fingerprint", str, None), global_batch=read("global_batch", int, None),
                   placements=read("placements", dict, None),
                   world_size_planned=read("world_size_planned", int, None),
                   early_stopping={k: v for k, v in meta.items() if _is_early_stopping(k)},
                   dense_transforms=read(DENSE_TRANSFORMS_KEY, dict, None), world_size=read("world_size", int, None))


__all__ = ["CheckpointMeta", "DENSE_TRANSFORMS_KEY"]
