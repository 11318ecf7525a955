"""Evaluation metrics computed in numpy on gathered predictions."""

from __future__ import annotations

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
