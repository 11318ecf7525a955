"""The training log window's NE, AUC and RMSE (``train_window_*``) over 2 gloo ranks with unequal shares equal a
numpy reference of every row on one process, to 1e-6.

Each rank records its steps' outputs and targets through the job's own loss (:class:`TrainWindow` wrapping
``losses.job_loss``), in steps of unequal sizes; the window's metrics are read at the log point, every rank
together, and the window starts anew after it. Cases: one binary task; a binary and a regression task (each
task's metric suffixed, the primary task's also bare); one binary task with row weights.
"""

from __future__ import annotations

import math

import numpy as np
from test_ranking_metrics import _reference

from rayemb.multiprocess import run_multiprocess

SHARES = (437, 211)  # rows of each rank's window
STEPS = 3


def _rows(tasks: int, seed: int = 5):
    rng = np.random.default_rng(seed)
    n = sum(SHARES)
    logits = np.round(rng.normal(size=(n, tasks)), 1)  # ties
    labels = (rng.random((n, tasks)) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    if tasks > 1:
        labels[:, 1] = (2.0 * logits[:, 1] + rng.normal(size=n)).astype(np.float32)  # a regression target
    weights = rng.uniform(0.2, 3.0, size=n).astype(np.float32)
    return labels, logits.astype(np.float32), weights


CASES = {
    "binary": dict(labels=["click"], kinds=["binary"], weighted=False),
    "multitask": dict(labels=["click", "dwell"], kinds=["binary", "regression"], weighted=False),
    "weighted": dict(labels=["click"], kinds=["binary"], weighted=True),
}


def _rank(rank: int, world_size: int):
    import torch

    from rayemb.train.worker.dist_metrics import TrainWindow
    from rayemb.train.worker.losses import TaskLoss

    lo = sum(SHARES[:rank])
    out = {}
    for name, case in CASES.items():
        labels, logits, weights = _rows(len(case["labels"]))
        mine = slice(lo, lo + SHARES[rank])
        window = TrainWindow(case["labels"], case["kinds"], primary=case["labels"][0])
        loss = window.wrap(TaskLoss(case["labels"], task_types=case["kinds"]))
        y, z, w = labels[mine], logits[mine], weights[mine]
        target = np.concatenate([y, w[:, None]], axis=1) if case["weighted"] else y
        for part in np.array_split(np.arange(SHARES[rank]), STEPS):  # steps of unequal sizes
            out_t = torch.from_numpy(z[part] if len(case["labels"]) > 1 else z[part, 0]).requires_grad_()
            tgt = torch.from_numpy(target[part] if target.shape[1] > 1 else target[part, 0])
            loss(out_t, tgt).backward()
        out[name] = window.metrics()
        out[name + "_next"] = (len(window.outputs), len(window.targets))  # a new window after the log point
    return out


def _weighted_reference(y: np.ndarray, z: np.ndarray, w: np.ndarray):
    p = 1 / (1 + np.exp(-z.astype(np.float64)))
    loss = -np.sum(w * (y * np.log(p) + (1 - y) * np.log(1 - p))) / w.sum()
    rate = np.sum(w * y) / w.sum()
    pos, neg = y == 1, y == 0
    pairs = (w[pos][:, None] * w[neg][None, :])
    above, tied = z[pos][:, None] > z[neg][None, :], z[pos][:, None] == z[neg][None, :]
    wins = np.sum(pairs * above) + 0.5 * np.sum(pairs * tied)
    return {"train_window_ne": loss / -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate)),
            "train_window_auc": wins / pairs.sum()}


def _auc(y: np.ndarray, z: np.ndarray) -> float:
    pos, neg = z[y == 1], z[y == 0]
    return ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (pos.size * neg.size)


def test_window_ne_auc_and_rmse_equal_the_reference_of_every_row():
    ranks = run_multiprocess(_rank, 2)
    assert ranks[0]["binary"] == ranks[1]["binary"]
    for got in ranks:
        assert got["binary_next"] == (0, 0)

        labels, logits, _ = _rows(1)
        y, z = labels[:, 0].astype(np.float64), logits[:, 0].astype(np.float64)
        want = {"train_window_ne": _reference(y, z, np.zeros(y.size))["valid_ne"], "train_window_auc": _auc(y, z)}
        assert sorted(got["binary"]) == sorted(want)
        for k, v in want.items():
            assert abs(got["binary"][k] - v) <= 1e-6, (k, got["binary"][k], v)

        labels, logits, _ = _rows(2)
        y, z = labels[:, 0].astype(np.float64), logits[:, 0].astype(np.float64)
        rmse = float(np.sqrt(np.mean((logits[:, 1].astype(np.float64) - labels[:, 1]) ** 2)))
        want = {"train_window_ne.click": _reference(y, z, np.zeros(y.size))["valid_ne"],
                "train_window_auc.click": _auc(y, z), "train_window_rmse.dwell": rmse}
        want.update({k.split(".")[0]: v for k, v in want.items() if k.endswith(".click")})
        assert sorted(got["multitask"]) == sorted(want)
        for k, v in want.items():
            assert abs(got["multitask"][k] - v) <= 1e-6, (k, got["multitask"][k], v)

        labels, logits, weights = _rows(1)
        want = _weighted_reference(labels[:, 0].astype(np.float64), logits[:, 0].astype(np.float64),
                                   weights.astype(np.float64))
        assert sorted(got["weighted"]) == sorted(want)
        for k, v in want.items():
            assert abs(got["weighted"][k] - v) <= 1e-6, (k, got["weighted"][k], v)
