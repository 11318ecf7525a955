"""The training step written once (rayemb.train.worker.step.TrainStep) trains exactly as the step written by hand.

On 2 gloo ranks a model with every placement rayemb uses (test_logical_checkpoint's plan A) trains STEPS
steps from the same weights three ways: a hand-written step (forward, loss, zero_grad, backward,
optimizer step); ``TrainStep`` called batch by batch; and ``TrainStep.steps`` over the batches with the
next batch's input exchange prefetched, the collectives' byte counter and the phase timer on, as the
training loop runs it. The losses of every step and every tensor each rank holds afterwards (sharded,
replicated and dense, optimizer state included) must be equal bit for bit, and the prefetch must really
have been used.
"""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch
from _sparse import checkpoint_batch, local_tensors
from test_logical_checkpoint import PLAN_A, TABLES, _build

from rayemb.multiprocess import run_multiprocess

LOCAL_BATCH = 6
STEPS = 4


def _train(rank: int, world_size: int, how: str) -> Dict[str, object]:
    from rayemb.embedding.comm import CommCounter, instrument_ddp
    from rayemb.embedding.prefetch import StepPrefetch
    from rayemb.train.worker.step import StepBatch, StepTimer, TrainStep

    dmp, opt, remapper = _build(world_size, PLAN_A, seed=0)
    instrument_ddp(dmp)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    batches = [StepBatch((kjt,), labels, kjt) for kjt, labels in
               (checkpoint_batch(remapper, TABLES, LOCAL_BATCH, s, rank, world_size) for s in range(STEPS))]
    initial = {k: local_tensors(v) for k, v in dmp.state_dict().items()}
    prefetch, counter, timer = StepPrefetch(dmp), CommCounter(), StepTimer()
    if how == "by_hand":
        losses = []
        for b in batches:
            loss = loss_fn(dmp(*b.inputs), b.labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    elif how == "call":
        step = TrainStep(dmp, opt, loss_fn)
        losses = [step(b, batches[i + 1] if i + 1 < STEPS else None) for i, b in enumerate(batches)]
    else:  # as the loop runs it
        step = TrainStep(dmp, opt, loss_fn, prefetch=prefetch, counter=counter, timer=timer)
        losses = list(step.steps(iter(batches)))
    assert all(not loss.requires_grad for loss in losses)
    final = {k: local_tensors(v) for k, v in dmp.state_dict().items()}
    optim = {f"{param}.{name}": local_tensors(t) for param, state in opt.state_dict()["state"].items()
             for name, t in state.items()}
    return {"losses": [loss.numpy().copy() for loss in losses], "initial": initial, "final": final, "optim": optim,
            "hits": prefetch.hits, "bytes": sum(counter.bytes().values()),
            "timed": {p: t > 0 for p, t in timer.totals.items()}}


def test_train_step_trains_as_the_step_written_by_hand():
    by_hand = run_multiprocess(_train, 2, how="by_hand")
    called = run_multiprocess(_train, 2, how="call")
    looped = run_multiprocess(_train, 2, how="steps")
    for rank in range(2):
        ref = by_hand[rank]
        assert ref["hits"] == 0 and called[rank]["hits"] == 0
        # plan A's hybrid module has a plain, a hot and two cold children: 4 prefetched lookups per later step
        assert looped[rank]["hits"] == 4 * (STEPS - 1), looped[rank]["hits"]
        assert looped[rank]["bytes"] > 0 and all(looped[rank]["timed"].values()), looped[rank]
        for other in (called[rank], looped[rank]):
            assert len(other["losses"]) == STEPS
            for s, (x, y) in enumerate(zip(ref["losses"], other["losses"])):
                assert np.array_equal(x, y), (rank, s, x, y)
            for what in ("initial", "final", "optim"):
                assert sorted(ref[what]) == sorted(other[what]), what
                for k in ref[what]:
                    for x, y in zip(ref[what][k], other[what][k]):
                        assert np.array_equal(x, y), (rank, what, k, np.abs(x - y).max())
    # training moved the model: the comparison is not between two untrained copies
    moved = [k for k in by_hand[0]["final"]
             if not all(np.array_equal(x, y) for x, y in zip(by_hand[0]["initial"][k], by_hand[0]["final"][k]))]
    assert moved, "no tensor trained"
