"""Progress lines the driver prints while a job trains (they show up in ``ray job logs``).

Fed by the driver thread that drains rank 0's metric reports::

    rayemb: epoch 1/2 step 140/702 (20%) loss 0.4731 | 23,400 samples/s | ETA 1m02s
    rayemb: epoch 1/2 done: valid_auc 0.9134 valid_logloss 0.4312 (best so far)

A line at most every ``min_interval_s`` seconds during an epoch, and one per
epoch end. The ETA counts the training steps left in the job at the rate seen
since the first report of this driver (so a resumed job is not misjudged), or at
the first report's own samples/s.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, Optional, TextIO


def format_duration(seconds: float) -> str:
    """``75`` -> ``"1m15s"``; ``3725`` -> ``"1h02m"``."""
    s = int(max(0.0, seconds) + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class ProgressPrinter:
    """Turns step and epoch-end reports into a few readable lines."""

    def __init__(self, epochs: int, steps_per_epoch: int, global_batch: int, min_interval_s: float = 5.0,
                 out: Optional[TextIO] = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = epochs * steps_per_epoch
        self.global_batch = global_batch
        self.min_interval_s = min_interval_s
        self.out = out
        self.clock = clock
        self._first: Optional[tuple] = None  # (time, step) of the first report seen
        self._last_print = float("-inf")
        self._best_score = float("-inf")

    def _print(self, line: str) -> None:
        print(f"rayemb: {line}", file=self.out or sys.stdout, flush=True)

    def eta_s(self, step: float, samples_per_s: Optional[float] = None) -> Optional[float]:
        """Seconds of training left: at the rate seen since the first report, else the report's own rate.

        ``step``: the steps done, counted in this printer's steps (at the job's first world size)."""
        now = self.clock()
        if self._first is not None and step > self._first[1] and now > self._first[0]:
            rate = (step - self._first[1]) / (now - self._first[0])
        elif samples_per_s:
            rate = samples_per_s / self.global_batch
        else:
            return None
        return max(0, self.total_steps - step) / rate

    def _position(self, report: Dict[str, Any]) -> tuple:
        """(step in the epoch, steps in the epoch, steps done in this printer's steps) of a report.

        A rank group restarted on another world size runs another number of steps per epoch (its global batch
        changed): reports then say where in the epoch they are (``epoch_step`` of ``epoch_steps``)."""
        step, epoch = int(report.get("step", 0)), int(report.get("epoch", 0))
        if "epoch_step" in report and report.get("epoch_steps"):
            in_epoch, per_epoch = int(report["epoch_step"]), int(report["epoch_steps"])
        else:
            in_epoch, per_epoch = step - epoch * self.steps_per_epoch, self.steps_per_epoch
        return in_epoch, per_epoch, (epoch + in_epoch / max(1, per_epoch)) * self.steps_per_epoch

    def update(self, report: Dict[str, Any]) -> None:
        epoch = int(report.get("epoch", 0))
        in_epoch, per_epoch, done = self._position(report)
        if self._first is None:
            self._first = (self.clock(), done)
        if report.get("epoch_end"):
            self._epoch_end(epoch, report)
            return
        if "train_loss" not in report:
            return
        now = self.clock()
        if now - self._last_print < self.min_interval_s:
            return
        self._last_print = now
        eta = self.eta_s(done, float(report["samples_per_s"]) if "samples_per_s" in report else None)
        parts = [
            f"epoch {epoch + 1}/{self.epochs} step {in_epoch}/{per_epoch} "
            f"({100.0 * in_epoch / max(1, per_epoch):.0f}%) loss {float(report['train_loss']):.4f}",
        ]
        if "samples_per_s" in report:
            parts.append(f"{float(report['samples_per_s']):,.0f} samples/s")
        parts.append(f"ETA {format_duration(eta)}" if eta is not None else "ETA ?")
        self._print(" | ".join(parts))

    def _epoch_end(self, epoch: int, report: Dict[str, Any]) -> None:
        from rayemb.train.worker.metrics import metric_score, primary_metric, secondary_metric

        metric = primary_metric(report)
        value = float(report.get(metric, float("nan")))
        note = ""
        if value == value and metric_score(metric, value) > self._best_score:  # in the metric's direction
            self._best_score = metric_score(metric, value)
            note = " (best so far)"
        elif f"best_{metric}" in report:
            note = f" (best {float(report[f'best_{metric}']):.4f} at epoch {int(report.get('best_epoch', 0)) + 1})"
        second = secondary_metric(metric)
        line = (f"epoch {epoch + 1}/{self.epochs} done: {metric} {value:.4f} "
                f"{second} {float(report.get(second, float('nan'))):.4f}{note}")
        if report.get("early_stopped"):
            line += f"; stopping early (no {metric} gain)"
        self._print(line)
        self._last_print = float("-inf")  # the next epoch's first report prints
