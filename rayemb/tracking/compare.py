"""``rayemb compare``: compare the runs of an experiment without clicking through the UI.

For the runs of one experiment (optionally narrowed with an MLflow search
filter) it prints one row per run with the params whose values differ between
runs and the final value of the chosen metrics, writes the same table as
``compare.csv`` and ``compare.md``, and draws PNG charts: each metric's curve
overlaid for all runs, and the final metric against one param. ``--log-run``
stores all of it as a run named ``comparison`` in the same experiment
(tagged ``rayemb.kind=comparison``, so later comparisons skip it, as they skip
sweep parents).

Example::

    rayemb compare --experiment synth --metric auc --metric loss \\
        --filter "params.model.embedding_dim != '8'" --param model.embedding_dim \\
        --tracking-uri sqlite:////abs/runs/synth/mlflow.db --out runs/compare

A requested metric is matched by exact key, else by suffix, so ``--metric auc``
finds ``valid/auc`` or ``valid.auc`` when no run has a plain ``auc``.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from rayemb.config import TrackingConfig, resolve_path
from rayemb.constants import MLFLOW_DB_FILE, TRACKING_URI_ENV_VAR
from rayemb.errors import TrackingError
from rayemb.tracking import plots
from rayemb.tracking.store import sqlite_path, sqlite_uri
from rayemb.tracking.tags import TAG_KIND

logger = logging.getLogger(__name__)

DEFAULT_METRICS = ("loss", "auc")
DEFAULT_MAX_RUNS = 500
COMPARISON_RUN_NAME = "comparison"
#: runs of these kinds are bookkeeping, not training runs: never compared
SKIPPED_KINDS = ("comparison", "sweep")
CSV_FILE = "compare.csv"
MARKDOWN_FILE = "compare.md"


@dataclass
class Comparison:
    """A side-by-side view of runs: one row per run, columns = differing params, then final metrics."""

    run_ids: List[str]
    labels: List[str]
    statuses: List[str]
    #: params whose value differs between runs (missing counts as a value), sorted
    differing_params: List[str]
    #: number of params with one value in every run (not shown)
    equal_params: int
    #: resolved metric keys, in request order
    metric_keys: List[str]
    params: List[Dict[str, str]] = field(default_factory=list)
    finals: List[Dict[str, float]] = field(default_factory=list)

    def header(self) -> List[str]:
        return ["run", "run_id", "status"] + self.differing_params + self.metric_keys

    def rows(self, full_ids: bool = False, digits: Optional[int] = 4) -> List[List[str]]:
        out = []
        for i, run_id in enumerate(self.run_ids):
            row = [self.labels[i], run_id if full_ids else run_id[:8], self.statuses[i]]
            row += [self.params[i].get(p, "-") for p in self.differing_params]
            row += [_fmt(self.finals[i].get(k), digits) for k in self.metric_keys]
            out.append(row)
        return out

    def to_text(self) -> str:
        rows = [self.header()] + self.rows()
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def to_markdown(self) -> str:
        def esc(v: str) -> str:
            return v.replace("|", "\\|")

        lines = ["| " + " | ".join(esc(h) for h in self.header()) + " |",
                 "|" + "|".join("---" for _ in self.header()) + "|"]
        lines += ["| " + " | ".join(esc(v) for v in r) + " |" for r in self.rows()]
        return "\n".join(lines) + "\n"

    def write_csv(self, path: str) -> str:
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(self.header())
            w.writerows(self.rows(full_ids=True, digits=None))
        return path


def _fmt(v: Optional[float], digits: Optional[int]) -> str:
    if v is None:
        return "-"
    if digits is None:
        return repr(float(v))
    return f"{v:.{digits}f}" if abs(v) < 1e5 and (v == 0 or abs(v) >= 10 ** -digits) else f"{v:.{digits}g}"


def resolve_tracking_uri(value: Optional[str]) -> str:
    """``--tracking-uri`` (a URI or the path of an mlflow.db), else ``$MLFLOW_TRACKING_URI``, else the
    embedded store of the default output folder (``runs/mlflow.db`` under $RAYEMB_WORKSPACE or the cwd).

    A sqlite store must exist: opening a missing one would silently create an empty database.
    """
    uri = value or os.environ.get(TRACKING_URI_ENV_VAR)
    if not uri:
        default_db = os.path.join(resolve_path(TrackingConfig().output_dir), MLFLOW_DB_FILE)
        if not os.path.isfile(default_db):
            raise TrackingError(
                "No MLflow tracking store given to `rayemb compare`: neither --tracking-uri nor "
                f"${TRACKING_URI_ENV_VAR} is set, and the default embedded store {default_db} does not exist. "
                "Pass --tracking-uri with a server URL (http://host:5000) or the job's embedded store "
                "(sqlite:////abs/path/to/output_dir/mlflow.db, or just that file's path).",
                category="no_store",
            )
        uri = sqlite_uri(default_db)
        print(f"using the default embedded MLflow store {uri}")
    if "://" not in uri and not uri.startswith("sqlite:"):
        uri = sqlite_uri(uri)
    path = sqlite_path(uri)
    if path is not None and not os.path.isfile(path):
        raise TrackingError(
            f"The MLflow store {uri!r} does not exist (no file {path!r}). Point --tracking-uri at the "
            "mlflow.db of a job's output folder (the URI `rayemb train` logs at start), with an absolute "
            "path: sqlite:////abs/path/mlflow.db.",
            category="not_found",
        )
    return uri


def build_comparison(client: Any, experiment: str, filter_string: str = "",
                     metrics: Sequence[str] = DEFAULT_METRICS, max_runs: int = DEFAULT_MAX_RUNS) -> Comparison:
    """Searches ``experiment`` and builds the table; raises :class:`TrackingError` for user mistakes."""
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage == "deleted":
        names = sorted(e.name for e in client.search_experiments(max_results=50))
        raise TrackingError(
            f"MLflow experiment {experiment!r} does not exist in this tracking store. Known experiments: "
            f"{', '.join(names) or 'none'}. Pass one of them to --experiment (it is the `tracking.experiment` "
            "of the job config), or check --tracking-uri.",
            category="not_found",
        )
    try:
        runs = client.search_runs([exp.experiment_id], filter_string or "", run_view_type=ViewType.ACTIVE_ONLY,
                                  max_results=max_runs, order_by=["attributes.start_time DESC"])
    except MlflowException as e:
        raise TrackingError(
            f"The run filter {filter_string!r} is not a valid MLflow search filter: {e.message}. Use MLflow's "
            "syntax, e.g. \"params.`model.embedding_dim` = '16' and metrics.auc > 0.7\" (param values are "
            "strings; numeric settings are also metrics named `param.<key>`).",
            category="invalid_filter",
        ) from None
    runs = [r for r in reversed(runs) if r.data.tags.get(TAG_KIND) not in SKIPPED_KINDS]  # newest N, shown oldest first
    if not runs:
        raise TrackingError(
            f"No training runs in experiment {experiment!r} match the filter {filter_string!r}. Loosen or drop "
            "--filter, or check that the jobs logged to this tracking store.",
            category="no_runs",
        )
    all_params = sorted({k for r in runs for k in r.data.params})
    differing = [p for p in all_params if len({r.data.params.get(p) for r in runs}) > 1]
    metric_keys: List[str] = []
    all_metrics = sorted({k for r in runs for k in r.data.metrics})
    for name in metrics:
        keys = [name] if name in all_metrics else [
            k for k in all_metrics if k.endswith(("/" + name, "." + name, "_" + name))
            and not k.startswith(("param.", "system/"))]
        if not keys:
            logger.warning("no run logged a metric %r (known: %s)", name, ", ".join(all_metrics[:30]))
            keys = [name]
        metric_keys += [k for k in keys if k not in metric_keys]
    names = [r.info.run_name or r.info.run_id[:8] for r in runs]
    labels = [n if names.count(n) == 1 else f"{n}-{r.info.run_id[:6]}" for n, r in zip(names, runs)]
    return Comparison(
        run_ids=[r.info.run_id for r in runs], labels=labels, statuses=[r.info.status for r in runs],
        differing_params=differing, equal_params=len(all_params) - len(differing), metric_keys=metric_keys,
        params=[dict(r.data.params) for r in runs], finals=[dict(r.data.metrics) for r in runs],
    )


def _slug(s: str) -> str:
    return re.sub(r"[^\w.-]+", "_", s).strip("_") or "metric"


def write_charts(client: Any, comp: Comparison, out_dir: str, param: Optional[str]) -> List[str]:
    """Curves per metric overlaid for all runs, and final metric vs ``param``; returns the PNG paths."""
    paths = []
    for key in comp.metric_keys:
        series = {label: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
                  for label, run_id in zip(comp.labels, comp.run_ids)}
        paths.append(plots.plot_curves(series, os.path.join(out_dir, f"curves_{_slug(key)}.png"),
                                       title=f"{key} per run", ylabel=key))
    if param:
        for key in comp.metric_keys:
            points = [(comp.params[i].get(param, "-"), comp.finals[i].get(key, math.nan), comp.labels[i])
                      for i in range(len(comp.run_ids))]
            paths.append(plots.plot_final_vs_param(
                points, os.path.join(out_dir, f"final_{_slug(key)}_vs_{_slug(param)}.png"), param=param, metric=key))
    return paths
