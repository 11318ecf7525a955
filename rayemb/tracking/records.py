"""Tracking records: what a ``RunLogger.log_*`` call turns into, and how a batch reaches MLflow.

A record is a small JSON-able dict, so it can wait in memory or in the spill
file (:mod:`rayemb.tracking.spill`) and be sent later. Its ``"k"`` says what it is:

=====  ==============  ===========================================
``k``  what            fields
=====  ==============  ===========================================
``m``  metric point    ``key``, ``v`` (float), ``ts`` (ms), ``step``
``p``  param           ``key``, ``v`` (str)
``t``  tag             ``key``, ``v`` (str)
``a``  artifact        ``path`` (file or folder), ``dst`` (folder in the run or None)
``x``  text artifact   ``text``, ``file``
=====  ==============  ===========================================

Keys are cleaned to what MLflow accepts and values truncated to its limits when
the record is made; URIs in params, tags and texts are redacted
(:mod:`rayemb.logs`), so no credential reaches the store or the spill file.

Example::

    >>> param_records({"train": {"epochs": 2}}, ts=0)
    [{'k': 'p', 'key': 'train.epochs', 'v': '2'}, {'k': 'm', 'key': 'param.train.epochs', 'v': 2.0, 'ts': 0, 'step': 0}]
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import re
import time
from typing import Any, Dict, List, Mapping, Optional

from rayemb.logs import redact_text, redact_uri
from rayemb.units import flatten

logger = logging.getLogger(__name__)

Record = Dict[str, Any]

#: numeric config values are also logged as metrics under this prefix (see RunLogger.log_params)
PARAM_METRIC_PREFIX = "param."

# ---- MLFLOW LIMITS (mlflow/utils/validation.py: MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH, ...) ---- #
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_PARAM_VALUE_CHARS = 6000
MAX_TAG_VALUE_CHARS = 8000
MAX_KEY_CHARS = 250

_INVALID_KEY_CHARS = re.compile(r"[^\w\-. :/]")
_KIND_NAMES = {"m": "metric", "p": "param", "t": "tag", "a": "artifact", "x": "text artifact"}


def now_ms() -> int:
    """Wall-clock time in milliseconds, MLflow's metric timestamp."""
    return int(time.time() * 1000)


def clean_key(key: Any) -> str:
    """A key MLflow accepts: invalid characters become ``_``, at most 250 characters."""
    return _INVALID_KEY_CHARS.sub("_", str(key))[:MAX_KEY_CHARS]


def param_records(params: Mapping[str, Any], ts: int) -> List[Record]:
    """A (nested) config as flattened params; finite numbers (and booleans) also as step-0 metrics
    ``param.<key>``, so MLflow filters can compare them as numbers."""
    recs: List[Record] = []
    for key, value in flatten(params).items():
        key = clean_key(key)
        recs.append({"k": "p", "key": key, "v": str(redact_uri(value))[:MAX_PARAM_VALUE_CHARS]})
        if isinstance(value, numbers.Real) and math.isfinite(float(value)):
            recs.append({"k": "m", "key": clean_key(PARAM_METRIC_PREFIX + key), "v": float(value), "ts": ts,
                         "step": 0})
    return recs


def metric_records(metrics: Mapping[str, Any], step: int, ts: int) -> List[Record]:
    """One point per metric at ``step``; a non-numeric value is skipped with a warning."""
    recs: List[Record] = []
    for key, value in metrics.items():
        try:
            v = float(value)
        except (TypeError, ValueError):
            logger.warning("rayemb tracking: metric %r has non-numeric value %r; skipped", key, value)
            continue
        recs.append({"k": "m", "key": clean_key(key), "v": v, "ts": ts, "step": int(step)})
    return recs


def tag_records(tags: Mapping[str, Any]) -> List[Record]:
    """Tags as strings, URIs redacted, truncated to MLflow's 8000 characters."""
    return [{"k": "t", "key": clean_key(k), "v": redact_text(str(v))[:MAX_TAG_VALUE_CHARS]} for k, v in tags.items()]


def artifact_record(local_path: str, artifact_path: Optional[str] = None) -> Record:
    return {"k": "a", "path": os.path.abspath(local_path), "dst": artifact_path}


def text_record(text: str, artifact_file: str) -> Record:
    return {"k": "x", "text": redact_text(str(text)), "file": artifact_file}


def describe(rec: Record) -> str:
    """``metric 'loss'``, ``artifact '/abs/plan.json'``: a record as a log line names it."""
    kind = _KIND_NAMES.get(rec.get("k"), "record")
    name = rec.get("key") or rec.get("path") or rec.get("file")
    return f"{kind} {name!r}"


def write_records(client: Any, run_id: str, batch: List[Record]) -> int:
    """Writes ``batch`` to run ``run_id`` through an ``MlflowClient``; raises what the client raises.

    Metrics, params and tags go in ``log_batch`` calls within MLflow's limits,
    then artifacts one by one. A param logged again with another value is
    dropped (params are immutable in MLflow: the first value stays); returns
    how many were dropped. For tags the last value wins.
    """
    from mlflow.entities import Metric, Param, RunTag

    dropped = 0
    metrics = [Metric(r["key"], r["v"], r["ts"], r["step"]) for r in batch if r["k"] == "m"]
    params: Dict[str, Any] = {}
    for r in (r for r in batch if r["k"] == "p"):
        if r["key"] not in params:
            params[r["key"]] = Param(r["key"], r["v"])
        elif params[r["key"]].value != r["v"]:
            dropped += 1
            logger.warning("rayemb tracking: param %r logged again with another value %r; dropped", r["key"], r["v"])
    tags = {r["key"]: RunTag(r["key"], r["v"]) for r in batch if r["k"] == "t"}
    for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=metrics[i:i + MAX_METRICS_PER_BATCH], synchronous=True)
    plist, tlist = list(params.values()), list(tags.values())
    for i in range(0, max(len(plist), len(tlist)), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=plist[i:i + MAX_PARAMS_TAGS_PER_BATCH],
                         tags=tlist[i:i + MAX_PARAMS_TAGS_PER_BATCH], synchronous=True)
    for r in batch:
        if r["k"] == "a":
            if os.path.isdir(r["path"]):
                client.log_artifacts(run_id, r["path"], r["dst"])
            elif os.path.exists(r["path"]):
                client.log_artifact(run_id, r["path"], r["dst"])
            else:
                logger.warning("rayemb tracking: artifact %s no longer exists; skipped", r["path"])
        elif r["k"] == "x":
            client.log_text(run_id, r["text"], r["file"])
    return dropped
