"""Validation metrics over 3 gloo ranks without gathering every row (rayemb.train.worker.dist_metrics) equal
the metrics of all rows on one process, to float64 rounding.

The ranks hold unequal shares (one holds none), with many tied scores that straddle the ranks (the exchange
must keep every tie in one range), for one task and for two.
"""

from __future__ import annotations

import numpy as np

from rayemb.multiprocess import run_multiprocess

SHARES = (700, 0, 301)


def _rows(tasks: int):
    rng = np.random.default_rng(7)
    n = sum(SHARES)
    logits = np.round(rng.normal(size=(n, tasks)), 1)  # about 60 distinct values: ties everywhere
    labels = (rng.random((n, tasks)) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return labels, logits


def _names(tasks: int):
    return (["click", "like"], "like") if tasks > 1 else (None, None)


def _rank(rank: int, world_size: int):
    from rayemb.train.worker.dist_metrics import distributed_validation_metrics

    lo = sum(SHARES[:rank])
    mine = slice(lo, lo + SHARES[rank])
    out = {}
    for tasks in (1, 2):
        labels, logits = _rows(tasks)
        out[tasks] = distributed_validation_metrics(labels[mine], logits[mine], *_names(tasks))
    return out


def test_distributed_metrics_equal_the_metrics_of_every_row_on_one_process():
    from rayemb.train.worker.metrics import validation_metrics

    ranks = run_multiprocess(_rank, 3)
    for tasks in (1, 2):
        labels, logits = _rows(tasks)
        if tasks == 1:
            labels, logits = labels.ravel(), logits.ravel()
        want = validation_metrics(labels, logits, *_names(tasks))
        assert 0.6 < want["valid_auc"] < 0.95
        for got in (r[tasks] for r in ranks):
            assert sorted(got) == sorted(want)
            for key, value in want.items():
                assert abs(got[key] - value) <= 1e-12 * max(1.0, abs(value)), (tasks, key, got[key], value)
