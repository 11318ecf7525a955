"""The best trial of a sweep, and exporting its model as ``rayemb export --run-id`` does.

The best trial is chosen by the sweep's own metric and mode (params
``sweep.metric`` and ``sweep.mode`` of the parent run) among the trials that
FINISHED or were stopped early (KILLED) and logged that metric; each trial
counts with the best value any of its validations reached, the value the
scheduler compared. A FAILED trial never wins.

Example::

    >>> best_trial("0123abcd...", "sqlite:////abs/runs/mlflow.db")
    '4567ef...'
    >>> export_best("0123abcd...", "criteo-dlrm", "sqlite:////abs/runs/mlflow.db", out="models/criteo")
    {'run_id': '4567ef...', 'registered': 'criteo-dlrm', 'version': '3', ...}
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Optional

from rayemb.errors import TrackingError


def _best_of(parent_run_id: str, uri: str) -> str:
    from mlflow import MlflowClient

    from rayemb.tracking.sweep_report import SCORED_STATUSES, load_sweep

    report = load_sweep(MlflowClient(uri), parent_run_id)
    if report.best is None:
        statuses = ", ".join(sorted({t.status for t in report.trials}))
        raise TrackingError(f"No trial of sweep {parent_run_id!r} ended {' or '.join(SCORED_STATUSES)} with the "
                            f"metric {report.metric!r} logged ({len(report.trials)} trials: {statuses}); there is "
                            "no best model to take. Look at the failed trials' rayemb.failure_reason tags.",
                            category="no_runs")
    return report.best.run_id


def best_trial(parent_run_id: str, tracking_uri: Optional[str] = None) -> str:
    """Run id of the best trial of the sweep whose parent run is ``parent_run_id``.

    ``tracking_uri``: a URI or an mlflow.db path (default: ``$MLFLOW_TRACKING_URI``, else ``runs/mlflow.db``).
    """
    from rayemb.tracking.compare import resolve_tracking_uri

    return _best_of(parent_run_id, resolve_tracking_uri(tracking_uri))


def export_best(parent_run_id: str, name: str, tracking_uri: Optional[str] = None, out: Optional[str] = None,
                checkpoint_kind: str = "best") -> Dict[str, Any]:
    """Exports the best trial's checkpoint and registers it as a new version of model ``name``.

    This is :func:`rayemb.serve.export.source_from_run` and :func:`rayemb.serve.export.export_model`, the path of
    ``rayemb export --run-id RUN --register NAME``, so the model is logged to the trial's run. ``out``: the
    directory for ``model.pt`` + ``model.json`` (``rayemb predict --model``); None keeps only the logged and
    registered copy. Returns the export summary (``run_id``, ``model_uri``, ``version``, ...).
    """
    from rayemb.serve.export import check_out, export_model, source_from_run
    from rayemb.tracking.compare import resolve_tracking_uri

    if not name:
        raise TrackingError("export_best needs a registered model name to add the best trial's model to.",
                            category="invalid_arguments")
    if out is not None:
        check_out(out)  # a bad --out is refused before the sweep is read
    uri = resolve_tracking_uri(tracking_uri)
    source = source_from_run(_best_of(parent_run_id, uri), uri, checkpoint_kind)
    if out is not None:
        return export_model(source, out, register=name)
    with tempfile.TemporaryDirectory(prefix="rayemb-export-best-") as tmp:
        summary = export_model(source, os.path.join(tmp, "model"), register=name)
    return {**summary, "out": None, "published": None}


__all__ = ["best_trial", "export_best"]
