"""Carries metrics from the workers to the driver, the only MLflow writer.

Two paths feed one Ray queue that a driver thread drains into the
:class:`~rayemb.tracking.run_logger.RunLogger`:

- epoch reports (``ray.train.report``, with checkpoints): Ray Train v2 runs
  ``UserCallback.after_report`` in its controller actor, not in the driver, so
  :class:`ReportForwarder` only puts rank 0's metrics on the queue;
- step metrics: rank 0 puts them on the queue directly, fire and forget,
  because ``ray.train.report`` is a slow barrier across ranks.

Training never waits on MLflow.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Dict, List, Optional

import ray.train

logger = logging.getLogger(__name__)


#: when a worker made a report (ms since the epoch): the timestamp of the report's MLflow points. Reports reach
#: the queue by two paths (rank 0's step metrics directly, checkpoint reports through Ray Train's controller),
#: so the order they arrive in, and the time the driver logs them at, need not follow their steps.
WALL_TIME_MS = "rayemb.wall_time_ms"


def stamped(report: Dict[str, Any]) -> Dict[str, Any]:
    """``report`` with :data:`WALL_TIME_MS` set to now, where it has none (a copy)."""
    from rayemb.tracking.records import now_ms

    return {WALL_TIME_MS: now_ms(), **report}


class ReportForwarder(ray.train.UserCallback):
    """Puts rank 0's metrics of every report on ``queue`` (a ``ray.util.queue.Queue``)."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def after_report(self, run_context: Any, metrics: List[Dict[str, Any]], checkpoint: Optional[Any]) -> None:
        if not metrics:
            return
        try:
            self.queue.put_nowait(stamped(metrics[0]))  # as it reaches the controller: after it was made
        except Exception as e:  # a full or dead queue drops a point; it never fails training
            logger.warning("rayemb: dropped a metrics report (%s: %s)", type(e).__name__, e)

    def after_exception(self, run_context: Any, worker_exceptions: Dict[int, Exception]) -> None:
        """A worker's user error (bad data, a diverging loss, no data for the workers) ends the run now:
        it would repeat on every restart, so ``scaling.max_failures`` must not be spent on it."""
        from rayemb.errors import find_user_error

        for exc in worker_exceptions.values():
            user_error = find_user_error(exc)
            if user_error is not None:
                raise user_error


def numeric_metrics(report: Dict[str, Any]) -> Dict[str, float]:
    """The finite numeric entries of a report, as floats (step/epoch bookkeeping removed)."""
    out = {}
    for k, v in report.items():
        if k in ("step",) or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


#: what :meth:`QueueDrainer.stop` puts on the queue so that the thread's waiting ``get`` returns at once
WAKE = "rayemb.drainer.wake"


class QueueDrainer:
    """Driver-side thread: drains forwarded reports into a RunLogger and keeps the latest values."""

    def __init__(self, queue: Any, run_logger: Any, poll_s: float = 1.0, progress: Optional[Any] = None,
                 after_step: Optional[int] = None, on_report: Optional[Any] = None) -> None:
        self.queue = queue
        #: called with every report after it is logged (a sweep's trial hands its validations to Ray Tune)
        self.on_report = on_report
        #: reports at or before this step are kept but not logged (a continued run has them already)
        self.after_step = after_step
        self.run_logger = run_logger
        #: e.g. a :class:`rayemb.train.driver.progress.ProgressPrinter`: ``update(report)`` per report
        self.progress = progress
        self.poll_s = poll_s
        self.reports: List[Dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rayemb-metrics-drain", daemon=True)

    def start(self) -> "QueueDrainer":
        self._thread.start()
        return self

    def _handle(self, report: Dict[str, Any]) -> None:
        made = report.pop(WALL_TIME_MS, None)
        self.reports.append(report)
        step = int(report.get("step", 0))
        if self.after_step is None or step > self.after_step:
            self.run_logger.log_metrics(numeric_metrics(report), step=step,
                                        timestamp_ms=int(made) if isinstance(made, (int, float)) else None)
        if self.progress is not None:
            try:
                self.progress.update(report)
            except Exception as e:  # a progress line never fails a job
                logger.warning("rayemb: progress line failed (%s: %s)", type(e).__name__, e)
        if self.on_report is not None:
            self.on_report(report)

    def _drain_once(self, block: bool) -> bool:
        try:
            report = self.queue.get(block=block, timeout=self.poll_s if block else None)
        except Exception:
            return False
        if not (isinstance(report, str) and report == WAKE):
            self._handle(report)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain_once(block=True)

    def stop(self) -> List[Dict[str, Any]]:
        """Stops the thread and drains what is left; returns every report seen."""
        self._stop.set()
        try:  # else the thread's get waits out its poll_s: up to a second of every job's end
            self.queue.put(WAKE, block=False)
        except Exception:  # noqa: BLE001 - a queue that is gone: the thread's get times out as before
            pass
        self._thread.join(timeout=10)
        while self._drain_once(block=False):
            pass
        return self.reports
