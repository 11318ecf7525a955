"""The next batch's input exchange, prefetched during the backward, changes no number (rayemb.embedding.prefetch).

Two gloo ranks train a model with every placement rayemb uses (test_logical_checkpoint's
plan A: hybrid tables with row-, column- and table-wise cold halves, plain table-, column-,
row-wise and data-parallel tables) for STEPS steps twice from the same initial weights: once
with the plain forward, once with :class:`~rayemb.embedding.prefetch.StepPrefetch` as the
training loop runs it (the next batch's exchange started between forward and backward: all of it, or its split
sizes only). Logits every step
and the trained model's logits on a held-out batch must be equal bit for bit, and the
prefetched run must really have used the prefetched exchanges. A forward on another KJT between
start and use (an evaluation) drops the prefetch on every rank alike and changes nothing either.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest
import torch
from _sparse import checkpoint_batch
from test_logical_checkpoint import PLAN_A, TABLES, _build

from rayemb.multiprocess import run_multiprocess

LOCAL_BATCH = 6
STEPS = 5
#: a step after whose prefetch start an evaluation forward runs (the prefetch is dropped)
EVAL_AT = 2


def _train(rank: int, world_size: int, prefetch: bool, evaluate: bool, exchange: str = "full") -> Dict[str, object]:
    from rayemb.embedding.prefetch import StepPrefetch

    dmp, opt, remapper = _build(world_size, PLAN_A, seed=0)
    pre = StepPrefetch(dmp, exchange=exchange) if prefetch else None
    batches = [checkpoint_batch(remapper, TABLES, LOCAL_BATCH, s, rank, world_size) for s in range(STEPS)]
    held_out, _ = checkpoint_batch(remapper, TABLES, LOCAL_BATCH, 99, rank, world_size)
    with torch.no_grad():
        initial = dmp(held_out).numpy().copy()
    logits: List[np.ndarray] = []
    for i, (kjt, labels) in enumerate(batches):
        out = dmp(kjt)
        logits.append(out.detach().numpy().copy())  # numpy: torch tensors would travel as shared memory
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out, labels)
        if pre is not None and i + 1 < STEPS:
            pre.start(batches[i + 1][0])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if evaluate and i == EVAL_AT:
            with torch.no_grad():
                dmp(held_out)  # another KJT: a pending prefetch is dropped, the lookups run plainly
    with torch.no_grad():
        final = dmp(held_out).numpy().copy()
    return {"logits": logits, "initial": initial, "final": final, "hits": pre.hits if pre else 0, "dropped": pre.dropped if pre else 0,
            "enabled": pre.enabled if pre else None}


@pytest.mark.parametrize("exchange", ["full", "splits"])
def test_prefetched_input_exchange_changes_nothing(exchange):
    plain = run_multiprocess(_train, 2, prefetch=False, evaluate=True)
    fetched = run_multiprocess(_train, 2, prefetch=True, evaluate=False, exchange=exchange)
    fetched_eval = run_multiprocess(_train, 2, prefetch=True, evaluate=True, exchange=exchange)
    for rank in range(2):
        p, f, fe = plain[rank], fetched[rank], fetched_eval[rank]
        assert f["enabled"] is True
        # plan A's hybrid module has a plain, a hot and two cold (dims 8, 4) children: 4 per prefetched step
        assert f["hits"] == 4 * (STEPS - 1) and f["dropped"] == 0, (f["hits"], f["dropped"])
        assert fe["dropped"] == 4 and fe["hits"] == 4 * (STEPS - 2), (fe["hits"], fe["dropped"])
        for step in range(STEPS):
            assert np.array_equal(f["logits"][step], p["logits"][step]), (rank, step)
            assert np.array_equal(fe["logits"][step], p["logits"][step]), (rank, step)
        assert np.array_equal(f["final"], p["final"]) and np.array_equal(fe["final"], p["final"]), rank
    # training moved the model: the comparison is not between two untrained copies
    assert not np.allclose(plain[0]["final"], plain[0]["initial"])
