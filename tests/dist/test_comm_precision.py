"""``train.comm_precision``: the step's float exchanges cross the wire in 16 bits, and the model still trains.

On 2 gloo ranks a model with every placement rayemb uses (test_logical_checkpoint's plan A: hybrid tables with
row-, column- and table-wise cold halves, plain table-, column-, row-wise and data-parallel tables, a dense head
under the job's one DDP) takes STEPS steps from the same weights on the same batches at fp32, at bf16 both ways,
and at fp16 forward / fp32 backward. What :class:`~rayemb.embedding.comm.CommCounter` sees at the wire:

* backward (the rows' gradients, all-to-all and all-gather, and the DDP's gradient all-reduce): bf16 sends half
  the bytes of fp32, collective by collective; a fp32 backward sends what fp32 does;
* forward: the row-wise reduce-scatter halves; the all-to-all also carries the ids and lengths, which stay
  integers: summed over the ranks, the forward all-to-all's float part is the backward's (the same rows, sent
  back), so fp32's forward all-to-all less bf16's is half the fp32 backward all-to-all;
* the losses stay within a bf16 rounding of fp32's, and differ from them (the codecs ran).
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest
import torch
from _sparse import checkpoint_batch
from test_logical_checkpoint import PLAN_A, TABLES, _build

from rayemb.multiprocess import run_multiprocess

LOCAL_BATCH = 6
STEPS = 4


def _train(rank: int, world_size: int, precision: Dict[str, str]) -> Dict[str, object]:
    from rayemb.embedding.comm import CommCounter, instrument_ddp

    dmp, opt, remapper = _build(world_size, PLAN_A, seed=0, comm_precision=precision)
    assert instrument_ddp(dmp) == 1  # the one DDP's all-reduce is counted, with or without a compression hook
    losses: List[float] = []
    steps: List[Dict[str, Dict[str, float]]] = []
    for s in range(STEPS):
        kjt, labels = checkpoint_batch(remapper, TABLES, LOCAL_BATCH, s, rank, world_size)
        with CommCounter() as cc:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(dmp(kjt), labels)
            opt.zero_grad()
            loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        steps.append(cc.bytes_by_phase())
    return {"losses": losses, "bytes": steps}


def _global(runs: List[Dict[str, object]], step: int, phase: str, collective: str) -> float:
    return sum(r["bytes"][step][phase][collective] for r in runs)


@pytest.mark.timeout(600)
def test_16_bit_exchanges_send_half_the_float_bytes_and_train_alike():
    fp32 = run_multiprocess(_train, 2, precision={"forward": "fp32", "backward": "fp32"})
    bf16 = run_multiprocess(_train, 2, precision={"forward": "bf16", "backward": "bf16"})
    fp16_fwd = run_multiprocess(_train, 2, precision={"forward": "fp16", "backward": "fp32"})
    for s in range(STEPS):
        for rank in range(2):
            full, half, mixed = (r[rank]["bytes"][s] for r in (fp32, bf16, fp16_fwd))
            # plan A exchanges by every collective: pooled and sequence all-to-alls, the row-wise table's
            # reduce-scatter (forward) and all-gather (backward), the DDP's all-reduce (backward)
            assert all(full["backward"][c] > 0 for c in ("all_to_all", "all_gather", "all_reduce")), full
            assert full["forward"]["reduce_scatter"] > 0, full
            for c in ("all_to_all", "all_gather", "all_reduce", "reduce_scatter"):
                assert half["backward"][c] == full["backward"][c] / 2, (s, rank, c, half, full)
                assert mixed["backward"][c] == full["backward"][c], (s, rank, c, mixed, full)
            for r in (half, mixed):
                assert r["forward"]["reduce_scatter"] == full["forward"]["reduce_scatter"] / 2, (s, rank, r, full)
                assert r["forward"]["all_reduce"] == full["forward"]["all_reduce"] == 0.0
        float_part = _global(fp32, s, "backward", "all_to_all")
        for run in (bf16, fp16_fwd):
            saved = _global(fp32, s, "forward", "all_to_all") - _global(run, s, "forward", "all_to_all")
            assert saved == float_part / 2, (s, saved, float_part)
    for rank in range(2):
        ref = np.array(fp32[rank]["losses"])
        for run in (bf16, fp16_fwd):
            got = np.array(run[rank]["losses"])
            assert np.allclose(got, ref, rtol=0, atol=1e-2), (got, ref)
            assert not np.array_equal(got, ref), "16-bit exchanges gave fp32's losses bit for bit"


def _job_rank(rank: int, world_size: int, cfg: Any, schema: Any) -> Dict[str, Dict[str, float]]:
    """One forward and backward of the job's own model as ``build_step`` sets it up; the bytes by phase."""
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rayemb.embedding.comm import CommCounter
    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.train.worker.build import build_step
    from rayemb.train.sharding import JobPlan, build_model

    meta_model, _, _ = build_model(cfg, schema, {}, {}, torch.device("meta"), torch.device("meta"))
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu")).collective_plan(
        meta_model, cpu_capable_sharders(), dist.GroupMember.WORLD)
    built = build_step(cfg, schema, JobPlan(sharding_plan=plan, placements={}, hot_ids={}, summary={}),
                       torch.device("cpu"), compile=False)
    g = torch.Generator().manual_seed(rank)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a", "b"], values=torch.randint(0, 50, (12,), generator=g),
                                              lengths=torch.full((12,), 1))
    with CommCounter() as cc:
        built.model(torch.randn(6, 1, generator=g), built.remapper.remap(kjt)).sum().backward()
    return cc.bytes_by_phase()


@pytest.mark.timeout(300)
def test_the_jobs_step_exchanges_at_train_comm_precision():
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema

    schema = DatasetSchema.from_dict({"label": "label", "dense": ["d"], "sparse": [
        {"name": "a", "num_embeddings": 50}, {"name": "b", "num_embeddings": 50}]})
    job = {"name": "comm-precision", "data": {"path": "unused", "batch_size": 12}, "model": {"embedding_dim": 8, "bottom_mlp": [8]}}
    full = run_multiprocess(_job_rank, 2, cfg=config_from_dict(job), schema=schema)
    half = run_multiprocess(_job_rank, 2, cfg=config_from_dict(
        job, ["train.comm_precision={forward: bf16, backward: bf16}"]), schema=schema)
    for a, b in zip(full, half):
        # TorchRec plans both tables row-wise: pooled rows reduce-scattered, their gradients all-gathered
        for phase, c in (("forward", "reduce_scatter"), ("backward", "all_gather"), ("backward", "all_reduce")):
            assert a[phase][c] > 0 and b[phase][c] == a[phase][c] / 2, (phase, c, a, b)
