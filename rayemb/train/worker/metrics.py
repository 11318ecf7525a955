"""Evaluation metrics computed in numpy on gathered predictions.

A binary task reports AUC, logloss, NE and calibration (GAUC with a group column); a regression task (schema.yaml
``task_types``) RMSE and MAE of its raw output. With row weights (schema.yaml ``weight``), logloss, NE,
calibration, RMSE and MAE are weighted (every row's term times its weight, over the summed weights) and AUC
counts each (positive, negative) pair ``w_pos * w_neg`` (:func:`weighted_auc`); GAUC stays unweighted.
"""

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


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Probabilities of logits, computed without overflow."""
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def entropy(p: float) -> float:
    """Binary entropy (nats) of a positive rate ``p``: the logloss of always predicting ``p``; NaN at 0 or 1."""
    return float(-(p * np.log(p) + (1 - p) * np.log1p(-p))) if 0.0 < p < 1.0 else float("nan")


def normalized_entropy(mean_logloss: float, positive_rate: float) -> float:
    """NE: the mean logloss over the entropy of the split's positive rate (below 1: better than the base rate)."""
    return float(mean_logloss / entropy(positive_rate)) if np.isfinite(entropy(positive_rate)) else float("nan")


def ne(labels: np.ndarray, logits: np.ndarray) -> float:
    """Normalized entropy of logits against binary labels (:func:`normalized_entropy`); NaN with one class."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    return normalized_entropy(logloss(y, logits), float(y.mean())) if y.size else float("nan")


def calibration(labels: np.ndarray, logits: np.ndarray) -> float:
    """Sum of predicted probabilities over the sum of labels (1: as many clicks predicted as seen); NaN with no
    positive."""
    positives = float(np.sum(np.asarray(labels, dtype=np.float64)))
    return float(np.sum(sigmoid(logits)) / positives) if positives else float("nan")


def weighted_auc_terms(scores: np.ndarray, positive: np.ndarray,
                       weights: np.ndarray) -> "tuple[float, float, float]":
    """(sum over (positive, negative) pairs with the negative below of ``w_pos * w_neg``, ties half; the positives'
    weight; the negatives' weight) of some rows."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(positive).astype(bool).ravel()
    w = np.asarray(weights, dtype=np.float64).ravel()
    if not s.size:
        return 0.0, 0.0, 0.0
    values, inverse = np.unique(s, return_inverse=True)
    pos = np.bincount(inverse, weights=np.where(y, w, 0.0), minlength=len(values))
    neg = np.bincount(inverse, weights=np.where(y, 0.0, w), minlength=len(values))
    below = np.concatenate([[0.0], np.cumsum(neg)[:-1]])
    return float(np.sum(pos * (below + 0.5 * neg))), float(pos.sum()), float(neg.sum())


def weighted_auc(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray) -> float:
    """ROC AUC with row weights: each (positive, negative) pair counted ``w_pos * w_neg`` (ties half); unit
    weights give :func:`auc`. NaN when either class weighs nothing."""
    pairs, pos, neg = weighted_auc_terms(scores, labels, weights)
    return pairs / (pos * neg) if pos > 0 and neg > 0 else float("nan")


def weighted_binary_sums(labels: np.ndarray, logits: np.ndarray, weights: np.ndarray) -> "tuple[float, float, float]":
    """(sum w * logloss, sum w * label, sum w * predicted probability) of the rows: the sums weighted logloss, NE
    and calibration are made of."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    z = np.asarray(logits, dtype=np.float64).ravel()
    w = np.asarray(weights, dtype=np.float64).ravel()
    loss = np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
    return float(np.sum(w * loss)), float(np.sum(w * y)), float(np.sum(w * sigmoid(z)))


def regression_sums(labels: np.ndarray, outputs: np.ndarray,
                    weights: Optional[np.ndarray] = None) -> "tuple[float, float]":
    """(sum w * squared error, sum w * absolute error) of raw outputs against real labels (``weights`` None: 1)."""
    err = np.asarray(outputs, dtype=np.float64).ravel() - np.asarray(labels, dtype=np.float64).ravel()
    w = 1.0 if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    return float(np.sum(w * err * err)), float(np.sum(w * np.abs(err)))


def rmse(labels: np.ndarray, outputs: np.ndarray, weights: Optional[np.ndarray] = None) -> float:
    """Root of the (weighted) mean squared error of raw outputs; NaN for no rows or zero total weight."""
    total = float(np.asarray(labels).size if weights is None else np.sum(np.asarray(weights, dtype=np.float64)))
    return float(np.sqrt(regression_sums(labels, outputs, weights)[0] / total)) if total > 0 else float("nan")


def mae(labels: np.ndarray, outputs: np.ndarray, weights: Optional[np.ndarray] = None) -> float:
    """The (weighted) mean absolute error of raw outputs; NaN for no rows or zero total weight."""
    total = float(np.asarray(labels).size if weights is None else np.sum(np.asarray(weights, dtype=np.float64)))
    return regression_sums(labels, outputs, weights)[1] / total if total > 0 else float("nan")


def group_auc_terms(groups: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> "tuple[float, float]":
    """(sum over groups with both classes of rows x AUC, their rows), each group's AUC as :func:`auc` computes it
    (ties half), vectorized: one sort by (group, score)."""
    g = np.asarray(groups, dtype=np.int64).ravel()
    y = np.asarray(labels).astype(bool).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if not g.size:
        return 0.0, 0.0
    order = np.lexsort((s, g))
    g, y, s = g[order], y[order], s[order]
    new_group = np.concatenate([[True], g[1:] != g[:-1]])
    new_run = new_group | np.concatenate([[True], s[1:] != s[:-1]])  # a run: equal (group, score)
    run = np.cumsum(new_run) - 1
    group = np.cumsum(new_group) - 1
    position = np.arange(g.size, dtype=np.float64)
    group_start = position[new_group][group]
    run_first = position[new_run]
    run_size = np.bincount(run).astype(np.float64)
    rank = (run_first - group_start[new_run] + (run_size + 1) / 2.0)[run]  # 1-based average rank in its group
    pos = np.bincount(group, weights=y).astype(np.float64)
    rows = np.bincount(group).astype(np.float64)
    neg = rows - pos
    rank_sum = np.bincount(group, weights=np.where(y, rank, 0.0))
    both = (pos > 0) & (neg > 0)
    group_auc = (rank_sum[both] - pos[both] * (pos[both] + 1) / 2.0) / (pos[both] * neg[both])
    return float(np.sum(rows[both] * group_auc)), float(np.sum(rows[both]))


def gauc(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> float:
    """Group AUC: each group's :func:`auc` over the groups holding both classes, weighted by the group's rows
    (impressions); NaN when no group holds both."""
    g = np.asarray(groups).ravel()
    y = np.asarray(labels).astype(bool).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    total, weight = 0.0, 0
    for value in np.unique(g):
        inside = g == value
        if 0 < y[inside].sum() < inside.sum():
            total += inside.sum() * auc(y[inside], s[inside])
            weight += int(inside.sum())
    return total / weight if weight else float("nan")


def validation_metrics(labels: np.ndarray, logits: np.ndarray, tasks: Optional[Sequence[str]] = None,
                       primary: Optional[str] = None, groups: Optional[np.ndarray] = None,
                       task_types: Optional[Sequence[str]] = None,
                       weights: Optional[np.ndarray] = None) -> Dict[str, float]:
    """``valid_auc``, ``valid_logloss``, ``valid_ne``, ``valid_calibration`` and ``valid_rows`` of every
    (label, logit) pair given (padding left out); with ``groups`` (schema.yaml ``group``), ``valid_gauc``.

    Several ``tasks`` (``labels`` and ``logits`` of shape ``(N, T)``, columns in ``tasks`` order): each task's
    ``valid_<metric>.<task>``, and the unsuffixed ones are the ``primary`` task's (the first by default), the one
    early stopping and the best checkpoint follow. ``task_types``: each task's ``binary`` (the default) or
    ``regression`` (``valid_rmse`` and ``valid_mae`` instead); ``weights``: each row's weight (module docstring)."""
    labels, logits = np.asarray(labels), np.asarray(logits)
    columns = len(tasks) if tasks else 1
    labels, logits = labels.reshape(-1, columns), logits.reshape(-1, columns)
    names = list(tasks) if tasks and len(tasks) > 1 else [""]
    kinds = list(task_types or ["binary"] * columns)
    w = None if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    out: Dict[str, float] = {}
    for i, task in enumerate(names):
        suffix = f".{task}" if task else ""
        y, z = labels[:, i], logits[:, i]
        if kinds[i] == "regression":
            out[f"valid_rmse{suffix}"] = rmse(y, z, w)
            out[f"valid_mae{suffix}"] = mae(y, z, w)
            continue
        out[f"valid_auc{suffix}"] = auc(y, z) if w is None else weighted_auc(y, z, w)
        if w is not None:
            total = float(w.sum())
            loss, positives, predicted = weighted_binary_sums(y, z, w)
            mean_loss = loss / total if total > 0 else float("nan")
            out[f"valid_logloss{suffix}"] = mean_loss
            out[f"valid_ne{suffix}"] = normalized_entropy(mean_loss, positives / total) if total > 0 else float("nan")
            out[f"valid_calibration{suffix}"] = predicted / positives if positives else float("nan")
            if groups is not None:
                out[f"valid_gauc{suffix}"] = gauc(y, z, groups)
            continue
        out[f"valid_logloss{suffix}"] = logloss(y, z)
        out[f"valid_ne{suffix}"] = ne(y, z)
        out[f"valid_calibration{suffix}"] = calibration(y, z)
        if groups is not None:
            out[f"valid_gauc{suffix}"] = gauc(y, z, groups)
    if len(names) > 1:
        main = primary or names[0]
        out.update({k.split(".")[0]: v for k, v in list(out.items()) if k.endswith(f".{main}")})
    out["valid_rows"] = float(labels.shape[0])
    return out


#: how a validation metric improves: ``max`` (higher is better), ``min`` (lower), ``one`` (closer to 1)
METRIC_GOALS: Dict[str, str] = {
    "valid_auc": "max", "valid_gauc": "max", "valid_logloss": "min", "valid_ne": "min", "valid_calibration": "one",
    "valid_rmse": "min", "valid_mae": "min",
}


def metric_goal(name: str) -> str:
    """How ``name`` (``valid_ne``, ``valid_ne.click``, a retrieval hit rate) improves (:data:`METRIC_GOALS`)."""
    base = name.split(".")[0]
    if base.startswith("valid_hit_rate_at_"):
        return "max"
    if base not in METRIC_GOALS:
        raise KeyError(f"{name!r} is not a validation metric with a known direction ({sorted(METRIC_GOALS)}, "
                       "valid_hit_rate_at_K)")
    return METRIC_GOALS[base]


def metric_score(name: str, value: float) -> float:
    """``value`` of metric ``name`` on one higher-is-better scale: itself, its negation, or ``-|value - 1|``."""
    goal = metric_goal(name)
    return float(value) if goal == "max" else -float(value) if goal == "min" else -abs(float(value) - 1.0)


def primary_metric(metrics: Any) -> str:
    """The validation metric early stopping and the best checkpoint follow in ``metrics`` (a report, a run's
    metrics): the one its ``best_<metric>`` names (``train.early_stopping_metric``), else a ranking model's
    ``valid_auc``, a retrieval model's hit rate@50 (:mod:`rayemb.train.worker.retrieval`)."""
    from rayemb.train.worker.retrieval import RETRIEVAL_METRIC

    named = sorted(k[len("best_"):] for k in metrics if k.startswith("best_valid_"))
    if named:
        return named[0]
    return RETRIEVAL_METRIC if RETRIEVAL_METRIC in metrics else "valid_auc"


def secondary_metric(primary: str) -> str:
    """The metric the job's lines show beside ``primary``: a ranking model's logloss (a regression task's MAE or
    RMSE), a retrieval model's hit rate@10."""
    if primary.startswith("valid_hit_rate_at_"):
        return "valid_hit_rate_at_10"
    if primary.split(".")[0] in ("valid_rmse", "valid_mae"):
        return "valid_mae" if primary.split(".")[0] == "valid_rmse" else "valid_rmse"
    return "valid_logloss" if primary != "valid_logloss" else "valid_auc"
