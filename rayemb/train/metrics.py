"""Evaluation metrics computed in numpy on gathered predictions, and what a finished job's reports add up to."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the Mann–Whitney U statistic, ties counted half (average ranks).

    Returns NaN when only one class is present.
    """
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(scores.size, dtype=np.float64)
    # average rank of each run of equal scores (1-based)
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy of logits, computed stably (log-sum-exp form)."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    z = np.asarray(logits, dtype=np.float64).ravel()
    return float(np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))


def step_time_check(reports: List[Dict[str, Any]], predicted: Optional[float],
                    model_predicted: Optional[float] = None) -> Dict[str, float]:
    """Measured step time (median over log windows, each epoch's first window left out as warm-up) vs predicted
    (and vs the step-time model's own prediction, when the plan probe's replaced it)."""
    import statistics

    windows, seen_epochs = [], set()
    for r in reports:
        if "step_time_s" not in r or r.get("epoch_end"):
            continue
        if r.get("epoch") not in seen_epochs:
            seen_epochs.add(r.get("epoch"))
            continue
        windows.append(float(r["step_time_s"]))
    if not windows or not predicted:
        return {}
    measured = statistics.median(windows)
    out = {"step_time_measured_s": measured, "step_time_predicted_s": float(predicted),
           "step_time_predicted_over_measured": float(predicted) / measured}
    if model_predicted:
        out.update({"step_time_model_predicted_s": float(model_predicted),
                    "step_time_model_predicted_over_measured": float(model_predicted) / measured})
    return out


def step_time_line(check: Dict[str, float]) -> str:
    """The driver's line for :func:`step_time_check`'s figures."""
    model = check.get("step_time_model_predicted_over_measured")
    return (f"rayemb: step time {1e3 * check['step_time_measured_s']:.1f} ms measured, "
            f"{1e3 * check['step_time_predicted_s']:.1f} ms predicted ({check['step_time_predicted_over_measured']:.2f}x)"
            + (f"; the step-time model alone {model:.2f}x" if model else ""))


def best_and_last_checkpoint(result: Any) -> Tuple[Optional[str], Optional[str]]:
    """(retained epoch-end checkpoint with the best valid_auc, newest checkpoint) of a Ray Train result."""
    last = result.checkpoint.path if result.checkpoint is not None else None
    scored = [(float(m["valid_auc"]), c.path) for c, m in (result.best_checkpoints or []) if "valid_auc" in m]
    best = max(scored)[1] if scored else last
    return best, last
