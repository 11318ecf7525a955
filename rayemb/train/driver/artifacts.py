"""What a job leaves behind: stats.json, split.json, plan.json and charts, written and logged to its MLflow run.

Charts never fail a job: a plotting error is a warning.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Dict, List

logger = logging.getLogger(__name__)


def log_stats_and_split(run_logger: Any, stats: Any, split: Any, job_dir: str, chart: bool = True) -> None:
    """Writes stats.json, split.json and (``chart``) the frequency chart under ``job_dir`` and logs them to the
    run."""
    from rayemb.data.stats_io import write_stats_json

    run_logger.log_artifact(write_stats_json(stats, os.path.join(job_dir, "stats.json")))
    split_path = os.path.join(job_dir, "split.json")
    with open(split_path, "w") as f:
        f.write(to_json(split.to_dict()))
    run_logger.log_artifact(split_path)
    for name, t in split.tables.items():
        run_logger.log_metrics({f"split.hot_rows.{name}": float(t.num_hot), f"split.hot_share.{name}": t.hot_share},
                               step=0)
    if chart:
        log_frequencies_chart(run_logger, stats, job_dir)


def log_frequencies_chart(run_logger: Any, stats: Any, job_dir: str) -> None:
    from rayemb.data.stats_report import plot_frequencies

    try:
        run_logger.log_artifact(plot_frequencies(stats, os.path.join(job_dir, "frequencies.png")), "charts")
    except Exception as e:  # a chart never fails a job
        logger.warning("could not plot frequencies: %s", e)


def log_plan(run_logger: Any, summary: Dict[str, Any], job_dir: str, chart: bool = True) -> None:
    """plan.json, (``chart``) the plan's per-rank chart, and its headline numbers as metrics."""
    path = os.path.join(job_dir, "plan.json")
    with open(path, "w") as f:
        f.write(to_json(summary))
    run_logger.log_artifact(path)
    run_logger.log_metrics({"plan.predicted_bytes_per_step": float(summary["predicted_bytes_per_step"])}, step=0)
    if chart:
        log_plan_chart(run_logger, job_dir)


def log_plan_chart(run_logger: Any, job_dir: str) -> None:
    """The per-rank chart of the plan.json :func:`log_plan` wrote under ``job_dir``."""
    from rayemb.planner import load_plan_json, plot_plan

    try:
        path = os.path.join(job_dir, "plan.json")
        run_logger.log_artifact(plot_plan(load_plan_json(path), os.path.join(job_dir, "plan.png")), "charts")
    except Exception as e:  # a chart never fails a job
        logger.warning("could not draw the plan chart: %s", e)


def start_job_charts(run_logger: Any, stats: Any, job_dir: str) -> threading.Thread:
    """The plan's and the frequencies' charts drawn and logged in a thread, beside the workers' start (a second
    or two of matplotlib that nothing before training needs); join it before the run ends."""
    def draw() -> None:
        log_plan_chart(run_logger, job_dir)
        log_frequencies_chart(run_logger, stats, job_dir)

    thread = threading.Thread(target=draw, name="rayemb-job-charts", daemon=True)
    thread.start()
    return thread


def log_charts(run_logger: Any, reports: List[Dict[str, Any]], job_dir: str) -> None:
    """Loss/AUC curves and peak memory per rank, as PNGs under ``job_dir`` and in the run's charts/."""
    from rayemb.tracking.callback import numeric_metrics
    from rayemb.tracking.plots import plot_memory_per_rank, plot_training_curves

    history: Dict[str, List[Any]] = {}
    for r in reports:
        for k, v in numeric_metrics(r).items():
            history.setdefault(k, []).append((r.get("step", 0), v))
    try:
        curves = plot_training_curves(history, os.path.join(job_dir, "training_curves.png"), metrics=("loss", "auc"))
        run_logger.log_artifact(curves, "charts")
        peaks = [r for r in reports if any(k.startswith("peak_memory_bytes.") for k in r)]
        if peaks:
            last = peaks[-1]
            ranks = sorted((int(k.rsplit("rank", 1)[1]), v) for k, v in last.items() if k.startswith("peak_memory_bytes."))
            mem = plot_memory_per_rank([v for _, v in ranks], os.path.join(job_dir, "memory_per_rank.png"))
            run_logger.log_artifact(mem, "charts")
    except Exception as e:  # a chart never fails a job
        logger.warning("could not draw training charts: %s", e)


def to_json(d: Dict[str, Any]) -> str:
    return json.dumps(d, indent=2, sort_keys=True)
