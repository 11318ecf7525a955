"""Exact validation AUC, GAUC, logloss, NE and calibration over every rank's rows, with each row's score sent once.

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

Logloss, NE and calibration are sums over rows (logloss, labels, predicted probabilities), all-reduced; so are a
regression task's RMSE and MAE (squared and absolute errors) and, with row weights, every one of those sums
weighted plus the weights' own sum: exact to float64 rounding. The weighted AUC counts each (positive,
negative) pair ``w_pos * w_neg``: the same sample sort, weights sent with the pairs and summed in float64. GAUC
stays unweighted. GAUC
sends each (group, score, label) row once, to the rank its group id falls to (``group mod world``): every rank
then holds whole groups, adds up rows x AUC of its groups with both classes
(:func:`rayemb.train.worker.metrics.group_auc_terms`) and one all-reduce sums them. Integers are int64: exact up
to about four billion rows.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

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


def _exchange(scores: np.ndarray, labels: np.ndarray, splitters: np.ndarray, world: int,
              weights: Optional[np.ndarray] = None) -> np.ndarray:
    """This rank's range of every rank's (score, label) pairs, as an (m, 2) float64 array; with ``weights``,
    (score, label, weight) triples, (m, 3)."""
    import torch
    import torch.distributed as dist

    dest = np.searchsorted(splitters, scores, side="left")  # equal scores: one destination
    order = np.argsort(dest, kind="stable")
    columns = [scores[order], labels[order]] + ([] if weights is None else [weights[order]])
    width = len(columns)
    send = np.stack(columns, axis=1).astype(np.float64).ravel()
    counts = np.bincount(dest, minlength=world).astype(np.int64)
    recv_counts = torch.zeros(world, dtype=torch.int64)
    dist.all_to_all_single(recv_counts, torch.from_numpy(counts))
    out = torch.zeros(int(recv_counts.sum()) * width, dtype=torch.float64)
    dist.all_to_all_single(out, torch.from_numpy(send), output_split_sizes=(recv_counts * width).tolist(),
                           input_split_sizes=(counts * width).tolist())
    return out.numpy().reshape(-1, width)


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


def distributed_weighted_auc(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> float:
    """Weighted ROC AUC (:func:`rayemb.train.worker.metrics.weighted_auc`: each (positive, negative) pair counted
    ``w_pos * w_neg``, ties half) of every rank's rows, every rank calling it; float64 sums instead of integers."""
    import torch
    import torch.distributed as dist

    from rayemb.train.worker.metrics import weighted_auc, weighted_auc_terms

    rank, world = _world()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).astype(bool).ravel()
    weights = np.asarray(weights, dtype=np.float64).ravel()
    if world == 1:
        return weighted_auc(labels, scores, weights)
    mine = _exchange(scores, labels, _splitters(scores, world), world, weights)
    pairs, pos, neg = weighted_auc_terms(mine[:, 0], mine[:, 1] > 0.5, mine[:, 2])
    every = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(every, torch.tensor([pos, neg], dtype=torch.float64))
    below = sum(float(c[1]) for c in every[:rank])  # every lower range's negative weight scores below ours
    total = torch.tensor([pairs + pos * below], dtype=torch.float64)
    dist.all_reduce(total)
    p, n = sum(float(c[0]) for c in every), sum(float(c[1]) for c in every)
    return float(total) / (p * n) if p > 0 and n > 0 else float("nan")


