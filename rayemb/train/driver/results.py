"""What a finished job's reports add up to: its step time against the prediction, its checkpoints."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from rayemb.train.worker.metrics import metric_score, primary_metric


#: the step-time figures :func:`step_time_check` names, besides the measured one
STEP_TIME_NAMES = ("predicted", "uncalibrated", "probed")


def step_time_check(reports: List[Dict[str, Any]], predicted: Optional[float],
                    probed: Optional[float] = None, uncalibrated: bool = False) -> Dict[str, float]:
    """Measured step time (median over log windows, each epoch's first window left out as warm-up) against the
    step-time model's prediction and, when the plan probe ran, the probe's median step of the trained plan.

    ``uncalibrated``: the prediction priced the plan with the built-in constants (plan.json ``prediction``), so
    it is named ``step_time_uncalibrated_*``, never ``step_time_predicted_*``: not the model's figure for this
    cluster."""
    import statistics

    windows, seen_epochs = [], set()
    for r in reports:
        if "step_time_s" not in r or r.get("epoch_end"):
            continue
        if r.get("epoch") not in seen_epochs:
            seen_epochs.add(r.get("epoch"))
            continue
        windows.append(float(r["step_time_s"]))
    if not windows or not (predicted or probed):
        return {}
    measured = statistics.median(windows)
    out = {"step_time_measured_s": measured}
    for name, value in (("uncalibrated" if uncalibrated else "predicted", predicted), ("probed", probed)):
        if value:
            out.update({f"step_time_{name}_s": float(value), f"step_time_{name}_over_measured": float(value) / measured})
    return out


def step_time_line(check: Dict[str, float]) -> str:
    """The driver's line for :func:`step_time_check`'s figures."""
    return f"rayemb: step time {1e3 * check['step_time_measured_s']:.1f} ms measured" + "".join(
        f", {1e3 * check[f'step_time_{name}_s']:.1f} ms {name} ({check[f'step_time_{name}_over_measured']:.2f}x)"
        for name in STEP_TIME_NAMES if f"step_time_{name}_s" in check)


def best_and_last_checkpoint(result: Any) -> Tuple[Optional[str], Optional[str]]:
    """(retained epoch-end checkpoint with the best validation metric, newest checkpoint) of a Ray Train result.

    The metric is the one early stopping followed (its ``best_<metric>`` report), compared in its direction
    (:func:`rayemb.train.worker.metrics.metric_score`: calibration closest to 1, NE and logloss lowest)."""
    import math

    last = result.checkpoint.path if result.checkpoint is not None else None
    kept = result.best_checkpoints or []
    metric = primary_metric({k for _, m in kept for k in m})
    scored = [(metric_score(metric, float(m[metric])), c.path) for c, m in kept
              if metric in m and math.isfinite(float(m[metric]))]
    best = max(scored)[1] if scored else last
    return best, last
