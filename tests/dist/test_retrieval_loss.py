"""The in-batch softmax over 2 gloo ranks is the softmax over the global batch on one process.

Each rank holds its rows' queries, candidates and item ids; every rank's candidates are negatives of every
row (gathered with their gradients). The mean of the ranks' losses and every gradient each rank gets must
equal the loss and gradients of the whole batch on one process (logQ correction and same-item mask on).
"""

from __future__ import annotations

import numpy as np
import torch

from rayemb.multiprocess import run_multiprocess

ROWS, DIM, ITEMS = 5, 4, 6


def _batch():
    g = torch.Generator().manual_seed(3)
    query, candidate = torch.randn(2 * ROWS, DIM, generator=g), torch.randn(2 * ROWS, DIM, generator=g)
    ids = torch.randint(0, ITEMS, (2 * ROWS,), generator=g)  # repeats across ranks: the mask spans them
    log_q = np.log(np.linspace(0.05, 0.3, ITEMS)).astype(np.float32)
    return query, candidate, ids, log_q


def _rank(rank: int, world_size: int):
    from rayemb.train.worker.retrieval import InBatchSoftmax

    query, candidate, ids, log_q = _batch()
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    q, c = query[rows].clone().requires_grad_(), candidate[rows].clone().requires_grad_()
    loss = InBatchSoftmax(log_q)((q, c), ids[rows])
    (loss / world_size).backward()  # the job's loss: the mean over ranks (DDP averages the dense gradients)
    return {"loss": float(loss), "q": q.grad.numpy(), "c": c.grad.numpy()}


def test_gathered_in_batch_softmax_equals_the_global_batch_on_one_process():
    from rayemb.train.worker.retrieval import InBatchSoftmax

    query, candidate, ids, log_q = _batch()
    assert len(set(ids.tolist())) < len(ids)  # some item twice: the mask is exercised
    q, c = query.clone().requires_grad_(), candidate.clone().requires_grad_()
    whole = InBatchSoftmax(log_q)((q, c), ids)
    whole.backward()
    ranks = run_multiprocess(_rank, 2)
    assert np.isclose(np.mean([r["loss"] for r in ranks]), float(whole), rtol=1e-6)
    for rank, r in enumerate(ranks):
        rows = slice(rank * ROWS, (rank + 1) * ROWS)
        assert np.allclose(r["q"], q.grad[rows].numpy(), atol=1e-7), rank
        # a candidate's gradient comes from both ranks' rows: the gather's backward sums them
        assert np.allclose(r["c"], c.grad[rows].numpy(), atol=1e-7), rank
    assert np.abs(ranks[0]["c"]).max() > 0 and not np.allclose(ranks[0]["loss"], ranks[1]["loss"])