def distributed_gauc(groups: np.ndarray, scores: np.ndarray, labels: np.ndarray) -> float:
    """Group AUC (:func:`rayemb.train.worker.metrics.gauc`) of every rank's rows, every rank calling it."""
    import torch
    import torch.distributed as dist

    from rayemb.train.worker.metrics import group_auc_terms

    _, world = _world()
    groups = np.asarray(groups, dtype=np.int64).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels, dtype=np.float64).ravel()
    if world > 1:
        dest = np.mod(groups, world)
        order = np.argsort(dest, kind="stable")
        counts = torch.from_numpy(np.bincount(dest, minlength=world).astype(np.int64))
        recv = torch.zeros(world, dtype=torch.int64)
        dist.all_to_all_single(recv, counts)
        got_groups = torch.zeros(int(recv.sum()), dtype=torch.int64)
        dist.all_to_all_single(got_groups, torch.from_numpy(np.ascontiguousarray(groups[order])),
                               output_split_sizes=recv.tolist(), input_split_sizes=counts.tolist())
        pairs = np.stack([scores[order], labels[order]], axis=1).ravel()
        got_pairs = torch.zeros(int(recv.sum()) * 2, dtype=torch.float64)
        dist.all_to_all_single(got_pairs, torch.from_numpy(pairs), output_split_sizes=(recv * 2).tolist(),
                               input_split_sizes=(counts * 2).tolist())
        groups, (scores, labels) = got_groups.numpy(), got_pairs.numpy().reshape(-1, 2).T
    weighted, rows = group_auc_terms(groups, labels > 0.5, scores)
    sums = torch.tensor([weighted, rows], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(sums)
    return float(sums[0]) / float(sums[1]) if float(sums[1]) else float("nan")


def _task_sums(y: np.ndarray, z: np.ndarray, kind: str, w: Optional[np.ndarray]) -> Tuple[float, float, float]:
    """A task's three summed terms: binary (logloss, labels, predicted probabilities), regression (squared
    errors, absolute errors, 0); each row's times its weight when ``w`` is given."""
    from rayemb.train.worker.metrics import logloss_sum, regression_sums, sigmoid, weighted_binary_sums

    if kind == "regression":
        return (*regression_sums(y, z, w), 0.0)
    if w is not None:
        return weighted_binary_sums(y, z, w)
    return logloss_sum(y, z), float(y.sum()), float(sigmoid(z).sum())


def distributed_validation_metrics(labels: np.ndarray, logits: np.ndarray, tasks: Optional[Sequence[str]] = None,
                                   primary: Optional[str] = None,
                                   groups: Optional[np.ndarray] = None,
                                   task_types: Optional[Sequence[str]] = None,
                                   weights: Optional[np.ndarray] = None) -> Dict[str, float]:
    """:func:`rayemb.train.worker.metrics.validation_metrics` of every rank's rows together, no row gathered whole:
    the same keys and values (AUC and GAUC exact; logloss, NE, calibration, RMSE and MAE to float64 rounding).
    ``groups``, ``weights``: every rank passes them or none does."""
    import torch
    import torch.distributed as dist

    from rayemb.train.worker.metrics import normalized_entropy

    _, world = _world()
    tasks = list(tasks or [])
    columns = max(1, len(tasks))
    kinds = list(task_types or ["binary"] * columns)
    labels = np.asarray(labels, np.float64).reshape(-1, columns)
    logits = np.asarray(logits, np.float64).reshape(-1, columns)
    w = None if weights is None else np.asarray(weights, np.float64).ravel()
    # rows, then per task its three summed terms (_task_sums), then (weighted) the weights' sum
    sums = torch.tensor([float(labels.shape[0])] + [v for i in range(columns) for v in _task_sums(
        labels[:, i], logits[:, i], kinds[i], w)] + ([] if w is None else [float(w.sum())]), dtype=torch.float64)
    if world > 1:
        dist.all_reduce(sums)
    rows = float(sums[0])
    total = rows if w is None else float(sums[-1])  # what each task's sums are divided by
    out: Dict[str, float] = {}
    names = tasks if len(tasks) > 1 else [""]
    for i, task in enumerate(names):
        suffix = f".{task}" if task else ""
        if kinds[i] == "regression":
            squared, absolute = (float(v) for v in sums[1 + 3 * i:3 + 3 * i])
            out[f"valid_rmse{suffix}"] = float(np.sqrt(squared / total)) if total > 0 else float("nan")
            out[f"valid_mae{suffix}"] = absolute / total if total > 0 else float("nan")
            continue
        loss, positives, predicted = (float(v) for v in sums[1 + 3 * i:4 + 3 * i])
        mean_loss = loss / total if total > 0 else float("nan")
        out[f"valid_auc{suffix}"] = (distributed_auc(logits[:, i], labels[:, i]) if w is None
                                     else distributed_weighted_auc(logits[:, i], labels[:, i], w))
        out[f"valid_logloss{suffix}"] = mean_loss
        out[f"valid_ne{suffix}"] = normalized_entropy(mean_loss, positives / total) if total > 0 else float("nan")
        out[f"valid_calibration{suffix}"] = predicted / positives if positives else float("nan")
        if groups is not None:
            out[f"valid_gauc{suffix}"] = distributed_gauc(groups, logits[:, i], labels[:, i])
    if len(tasks) > 1:
        main = primary or tasks[0]
        out.update({k.split(".")[0]: v for k, v in list(out.items()) if k.endswith(f".{main}")})
    out["valid_rows"] = rows
    return out


#: the training window's metrics (:func:`window_metrics`): validation's names with ``valid_`` made ``train_window_``
WINDOW_METRICS = ("auc", "ne", "rmse")


def window_metrics(labels: np.ndarray, logits: np.ndarray, tasks: Optional[Sequence[str]] = None,
                   primary: Optional[str] = None, task_types: Optional[Sequence[str]] = None,
                   weights: Optional[np.ndarray] = None) -> Dict[str, float]:
    """``train_window_auc``, ``train_window_ne`` (binary tasks) and ``train_window_rmse`` (regression tasks) of
    every rank's rows of the window, each task suffixed as validation's metrics are (``train_window_auc.<task>``,
    the primary task's also bare): :func:`distributed_validation_metrics`, exact, every rank calling it."""
    out = distributed_validation_metrics(labels, logits, tasks, primary, task_types=task_types, weights=weights)
    return {"train_window_" + k[len("valid_"):]: v for k, v in out.items()
            if k.split(".")[0][len("valid_"):] in WINDOW_METRICS}


class TrainWindow:
    """The model's outputs and targets of the training steps since the last log point, kept on the device
    (detached; read only at the log point): :meth:`wrap` the step's loss with it, :meth:`metrics` at the log point.

    A target is the labels, or the labels with the row weights as a last column (``losses.TaskLoss``'s rule).
    """

    def __init__(self, tasks: Sequence[str], task_types: Optional[Sequence[str]] = None,
                 primary: Optional[str] = None) -> None:
        self.tasks, self.task_types, self.primary = list(tasks), task_types, primary
        self.outputs: list = []
        self.targets: list = []

    def wrap(self, loss_fn: Any) -> Any:
        """``loss_fn`` that also keeps each step's output and target."""
        def recorded(output: Any, target: Any) -> Any:
            self.outputs.append(output.detach().float())
            self.targets.append(target.detach())
            return loss_fn(output, target)
        return recorded

    def metrics(self) -> Dict[str, float]:
        """:func:`window_metrics` of the kept steps (a collective: every rank calls it alike); starts a new window."""
        import torch

        columns = max(1, len(self.tasks))
        z = torch.cat(self.outputs).cpu().numpy() if self.outputs else np.zeros(0)
        t = torch.cat(self.targets).float().cpu().numpy() if self.targets else np.zeros((0, columns))
        self.outputs, self.targets = [], []
        rows = t.shape[0]
        if z.size != rows * columns:
            return {}  # a user's loss over outputs that are not one logit per row and task (every rank alike)
        z, t = z.reshape(rows, columns), t.reshape(rows, -1)
        weights = t[:, columns] if t.shape[1] == columns + 1 else None
        return window_metrics(t[:, :columns], z, self.tasks, self.primary, self.task_types, weights)


__all__ = ["TrainWindow", "WINDOW_METRICS", "distributed_auc", "distributed_weighted_auc", "distributed_gauc",
           "distributed_validation_metrics", "window_metrics"]
