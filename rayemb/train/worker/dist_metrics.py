"""Exact validation AUC and logloss over every rank's rows, with each row's score sent once.

Gathering every logit to every rank (``all_gather_object``: pickled, ``world`` copies of the whole split)
grows with the split and the world. The AUC needs only, for each positive, the negatives scored below it
(ties count half), so the ranks sort their scores together instead (a sample sort):

1. every rank sends ``world - 1`` quantiles of its scores; the pooled quantiles' own quantiles split the score
   line into ``world`` ranges, one per rank (equal scores always fall in one range);
2. one ``all_to_all`` sends each (score, label) pair to the rank of its range;
3. each rank counts, per distinct score of its range, positives and negatives, and adds up
   ``2 * pos * (negatives below) + pos * (negatives equal)`` plus its positives times the negatives of all
   lower ranges (an all-gather of two counts per rank);
4. one all-reduce of integers sums it: the AUC is that sum over ``2 * P * N``, exactly the Mann-Whitney
   statistic with average ranks for ties that :func:`rayemb.train.worker.metrics.auc` computes on one process.

Logloss is a sum over rows, all-reduced. Integers are int64: exact up to about four billion rows.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np


def _world() -> Tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _splitters(scores: np.ndarray, world: int) -> np.ndarray:
    """``world - 1`` increasing score boundaries, agreed by every rank."""
    import torch
    import torch.distributed as dist

    q = np.linspace(0, 1, world + 1)[1:-1]
    mine = np.quantile(scores, q) if scores.size else np.full(len(q), np.nan)
    every = [torch.zeros(len(q), dtype=torch.float64) for _ in range(world)]
    dist.all_gather(every, torch.from_numpy(mine.astype(np.float64)))
    pooled = np.sort(np.concatenate([t.numpy() for t in every]))
    pooled = pooled[~np.isnan(pooled)]
    return np.quantile(pooled, q) if pooled.size else np.zeros(len(q))


def _exchange(scores: np.ndarray, labels: np.ndarray, splitters: np.ndarray, world: int) -> np.ndarray:
    """This rank's range of every rank's (score, label) pairs, as an (m, 2) float64 array."""
    import torch
    import torch.distributed as dist

    dest = np.searchsorted(splitters, scores, side="left")  # equal scores: one destination
    order = np.argsort(dest, kind="stable")
    send = np.stack([scores[order], labels[order]], axis=1).astype(np.float64).ravel()
    counts = np.bincount(dest, minlength=world).astype(np.int64)
    recv_counts = torch.zeros(world, dtype=torch.int64)
    dist.all_to_all_single(recv_counts, torch.from_numpy(counts))
    out = torch.zeros(int(recv_counts.sum()) * 2, dtype=torch.float64)
    dist.all_to_all_single(out, torch.from_numpy(send), output_split_sizes=(recv_counts * 2).tolist(),
                           input_split_sizes=(counts * 2).tolist())
    return out.numpy().reshape(-1, 2)


def _auc_terms(scores: np.ndarray, positive: np.ndarray) -> Tuple[int, int, int]:
    """(2 * sum over positives of negatives below + half the ties, positives, negatives) within one range."""
    if not scores.size:
        return 0, 0, 0
    values, inverse = np.unique(scores, return_inverse=True)
    pos = np.bincount(inverse, weights=positive, minlength=len(values)).astype(np.int64)
    neg = np.bincount(inverse, weights=~positive, minlength=len(values)).astype(np.int64)
    below = np.concatenate([[0], np.cumsum(neg)[:-1]])
    return int((2 * pos * below + pos * neg).sum()), int(pos.sum()), int(neg.sum())


def distributed_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC of every rank's ``(scores, labels)`` (ties half; NaN with one class), every rank calling it."""
    import torch
    import torch.distributed as dist

    from rayemb.train.worker.metrics import auc

    rank, world = _world()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).astype(bool).ravel()
    if world == 1:
        return auc(labels, scores)
    mine = _exchange(scores, labels, _splitters(scores, world), world)
    twice, pos, neg = _auc_terms(mine[:, 0], mine[:, 1] > 0.5)
    counts = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([pos, neg], dtype=torch.int64))
    negatives_below = sum(int(c[1]) for c in counts[:rank])  # every lower range's negatives score below ours
    total = torch.tensor([twice + 2 * pos * negatives_below], dtype=torch.int64)
    dist.all_reduce(total)
    p, n = sum(int(c[0]) for c in counts), sum(int(c[1]) for c in counts)
    return float(int(total) / (2.0 * p * n)) if p and n else float("nan")


def distributed_validation_metrics(labels: np.ndarray, logits: np.ndarray, tasks: Optional[Sequence[str]] = None,
                                   primary: Optional[str] = None) -> Dict[str, float]:
    """:func:`rayemb.train.worker.metrics.validation_metrics` of every rank's rows together, no row gathered whole:
    the same keys and values (AUC exact; logloss to float64 rounding)."""
    import torch
    import torch.distributed as dist

    from rayemb.train.worker.metrics import logloss_sum

    _, world = _world()
    tasks = list(tasks or [])
    columns = max(1, len(tasks))
    labels = np.asarray(labels, np.float64).reshape(-1, columns)
    logits = np.asarray(logits, np.float64).reshape(-1, columns)
    sums = torch.tensor([float(labels.shape[0])] + [logloss_sum(labels[:, i], logits[:, i]) for i in range(columns)],
                        dtype=torch.float64)
    if world > 1:
        dist.all_reduce(sums)
    rows = float(sums[0])
    out: Dict[str, float] = {}
    names = tasks if len(tasks) > 1 else [""]
    for i, task in enumerate(names):
        suffix = f".{task}" if task else ""
        out[f"valid_auc{suffix}"] = distributed_auc(logits[:, i], labels[:, i])
        out[f"valid_logloss{suffix}"] = float(sums[1 + i]) / rows if rows else float("nan")
    if len(tasks) > 1:
        main = primary or tasks[0]
        out.update({"valid_auc": out[f"valid_auc.{main}"], "valid_logloss": out[f"valid_logloss.{main}"]})
    out["valid_rows"] = rows
    return out


__all__ = ["distributed_auc", "distributed_validation_metrics"]
