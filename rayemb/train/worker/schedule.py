"""Learning-rate schedules (``train.lr_schedule``) as a pure function of the global step.

The factor of step ``s`` (the count of steps taken before it, 0 for a job's first) depends on nothing but ``s``,
the job's total steps and the schedule, so a job resumed from a checkpoint taken after step ``s`` continues the
schedule exactly where it stood: no scheduler state is saved or restored.

Every learning rate of the step follows the factor: the dense optimizer's, the replicated rows' and the fused
embedding optimizer's (TorchRec's fused FBGEMM optimizer copies its param group's ``lr`` into the kernel's
learning rate at ``zero_grad`` and ``step``, and FBGEMM's lookup takes it along in the forward for the backward's
update). :class:`LrSchedule` sets them before each step's forward, followed by a ``zero_grad``: a Python float
written into the param groups, no read from the device.

Example::

    >>> sched = {"kind": "cosine", "warmup_steps": 2, "min_lr_ratio": 0.0, "step_size": 1, "gamma": 1.0}
    >>> [round(lr_factor(s, 6, sched), 3) for s in range(6)]
    [0.5, 1.0, 1.0, 0.854, 0.5, 0.146]
"""

from __future__ import annotations

import math
from typing import Any, List, Mapping


def lr_factor(step: int, total_steps: int, schedule: Mapping[str, Any]) -> float:
    """The factor of the base learning rates at ``step`` (0-based: steps taken before this one) of a job of
    ``total_steps`` steps, under ``schedule`` (``train.lr_schedule``, every key filled in).

    Warmup: step ``s < warmup_steps`` takes ``(s + 1) / warmup_steps``. After it, ``constant`` keeps 1;
    ``cosine`` and ``linear`` go from 1 at the first step after warmup to ``min_lr_ratio`` at ``total_steps``;
    ``step`` multiplies by ``gamma`` every ``step_size`` steps after warmup.
    """
    warmup = int(schedule["warmup_steps"])
    if step < warmup:
        return (step + 1) / warmup
    kind, after = schedule["kind"], step - warmup
    if kind == "constant":
        return 1.0
    if kind == "step":
        return float(schedule["gamma"]) ** (after // int(schedule["step_size"]))
    floor = float(schedule["min_lr_ratio"])
    progress = min(1.0, after / max(1, total_steps - warmup))
    if kind == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if kind == "linear":
        return 1.0 - (1.0 - floor) * progress
    raise ValueError(f"unknown learning-rate schedule {kind!r}")


def is_constant(schedule: Mapping[str, Any]) -> bool:
    """True when the schedule leaves every learning rate at its base value (no warmup, constant)."""
    return schedule["kind"] == "constant" and int(schedule["warmup_steps"]) == 0


class LrSchedule:
    """Sets the learning rates of ``optimizer``'s param groups (a ``CombinedOptimizer`` holds the fused embedding
    optimizer's, the dense optimizer's and the replicated rows') to their base value times :func:`lr_factor`.

    The base values are the groups' learning rates when it is made (the config's), so it is made before a
    checkpoint's optimizer state is loaded. :meth:`start` places it at the job's global step (a resumed job's
    checkpoint step); each :meth:`apply` sets the rates of the next step and moves on one step.
    """

    def __init__(self, optimizer: Any, schedule: Mapping[str, Any]) -> None:
        self.optimizer, self.schedule = optimizer, dict(schedule)
        self.base: List[float] = [float(g["lr"]) for g in optimizer.param_groups]
        self.step, self.total_steps = 0, 1

    def start(self, step: int, total_steps: int) -> None:
        """The next :meth:`apply` sets the rates of ``step`` (0-based) of a job of ``total_steps`` steps."""
        self.step, self.total_steps = int(step), max(1, int(total_steps))

    def factor(self) -> float:
        """The factor of the next step."""
        return lr_factor(self.step, self.total_steps, self.schedule)

    def apply(self) -> float:
        """Sets the learning rates of the next step and counts it; returns the factor set."""
        f = self.factor()
        # the groups are read anew: loading a checkpoint's optimizer state replaces their dicts
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = base * f
        self.step += 1
        return f


__all__ = ["LrSchedule", "is_constant", "lr_factor"]
