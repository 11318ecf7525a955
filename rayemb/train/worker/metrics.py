"""Evaluation metrics computed in numpy on gathered predictions."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

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


def logloss_sum(labels: np.ndarray, logits: np.ndarray) -> float:
    """Summed binary cross-entropy of logits, computed stably (log-sum-exp form)."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    z = np.asarray(logits, dtype=np.float64).ravel()
    return float(np.sum(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))


def logloss(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy of logits (:func:`logloss_sum` over the rows); NaN for no rows."""
    rows = np.asarray(labels).size
    return logloss_sum(labels, logits) / rows if rows else float("nan")


def validation_metrics(labels: np.ndarray, logits: np.ndarray, tasks: Optional[Sequence[str]] = None,
                       primary: Optional[str] = None) -> Dict[str, float]:
    """``valid_auc``, ``valid_logloss`` and ``valid_rows`` of every (label, logit) pair given (padding left out).

    Several ``tasks`` (``labels`` and ``logits`` of shape ``(N, T)``, columns in ``tasks`` order): each task's
    ``valid_auc.<task>`` and ``valid_logloss.<task>``, and ``valid_auc`` / ``valid_logloss`` are the
    ``primary`` task's (the first by default), the one early stopping and the best checkpoint follow."""
    labels, logits = np.asarray(labels), np.asarray(logits)
    if not tasks or len(tasks) == 1:
        labels, logits = labels.ravel(), logits.ravel()
        return {"valid_auc": auc(labels, logits), "valid_logloss": logloss(labels, logits),
                "valid_rows": float(labels.size)}
    labels, logits = labels.reshape(-1, len(tasks)), logits.reshape(-1, len(tasks))
    out: Dict[str, float] = {}
    for i, task in enumerate(tasks):
        out[f"valid_auc.{task}"] = auc(labels[:, i], logits[:, i])
        out[f"valid_logloss.{task}"] = logloss(labels[:, i], logits[:, i])
    main = primary or tasks[0]
    out.update({"valid_auc": out[f"valid_auc.{main}"], "valid_logloss": out[f"valid_logloss.{main}"],
                "valid_rows": float(labels.shape[0])})
    return out


def primary_metric(metrics: Any) -> str:
    """The validation metric early stopping and the best checkpoint follow in ``metrics`` (a report, a run's
    metrics): a ranking model's ``valid_auc``, a retrieval model's hit rate@50 (:mod:`rayemb.train.worker.retrieval`)."""
    from rayemb.train.worker.retrieval import RETRIEVAL_METRIC

    return RETRIEVAL_METRIC if RETRIEVAL_METRIC in metrics or f"best_{RETRIEVAL_METRIC}" in metrics else "valid_auc"


def secondary_metric(primary: str) -> str:
    """The metric the job's lines show beside ``primary``: a ranking model's logloss, a retrieval model's hit
    rate@10."""
    return "valid_logloss" if primary == "valid_auc" else "valid_hit_rate_at_10"
