"""Where a job's wall time goes: the driver's stages, then the workers' start, steps and the end.

The driver marks the end of each of its stages (inputs checked, Ray up, statistics, plan with its calibration
and probe, MLflow run started). Each epoch's report carries rank 0's wall clock at four points (``clock.*``):
the training function started, the model sharded and restored, the epoch's first step, its last step. From
those the job's time splits into phases::

    rayemb: phases: checks 0.1 s | ray 2.9 s | statistics 0.3 s | plan 4.2 s | tracking 0.8 s | workers 5.1 s |
            model 4.0 s | data 1.2 s | steps 12.4 s | validation and checkpoints 1.9 s | end 3.0 s (wall 36.0 s, ...)

``statistics``: the kept statistics read (the train split's fingerprint taken once), or the pass; ``plan``: the
split, calibration and plan probe (or the kept ones) and the TorchRec plan, made in the driver; ``tracking``: the
job's files and what the MLflow run gets, handed to the RunLogger (a new run in a store that exists is created by
its writer thread, and the plan's and statistics' charts drawn by another, both beside the workers' start);
``workers``: from the Ray Train launch to the training function running on rank 0 (Ray Train's controller, the
worker processes); ``plan wait``: rank 0 waiting for its job, when the workers were launched before the plan and
the MLflow run were ready (:mod:`rayemb.train.driver.handoff`: those two stages then run beside the workers'
start, and this is what of them the start did not hide); ``model``: the rest of the time to the model sharded and
restored (imports, the process group's first collectives, the model and its sharding); ``data``: reading this
rank's shard before the first step (in memory: all of it); ``steps``: every epoch's first to last step;
``validation and checkpoints``: between epochs; ``end``: after the last epoch's steps (its validation, checkpoint, Ray Train's shutdown, MLflow's last
writes). Each is logged to MLflow as ``phase_s.<name>``, with ``phase_s.outside_steps_fraction``.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

DRIVER_STAGES = ("checks", "ray", "statistics", "plan", "tracking")


class JobPhases:
    """The driver's clock over one job (:meth:`mark` after each stage, :meth:`summary` at the end)."""

    def __init__(self) -> None:
        self.start = time.time()
        self._last = self.start
        self.stages: Dict[str, float] = {}
        self.launched: Optional[float] = None

    def mark(self, stage: str) -> None:
        now = time.time()
        self.stages[stage] = now - self._last
        self._last = now

    def add(self, stage: str, seconds: float) -> None:
        """``seconds`` more of ``stage``, spent beside the others (in a thread of the driver's, beside the workers'
        start): its own figure, not a mark on the driver's clock."""
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds

    def launch(self) -> None:
        """The worker group is being launched (what precedes was the driver's own stages)."""
        self.launched = time.time()

    def summary(self, reports: Sequence[Mapping[str, Any]], end: Optional[float] = None) -> Dict[str, float]:
        """Seconds per phase (module docstring), and the wall time; worker phases only when epochs reported."""
        end = time.time() if end is None else end
        out = dict(self.stages)
        epochs = [r for r in reports if r.get("epoch_end") and "clock.epoch_start_unix_s" in r]
        if self.launched is not None and epochs:
            # an elastic restart reports epochs again: each epoch's last report counts
            by_epoch: Dict[Any, Mapping[str, Any]] = {r.get("epoch"): r for r in epochs}
            ordered: List[Mapping[str, Any]] = [by_epoch[e] for e in sorted(by_epoch)]
            first, last = ordered[0], ordered[-1]
            steps = sum(r["clock.epoch_steps_end_unix_s"] - r["clock.epoch_start_unix_s"] for r in ordered)
            started = first.get("clock.loop_start_unix_s", first["clock.ready_unix_s"])
            out["workers"] = max(0.0, started - self.launched)
            out["plan_wait"] = first.get("clock.plan_wait_s", 0.0)
            out["model"] = max(0.0, first["clock.ready_unix_s"] - started - out["plan_wait"])
            out["data"] = max(0.0, first["clock.epoch_start_unix_s"] - first["clock.ready_unix_s"])
            out["steps"] = steps
            span = last["clock.epoch_steps_end_unix_s"] - first["clock.epoch_start_unix_s"]
            out["validation_and_checkpoints"] = max(0.0, span - steps)
            out["end"] = max(0.0, end - last["clock.epoch_steps_end_unix_s"])
        out["wall"] = end - self.start
        if "steps" in out and out["wall"] > 0:
            out["outside_steps_fraction"] = 1.0 - out["steps"] / out["wall"]
        return out

    def report(self, reports: Sequence[Mapping[str, Any]], run_logger: Any) -> Dict[str, float]:
        """Prints the job's line of phases and logs them to its MLflow run; returns them as ``phase_s.*``."""
        metrics = {f"phase_s.{k}": v for k, v in self.summary(reports).items()}
        run_logger.log_metrics(metrics, step=0)
        print(phases_line({k[len("phase_s."):]: v for k, v in metrics.items()}), flush=True)
        return metrics


def phases_line(phases: Mapping[str, float]) -> str:
    """The job's one line of phases (module docstring)."""
    names = [*DRIVER_STAGES, "workers", "plan_wait", "model", "data", "steps", "validation_and_checkpoints", "end"]
    parts = [f"{n.replace('_', ' ')} {phases[n]:.1f} s" for n in names if n in phases]
    tail = f" (wall {phases['wall']:.1f} s" + (f", {100 * phases['outside_steps_fraction']:.0f} % outside steps)"
                                                 if "outside_steps_fraction" in phases else ")")
    return "rayemb: phases: " + " | ".join(parts) + tail


__all__ = ["JobPhases", "phases_line", "DRIVER_STAGES"]
