"""Experiment tracking with MLflow: the driver's run writer, and the tools around it.

Importing this package is cheap (no mlflow, ray or torch): MLflow is imported
only when a store is opened. One concept per module:

==================  =============================================================
module              what it does
==================  =============================================================
``run_logger``      :class:`RunLogger`, the asynchronous writer that never slows or fails training
``records``         the records a ``log_*`` call makes, and writing a batch of them to MLflow
``spill``           the JSONL spill file that holds records while the server is away
``backoff``         when to try an unreachable store again
``store``           tracking URIs, the embedded sqlite store, MLflow client env defaults
``tags``            tag names and the tags every run carries
``host``            host CPU/memory utilisation as system metrics
``callback``        carries worker metrics to the driver (imports ``ray.train``)
``compare``         ``rayemb compare``: runs side by side, tables and charts
``plots``           PNG charts (imports matplotlib)
``sweep``           ``rayemb train --sweep`` specs as the grid ``rayemb sweep`` runs
``sweep_report``    ``rayemb compare --sweep``: a sweep's trials best first, tables and charts
==================  =============================================================

Example::

    >>> from rayemb.tracking import RunLogger, default_tracking_uri, ensure_store
    >>> uri = default_tracking_uri("runs/synth")        # $MLFLOW_TRACKING_URI, else sqlite:////abs/runs/synth/mlflow.db
    >>> ensure_store(uri)
    >>> rl = RunLogger(uri, "synth", run_name="dp-vs-hybrid").start()
    >>> rl.log_metrics({"loss": 0.69}, step=0)
    >>> rl.finish()
    True
"""

from __future__ import annotations

from typing import Any

from rayemb.tracking.host import DEFAULT_SYSTEM_METRICS_INTERVAL_S
from rayemb.tracking.records import PARAM_METRIC_PREFIX
from rayemb.tracking.run_logger import RunLogger
from rayemb.tracking.store import default_tracking_uri, ensure_store
from rayemb.tracking.tags import (
    TAG_CLUSTER_SHAPE,
    TAG_FAILURE_REASON,
    TAG_GIT_COMMIT,
    TAG_GIT_DIRTY,
    TAG_KIND,
    TAG_PARENT_RUN_ID,
    TAG_PLAN_FINGERPRINT,
    TAG_RUN_NAME,
    TAG_VERSION,
    standard_tags,
)

#: names served from modules that import heavy libraries, loaded on first use
_LAZY = {
    "QueueDrainer": "rayemb.tracking.callback",
    "ReportForwarder": "rayemb.tracking.callback",
}

__all__ = [
    "DEFAULT_SYSTEM_METRICS_INTERVAL_S",
    "PARAM_METRIC_PREFIX",
    "QueueDrainer",
    "ReportForwarder",
    "RunLogger",
    "TAG_CLUSTER_SHAPE",
    "TAG_FAILURE_REASON",
    "TAG_GIT_COMMIT",
    "TAG_GIT_DIRTY",
    "TAG_KIND",
    "TAG_PARENT_RUN_ID",
    "TAG_PLAN_FINGERPRINT",
    "TAG_RUN_NAME",
    "TAG_VERSION",
    "default_tracking_uri",
    "ensure_store",
    "standard_tags",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
