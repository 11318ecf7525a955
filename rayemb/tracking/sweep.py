"""Sweeps: ``rayemb train --config JOB.yaml --sweep key=v1,v2 [--sweep key2=a,b]``.

A sweep runs one training job per point of the grid (the Cartesian product of
all ``--sweep`` value lists), each as an MLflow child run under one parent run
(tag ``rayemb.kind=sweep``) so the UI nests them and ``rayemb compare`` can
filter on the parent (``--filter "tags.mlflow.parentRunId = '<id>'"``).
Jobs run one after another: each already uses the whole cluster.

Example::

    >>> parse_sweep("model.embedding_dim=8,16,32")
    ('model.embedding_dim', ['8', '16', '32'])
    >>> parse_sweep("model.bottom_mlp=[64,16],[32,16]")     # commas inside brackets belong to a value
    ('model.bottom_mlp', ['[64,16]', '[32,16]'])
"""

from __future__ import annotations

import itertools
import logging
from typing import Callable, List, Optional, Sequence, Tuple

from rayemb.errors import ConfigError
from rayemb.tracking.run_logger import RunLogger
from rayemb.tracking.tags import TAG_KIND

logger = logging.getLogger(__name__)

_OPEN, _CLOSE = "[{(", "]})"


def _split_top_level(values: str) -> List[str]:
    """Splits on commas outside brackets and quotes (values are YAML, like ``--set`` values)."""
    out, cur, depth, quote = [], [], 0, None
    for ch in values:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def parse_sweep(spec: str) -> Tuple[str, List[str]]:
    """``"key=v1,v2"`` -> ``("key", ["v1", "v2"])``; raises :class:`ConfigError` for a malformed spec."""
    key, sep, values = spec.partition("=")
    key = key.strip()
    fix = "Write it as --sweep section.key=value1,value2 (e.g. --sweep model.embedding_dim=8,16)."
    if not sep or not key:
        raise ConfigError(f"Invalid --sweep {spec!r}: it has no 'key=' part. {fix}", category="invalid_sweep")
    vals = _split_top_level(values)
    if any(v == "" for v in vals):
        raise ConfigError(f"Invalid --sweep {spec!r}: it has an empty value. {fix}", category="invalid_sweep")
    if len(set(vals)) != len(vals):
        raise ConfigError(f"Invalid --sweep {spec!r}: a value is repeated, which would run the same job twice. {fix}",
                          category="invalid_sweep")
    return key, vals


def run_sweep(
    base_overrides: Sequence[str],
    sweep_specs: Sequence[str],
    run_one: Callable[[List[str], Optional[str]], int],
    tracking_uri: str,
    experiment: str,
) -> int:
    """Runs ``run_one(overrides, parent_run_id)`` once per grid point under a new parent run.

    ``overrides`` is ``base_overrides`` followed by one ``key=value`` per sweep
    key, so a swept key wins over the same key in ``base_overrides``. A failing
    child (non-zero return) does not stop the sweep; the parent ends FAILED
    with the failed points as its reason, and the first non-zero code is
    returned. An exception from ``run_one`` ends the parent FAILED (KILLED for
    Ctrl-C) and propagates. ``parent_run_id`` is None only if the tracking
    store was unreachable when the sweep started (children then run unnested).
    """
    parsed = [parse_sweep(s) for s in sweep_specs]
    keys = [k for k, _ in parsed]
    if not parsed:
        raise ConfigError("run_sweep got no --sweep spec. Pass at least one --sweep key=v1,v2.",
                          category="invalid_sweep")
    if len(set(keys)) != len(keys):
        raise ConfigError(f"--sweep names the same key twice ({', '.join(keys)}). Give each key once, with all "
                          "its values: --sweep key=v1,v2,v3.", category="invalid_sweep")
    grid = list(itertools.product(*[vals for _, vals in parsed]))
    parent = RunLogger(tracking_uri, experiment, run_name="sweep-" + "-".join(k.split(".")[-1] for k in keys),
                       tags={TAG_KIND: "sweep", "rayemb.sweep": " ".join(sweep_specs)},
                       system_metrics_interval_s=None).start()
    parent.log_params({"sweep": {k: ",".join(v) for k, v in parsed}, "sweep_points": len(grid),
                       "base_overrides": " ".join(base_overrides)})
    if parent.run_id is None:
        logger.warning("sweep parent run could not be created at %s; children will not be nested", parent.shown_uri)
    logger.info("sweep over %s: %d jobs (parent run %s)", ", ".join(keys), len(grid), parent.run_id)

    failed: List[str] = []
    first_rc = 0
    for i, point in enumerate(grid):
        overrides = list(base_overrides) + [f"{k}={v}" for k, v in zip(keys, point)]
        label = " ".join(f"{k}={v}" for k, v in zip(keys, point))
        logger.info("sweep job %d/%d: %s", i + 1, len(grid), label)
        try:
            rc = run_one(overrides, parent.run_id)
        except BaseException as e:
            status = "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED"
            parent.finish(status, reason=f"job {i + 1}/{len(grid)} ({label}) raised {type(e).__name__}: {e}")
            raise
        if rc != 0:
            failed.append(f"{label} (exit {rc})")
            first_rc = first_rc or rc
        parent.log_metrics({"sweep.jobs_done": i + 1, "sweep.jobs_failed": len(failed)}, step=i)
    if failed:
        parent.finish("FAILED", reason=f"{len(failed)} of {len(grid)} sweep jobs failed: " + "; ".join(failed))
    else:
        parent.finish("FINISHED")
    return first_rc
