"""One DDP for the dense arch and every data-parallel lookup trains exactly as TorchRec's wrappers do.

TorchRec gives each data-parallel sharding's lookup a DDP of its own, beside the one
``DistributedModelParallel`` puts around the dense arch: a model with data-parallel tables and
hybrid hot rows (test_logical_checkpoint's plan A, every placement rayemb uses) has three, and
all-reduces three times a step. :class:`~rayemb.embedding.data_parallel.OneDataParallelWrapper`
makes it one DDP and one all-reduce. On 2 gloo ranks the same model trains STEPS steps from the
same weights both ways: the logits of every step and every tensor each rank holds afterwards
(sharded, replicated and dense, optimizer state included) must be equal bit for bit, and the
replicated rows must have trained (so their gradients were all-reduced: each rank saw other ids).
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


def _train(rank: int, world_size: int, one_ddp: bool) -> Dict[str, object]:
    from torch.nn.parallel import DistributedDataParallel

    from rayemb.embedding.comm import CommCounter, _find_ddps, instrument_ddp

    dmp, opt, remapper = _build(world_size, PLAN_A, seed=0, one_ddp=one_ddp)
    ddps = len(_find_ddps(dmp, DistributedDataParallel))
    instrument_ddp(dmp)
    initial = {k: local_tensors(v) for k, v in dmp.state_dict().items()}
    logits, all_reduces = [], []
    # the profiler sees every all-reduce dispatched, also those DDP's C++ reducer issues without a comm hook;
    # it watches the steps after the first (a static-graph DDP's first backward syncs once more)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    for s in range(STEPS):
        if s == 1:
            prof.__enter__()
        kjt, labels = checkpoint_batch(remapper, TABLES, LOCAL_BATCH, s, rank, world_size)
        with CommCounter() as cc:
            out = dmp(kjt)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(out, labels)
            opt.zero_grad()
            loss.backward()
        opt.step()
        logits.append(out.detach().numpy().copy())
        all_reduces.append(cc.calls().get("all_reduce", 0))
    prof.__exit__(None, None, None)
    dispatched = sum(e.count for e in prof.key_averages() if e.key == "c10d::allreduce_")
    final = {k: local_tensors(v) for k, v in dmp.state_dict().items()}
    optim = {f"{param}.{name}": local_tensors(t) for param, state in opt.state_dict()["state"].items()
             for name, t in state.items()}
    return {"ddps": ddps, "all_reduces": all_reduces, "dispatched": dispatched, "logits": logits,
            "initial": initial, "final": final, "optim": optim}


def test_one_ddp_trains_as_torchrecs_wrappers():
    theirs = run_multiprocess(_train, 2, one_ddp=False)
    ours = run_multiprocess(_train, 2, one_ddp=True)
    for rank, (a, b) in enumerate(zip(theirs, ours)):
        # plan A: the dense head, data-parallel table f, hybrid hot rows (a, b, g): TorchRec 3 DDPs, ours 1
        assert a["ddps"] == 3 and b["ddps"] == 1, (a["ddps"], b["ddps"])
        assert a["all_reduces"] == [3] * STEPS and b["all_reduces"] == [1] * STEPS, (a["all_reduces"],
                                                                                     b["all_reduces"])
        assert (a["dispatched"], b["dispatched"]) == (3 * (STEPS - 1), STEPS - 1), (a["dispatched"], b["dispatched"])
        for s, (x, y) in enumerate(zip(a["logits"], b["logits"])):
            assert np.array_equal(x, y), (rank, s, np.abs(x - y).max())
        for what in ("initial", "final", "optim"):
            assert sorted(a[what]) == sorted(b[what]), (what, sorted(a[what]), sorted(b[what]))
            for k in a[what]:
                for x, y in zip(a[what][k], b[what][k]):
                    assert np.array_equal(x, y), (rank, what, k, np.abs(x - y).max())
        replicated = [k for k in b["final"] if "__hot" in k or ".f." in k]
        assert len(replicated) == 4, sorted(b["final"])
        for k in replicated:
            assert not np.array_equal(b["initial"][k][0], b["final"][k][0]), f"{k} did not train"
    for k in ours[0]["final"]:  # replicated rows and the head: the same on both ranks
        if "__hot" in k or ".f." in k or k.startswith("head."):
            assert np.array_equal(ours[0]["final"][k][0], ours[1]["final"][k][0]), k
