"""CommCounter counts the bytes each collective sends, by phase, on 2 real gloo ranks.

Expected numbers follow the convention in rayemb/embedding/comm.py: bytes sent
off-rank (all-to-all: chunks for other ranks; all-reduce 2·N·(W-1)/W;
reduce-scatter N_in·(W-1)/W; all-gather N_in·(W-1)), DDP's C++ gradient
all-reduce included through the comm hook.
"""

from __future__ import annotations

from typing import Dict

import pytest
import torch
import torch.distributed as dist

from rayemb.multiprocess import run_multiprocess


class _AllReduceInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        g = g.contiguous()
        dist.all_reduce(g)
        return g


def _count_rank(rank: int, world_size: int) -> Dict[str, object]:
    from rayemb.embedding.comm import CommCounter, instrument_ddp

    original = dist.all_reduce
    in_splits = [[2, 4], [3, 1]][rank]
    out_splits = [[2, 3], [4, 1]][rank]
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
    assert instrument_ddp(ddp) == 1
    with CommCounter() as cc:
        assert dist.all_reduce is not original
        out = torch.empty(sum(out_splits), 2)
        dist.all_to_all_single(out, torch.full((sum(in_splits), 2), float(rank)), out_splits, in_splits)
        dist.all_reduce(torch.ones(10))
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(8))
        dist.all_gather_into_tensor(torch.empty(6), torch.ones(3))
        forward = cc.bytes_by_phase()["forward"]
        x = torch.ones(5, requires_grad=True)
        _AllReduceInBackward.apply(x).sum().backward()
        ddp(torch.ones(4, 3)).sum().backward()
        total = cc.global_bytes()
    assert dist.all_reduce is original
    return {"forward": forward, "by_phase": cc.bytes_by_phase(), "bytes": cc.bytes(), "global": total,
            "out": out[:, 0].tolist()}


@pytest.mark.timeout(180)
def test_comm_counter_counts_bytes_sent_by_phase() -> None:
    r0, r1 = run_multiprocess(_count_rank, 2)
    assert r0["out"] == [0.0, 0.0, 1.0, 1.0, 1.0]  # rows from rank 0 (2) then rank 1 (3)
    assert r0["forward"] == {"all_to_all": 4 * 8, "all_reduce": 40.0, "reduce_scatter": 16.0, "all_gather": 12.0}
    assert r1["forward"]["all_to_all"] == 3 * 8
    for r in (r0, r1):
        # backward: the custom Function's all-reduce of 5 floats (20 B) + DDP's bucket of 8 floats (32 B)
        assert r["by_phase"]["backward"] == {"all_to_all": 0.0, "all_reduce": 20.0 + 32.0,
                                             "reduce_scatter": 0.0, "all_gather": 0.0}
    assert r0["global"] == {"all_to_all": 56.0, "all_reduce": 2 * (40.0 + 52.0),
                            "reduce_scatter": 32.0, "all_gather": 24.0}
