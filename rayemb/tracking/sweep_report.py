"""``rayemb compare --sweep``: a Ray Tune sweep's trials side by side, read back from MLflow.

A sweep is one parent run (tag ``rayemb.kind=sweep``) whose params name what it
searched: ``sweep.keys`` (comma-separated config keys), ``sweep.metric`` and
``sweep.mode`` (max|min). Each trial is a nested child run (tag
``mlflow.parentRunId``) holding the swept keys as params and the job's usual
metrics; a trial the scheduler stopped early ends KILLED, a crashed one FAILED.

:func:`load_sweep` turns that into a :class:`SweepReport`: one :class:`Trial`
per child with its best-so-far metric (the best value any validation logged,
by the sweep's mode: what the scheduler compared), steps trained and wall
time, best trial first. :func:`write_report` writes the table as CSV and
Markdown and draws one chart per swept key plus a parallel-coordinates chart.

Example::

    >>> report = load_sweep(MlflowClient(uri), "0123abcd...")
    >>> [t.run_id for t in report.trials][:1]          # the best trial's run
    ['4567ef...']
    >>> write_report(report, "runs/sweep-compare")
    ['runs/sweep-compare/sweep.csv', 'runs/sweep-compare/sweep.md', ...]
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rayemb.errors import TrackingError
from rayemb.tracking import plots
from rayemb.tracking.tags import (PARAM_SWEEP_KEYS, PARAM_SWEEP_METRIC, PARAM_SWEEP_MODE, SWEEP_MODES, TAG_KIND,
                                  TAG_PARENT_RUN_ID, TAG_TRIAL_ID)

SWEEP_KIND = "sweep"
#: statuses of a trial that trained and reported, whole or stopped early by the scheduler
SCORED_STATUSES = ("FINISHED", "KILLED")
#: the per-step training metric; its last step is how far a trial trained
STEP_METRIC = "train_loss"
CSV_FILE = "sweep.csv"
MARKDOWN_FILE = "sweep.md"
PARALLEL_FILE = "sweep_parallel.png"
_PAGE = 1000


@dataclass(frozen=True)
class Trial:
    """One child run of a sweep: where it went, what it tried, how it scored."""

    run_id: str
    trial_id: str
    status: str
    #: swept key -> the param's value as MLflow holds it (a string); missing keys are absent
    params: Dict[str, str]
    #: best value of the sweep metric over the trial's validations (None: it logged none)
    metric: Optional[float]
    #: last step the trial logged (0 if none)
    steps: int
    #: end minus start of the run (None while it runs)
    wall_s: Optional[float]
    start_time_ms: int


@dataclass(frozen=True)
class SweepReport:
    """A sweep's trials, best first: finished and early-stopped trials by their metric, then failed ones that
    logged it, then trials that logged none (in start order)."""

    parent_run_id: str
    keys: Tuple[str, ...]
    metric: str
    mode: str
    trials: Tuple[Trial, ...]

    @property
    def best(self) -> Optional[Trial]:
        """The best trial that finished or was stopped early and logged the metric (a failed one never wins)."""
        return next((t for t in self.trials if t.status in SCORED_STATUSES and t.metric is not None), None)

    def header(self) -> List[str]:
        return ["run_id", "trial", "status", *self.keys, self.metric, "steps", "wall_s"]

    def rows(self, digits: Optional[int] = 4) -> List[List[str]]:
        return [[t.run_id, t.trial_id, t.status, *(t.params.get(k, "-") for k in self.keys),
                 _fmt(t.metric, digits), str(t.steps), _fmt(t.wall_s, None if digits is None else 1)]
                for t in self.trials]

    def to_markdown(self) -> str:
        head = self.header()
        lines = [f"# Sweep {self.parent_run_id}: {self.metric} ({self.mode}), {len(self.trials)} trials\n",
                 "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(v.replace("|", "\\|") for v in r) + " |" for r in self.rows()]
        return "\n".join(lines) + "\n"

    def write_csv(self, path: str) -> str:
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(self.header())
            w.writerows(self.rows(digits=None))
        return path


def _fmt(v: Optional[float], digits: Optional[int]) -> str:
    if v is None:
        return "-"
    return repr(float(v)) if digits is None else f"{v:.{digits}f}"


def _best(values: Sequence[float], mode: str) -> Optional[float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    return max(finite) if mode == "max" else min(finite)


def _sweep_parent(client: Any, parent_run_id: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(parent_run_id)
    except MlflowException:
        raise TrackingError(f"MLflow run {parent_run_id!r} does not exist in this tracking store. Pass the sweep's "
                            "parent run id (`rayemb sweep` prints it) and the store it logged to (--tracking-uri).",
                            category="not_found") from None
    tags, params = run.data.tags, run.data.params
    if tags.get(TAG_KIND) != SWEEP_KIND:
        hint = ""
        parent = tags.get(TAG_PARENT_RUN_ID)
        if parent:
            hint = f" It is a child of run {parent!r}; pass that one if it is the sweep."
        raise TrackingError(f"MLflow run {parent_run_id!r} is not a sweep's parent run (its tag {TAG_KIND} is "
                            f"{tags.get(TAG_KIND)!r}, not {SWEEP_KIND!r}).{hint} Compare plain runs with "
                            "`rayemb compare --experiment NAME`.", category="not_a_sweep")
    if not params.get(PARAM_SWEEP_KEYS) or not params.get(PARAM_SWEEP_METRIC):
        raise TrackingError(f"MLflow run {parent_run_id!r} is a sweep without the params {PARAM_SWEEP_KEYS} and "
                            f"{PARAM_SWEEP_METRIC} (a grid of `rayemb train --sweep`). Compare its jobs with `rayemb "
                            f"compare --experiment NAME --filter \"tags.`{TAG_PARENT_RUN_ID}` = '{parent_run_id}'\"`.",
                            category="not_a_sweep")
    mode = params.get(PARAM_SWEEP_MODE, "max")
    if mode not in SWEEP_MODES:
        raise TrackingError(f"Sweep {parent_run_id!r} has {PARAM_SWEEP_MODE}={mode!r}; it must be one of {SWEEP_MODES}. The run "
                            "was not written by `rayemb sweep`.", category="not_a_sweep")
    return run


def _children(client: Any, parent: Any) -> List[Any]:
    from mlflow.entities import ViewType

    runs, token = [], None
    while True:
        page = client.search_runs([parent.info.experiment_id],
                                  f"tags.`{TAG_PARENT_RUN_ID}` = '{parent.info.run_id}'",
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=_PAGE, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def load_sweep(client: Any, parent_run_id: str) -> SweepReport:
    """The sweep whose parent run is ``parent_run_id``; :class:`TrackingError` if it is none or has no trial."""
    parent = _sweep_parent(client, parent_run_id)
    params = parent.data.params
    keys = tuple(k.strip() for k in params[PARAM_SWEEP_KEYS].split(",") if k.strip())
    metric, mode = params[PARAM_SWEEP_METRIC], params.get(PARAM_SWEEP_MODE, "max")
    children = _children(client, parent)
    if not children:
        raise TrackingError(f"Sweep {parent_run_id!r} has no trial runs (no run tagged {TAG_PARENT_RUN_ID}="
                            f"{parent_run_id}): it stopped before its first trial started, or its trials logged to "
                            "another store. Check --tracking-uri.", category="no_runs")
    trials = []
    for run in children:
        info = run.info
        history = client.get_metric_history(info.run_id, metric)
        value = _best([m.value for m in history], mode)
        if value is None and metric in run.data.metrics:
            value = _best([run.data.metrics[metric]], mode)
        steps = [m.step for key in (STEP_METRIC, metric) for m in
                 (history if key == metric else client.get_metric_history(info.run_id, key))]
        wall = (info.end_time - info.start_time) / 1000 if info.end_time and info.start_time else None
        trials.append(Trial(run_id=info.run_id, trial_id=run.data.tags.get(TAG_TRIAL_ID, "-"), status=info.status,
                            params={k: run.data.params[k] for k in keys if k in run.data.params}, metric=value,
                            steps=max(steps, default=0), wall_s=wall, start_time_ms=info.start_time or 0))
    sign = -1.0 if mode == "max" else 1.0
    # candidates for the best first, then failed trials that logged the metric, then trials without it
    trials.sort(key=lambda t: (t.metric is None, t.status not in SCORED_STATUSES,
                               sign * t.metric if t.metric is not None else 0.0, t.start_time_ms, t.run_id))
    return SweepReport(parent_run_id, keys, metric, mode, tuple(trials))


def _slug(s: str) -> str:
    return re.sub(r"[^\w.-]+", "_", s).strip("_") or "key"


def write_report(report: SweepReport, out_dir: str) -> List[str]:
    """The table (CSV, Markdown), one chart per swept key and a parallel-coordinates chart of the finished and
    early-stopped trials; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [report.write_csv(os.path.join(out_dir, CSV_FILE))]
    md = os.path.join(out_dir, MARKDOWN_FILE)
    with open(md, "w", encoding="utf-8") as f:
        f.write(report.to_markdown())
    paths.append(md)
    # a failed trial's metric is from a run that broke, not one the search should be read by: table only
    trials = [plots.TrialPoint(t.params, t.metric, t.status == "KILLED") for t in report.trials
              if t.status in SCORED_STATUSES]
    for key in report.keys:
        paths.append(plots.plot_trials_vs_param(trials, os.path.join(out_dir, f"sweep_{_slug(key)}.png"),
                                                key, report.metric, report.mode))
    paths.append(plots.plot_parallel_coordinates(trials, os.path.join(out_dir, PARALLEL_FILE), report.keys,
                                                 report.metric, report.mode))
    return paths


__all__ = ["CSV_FILE", "MARKDOWN_FILE", "PARALLEL_FILE", "SCORED_STATUSES", "SweepReport", "Trial", "load_sweep",
           "write_report"]
