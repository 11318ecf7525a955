"""Sequence features through a sharded EmbeddingCollection equal an unsharded one.

On 2 and 3 gloo ranks, an ``EmbeddingCollection`` of three sequence features
(:mod:`rayemb.embedding.sequence`) is sharded with ``DistributedModelParallel``
under a hand-written plan: table-wise, row-wise, column-wise, and a mix of the
three in one collection. The column-wise plans put several column shards of
one table on one rank in a non-monotone order (e.g. dim 16 as 4 shards on
ranks [0, 1, 0, 1]); TorchRec then has to permute the shard outputs back into
column order (``ShardedEmbeddingCollection._generate_permute_indices_per_feature``),
which the value comparison proves.

Each rank feeds its slice of a global batch (per-row histories of 0..L+2 ids,
cut to the latest ``max_length`` by ``sequence_kjt``: empty, truncated and
repeated ids occur every step). Per step, every feature's ``JaggedTensor``
(lengths exactly, values to 1e-5, row order) must equal the reference's rows
of the same samples; after each step (fused SGD or fused row-wise Adagrad in
backward) every table shard a rank holds must equal the reference's rows and
columns. The loss goes through :func:`pad_sequences` and both
``UserHistoryTower`` modes, so their gradients are checked too.

Gradient convention as in ``test_sharding_types.py``: TorchRec's sequence
all-to-all divides gradients by the world size, so the reference trains on
``sum_r L_r / W`` over the global batch.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _sparse import rowwise_adagrad_

from rayemb.multiprocess import run_multiprocess

LOCAL_BATCH = 4
STEPS = 2
LR = 0.1
EPS = 1e-8
ATOL = 1e-5
DIM = 16
#: name, rows, max_length; one dim for all (TorchRec: one dim per EmbeddingCollection)
_FEATURES: List[Tuple[str, int, int]] = [("clicks", 40, 5), ("cats", 12, 3), ("queries", 30, 4)]
CASES = ("table_wise", "row_wise", "column_wise", "mixed")
OPTIMIZERS = ("sgd", "rowwise_adagrad")


def _features():
    from rayemb.embedding.sequence import SequenceFeature

    return [SequenceFeature(n, num_embeddings=v, embedding_dim=DIM, max_length=L) for n, v, L in _FEATURES]


def _cw_ranks(world_size: int) -> Dict[str, List[int]]:
    """Column-shard ranks per table: several shards of a table per rank, interleaved and out of rank order."""
    if world_size == 2:
        return {"clicks": [0, 1, 0, 1], "cats": [1, 1, 0, 0], "queries": [1, 0, 0, 1]}
    return {"clicks": [2, 0, 1, 0], "cats": [1, 1, 2, 2], "queries": [0, 2, 2, 1]}


def _per_table_plan(case: str, world_size: int) -> Dict[str, object]:
    from torchrec.distributed.sharding_plan import column_wise, row_wise, table_wise

    cw = _cw_ranks(world_size)
    if case == "column_wise_mixed_width":  # 4-wide shards of clicks and 8-wide shards of queries on each rank
        return {"clicks": column_wise(ranks=cw["clicks"]), "cats": table_wise(rank=1),
                "queries": column_wise(ranks=[1, 0])}
    if case == "table_wise":
        return {"clicks": table_wise(rank=0), "cats": table_wise(rank=1),
                "queries": table_wise(rank=world_size - 1)}
    if case == "row_wise":
        return {n: row_wise() for n, _, _ in _FEATURES}
    if case == "column_wise":
        return {n: column_wise(ranks=cw[n]) for n, _, _ in _FEATURES}
    return {"clicks": column_wise(ranks=cw["clicks"]), "cats": table_wise(rank=1), "queries": row_wise()}


def _global_batches(world_size: int, seed: int = 5) -> List[Dict[str, list]]:
    """STEPS global batches: per feature, per-sample id lists of 0..max_length+2 ids from few distinct ids."""
    rng = np.random.default_rng(seed + world_size)
    b = LOCAL_BATCH * world_size
    out = []
    for _ in range(STEPS):
        batch = {}
        for name, rows, max_len in _FEATURES:
            lengths = rng.integers(0, max_len + 3, size=b)
            lengths[0], lengths[LOCAL_BATCH] = 0, max_len + 2  # empty and truncated rows on ranks 0 and 1
            batch[name] = [rng.integers(0, rows, size=n).tolist() for n in lengths]
        out.append(batch)
    return out


def _loss(out, feats, rows: slice, world_size: int) -> torch.Tensor:
    """Weighted padded embeddings plus both towers against fixed targets, for samples ``rows``."""
    from rayemb.embedding.sequence import UserHistoryTower, pad_sequences

    g = torch.Generator().manual_seed(3)
    b = LOCAL_BATCH * world_size
    total = torch.zeros(())
    for name, (hist, mask) in pad_sequences(out, feats).items():
        w = torch.randn(b, hist.shape[1], DIM, generator=g)[rows]
        target = torch.randn(b, DIM, generator=g)[rows]
        v = torch.randn(b, DIM, generator=g)[rows]
        total = total + (hist * w).sum()
        for mode in ("mean", "attention"):
            total = total + (UserHistoryTower(mode)(hist, mask, target) * v).sum()
    return total


def _compare_output(out, ref_out, lo: int, hi: int) -> None:
    assert set(out.keys()) == set(ref_out.keys()), (sorted(out.keys()), sorted(ref_out.keys()))
    for name in sorted(ref_out):
        jt, ref = out[name], ref_out[name]
        offs = ref.offsets()
        torch.testing.assert_close(jt.lengths(), ref.lengths()[lo:hi], atol=0, rtol=0)
        torch.testing.assert_close(jt.values().detach(), ref.values()[offs[lo]:offs[hi]].detach(),
                                   atol=ATOL, rtol=0, msg=lambda m, n=name: f"feature {n}: {m}")


def _train_one(rank: int, world_size: int, case: str, optimizer: str) -> Dict[str, float]:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from rayemb.embedding.sequence import sequence_collection, sequence_kjt
    from rayemb.embedding.sharders import cpu_capable_sharders

    feats = _features()
    torch.manual_seed(0)
    reference = sequence_collection(feats)
    init = {k: v.detach().clone() for k, v in reference.state_dict().items()}

    src = sequence_collection(feats, device=torch.device("meta"))
    if optimizer == "sgd":
        fused_cls, fused_kw = torch.optim.SGD, {"lr": LR}
    else:
        fused_cls, fused_kw = RowWiseAdagrad, {"lr": LR, "eps": EPS}
    apply_optimizer_in_backward(fused_cls, src.parameters(), dict(fused_kw))
    sharder = [s for s in cpu_capable_sharders() if s.module_type is type(src)][0]
    module_plan = construct_module_sharding_plan(
        src, _per_table_plan(case, world_size), sharder=sharder, local_size=world_size,
        world_size=world_size, device_type="cpu",
    )
    for ps in module_plan.values():
        ps.compute_kernel = "fused"
    model = DistributedModelParallel(src, device=torch.device("cpu"), plan=ShardingPlan({"": module_plan}),
                                     sharders=[sharder])
    model.load_state_dict(init)

    col_blocks: Dict[str, List[Tuple[int, int]]] = {}
    for table, ps in module_plan.items():
        if ps.sharding_type == "column_wise":
            assert case == "column_wise_mixed_width" or ps.ranks == _cw_ranks(world_size)[table], (table, ps.ranks)
            col_blocks[table] = sorted((s.shard_offsets[1], s.shard_sizes[1]) for s in ps.sharding_spec.shards)
    assert (case in ("column_wise", "mixed", "column_wise_mixed_width")) == bool(col_blocks)
    if col_blocks:  # several shards of one table on one rank, out of rank order: outputs need TorchRec's permute
        assert any(module_plan[t].ranks != sorted(module_plan[t].ranks) for t in col_blocks)
        assert any(len(set(module_plan[t].ranks)) < len(module_plan[t].ranks) for t in col_blocks)
    ref_weights = {n: reference.embeddings[n].weight for n, _, _ in _FEATURES}
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR) if optimizer == "sgd" else None
    ada_state: Dict[str, torch.Tensor] = {}

    b = LOCAL_BATCH * world_size
    lo, hi = rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH
    kinds: set = set()
    for batch in _global_batches(world_size):
        for name, _, max_len in _FEATURES:
            for row in batch[name]:
                kinds |= {"empty"} if not row else {"truncated"} if len(row) > max_len else set()
                kinds |= {"duplicate"} if len(set(row[-max_len:])) < len(row[-max_len:]) else set()
        out = model(sequence_kjt(feats, {n: rows[lo:hi] for n, rows in batch.items()}))
        ref_out = reference(sequence_kjt(feats, batch))
        _compare_output(out, ref_out, lo, hi)

        _loss(out, feats, slice(lo, hi), world_size).backward()  # fused optimizer steps in backward
        reference.zero_grad()
        (_loss(ref_out, feats, slice(0, b), world_size) / world_size).backward()
        if ref_opt is not None:
            ref_opt.step()
        else:
            for name, p in ref_weights.items():
                rowwise_adagrad_(p, ada_state, name, LR, EPS, col_blocks.get(name, ()))
    assert {"empty", "truncated", "duplicate"} <= kinds, kinds

    # every shard each rank holds equals the reference's rows and columns; the shards cover each table once
    covered = torch.zeros(len(_FEATURES), dtype=torch.float64)
    max_diff = 0.0
    for key, value in model.state_dict().items():
        name = key.removeprefix("module.").split(".")[-2]
        i = [n for n, _, _ in _FEATURES].index(name)
        ref = ref_weights[name].detach()
        for shard in value.local_shards():
            (r0, c0), (r, c) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            expect = ref[r0:r0 + r, c0:c0 + c]
            torch.testing.assert_close(shard.tensor, expect, atol=ATOL, rtol=0, msg=lambda m, k=key: f"{k}: {m}")
            max_diff = max(max_diff, float((shard.tensor - expect).abs().max()))
            covered[i] += shard.tensor.numel()
    for name, _, _ in _FEATURES:
        assert not torch.equal(ref_weights[name], init[f"embeddings.{name}.weight"]), f"{name} did not train"
    dist.all_reduce(covered)
    torch.testing.assert_close(covered, torch.tensor([float(v * DIM) for _, v, _ in _FEATURES], dtype=torch.float64))
    return {"max_diff": max_diff}


def _equivalence_rank(rank: int, world_size: int) -> Dict[str, Dict[str, float]]:
    out = {}
    for case in CASES:
        for optimizer in OPTIMIZERS:
            try:
                out[f"{case}/{optimizer}"] = _train_one(rank, world_size, case, optimizer)
            except AssertionError as e:
                raise AssertionError(f"case {case}/{optimizer}: {e}") from e
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", [2, 3])
def test_sequence_sharding_matches_unsharded(world_size: int) -> None:
    results = run_multiprocess(_equivalence_rank, world_size, timeout_s=240)
    expected = {f"{c}/{o}" for c in CASES for o in OPTIMIZERS}
    for rank, res in enumerate(results):
        assert set(res) == expected, (rank, sorted(res))
        for case, r in res.items():
            assert r["max_diff"] <= ATOL, (rank, case, r)


def _one_case_rank(rank: int, world_size: int, case: str, optimizer: str) -> Dict[str, float]:
    return _train_one(rank, world_size, case, optimizer)


#: FBGEMM's message when one rank's sequence (pooling NONE) TBE would hold shards of different widths
_MIXED_WIDTH_ERROR = "Mixed dimension tables only supported for pooling tables"


@pytest.mark.timeout(120)
@pytest.mark.xfail(
    strict=True, raises=AssertionError,
    reason="TorchRec 1.8 groups one rank's column-wise sequence shards into one FBGEMM TBE, which refuses shards "
           "of different widths for non-pooled lookups (" + _MIXED_WIDTH_ERROR + "): column-wise sequence "
           "tables must be split into shards of one width per collection (a planner constraint)",
)
def test_column_shards_of_different_widths_in_one_sequence_collection() -> None:
    try:
        run_multiprocess(_one_case_rank, 2, timeout_s=100, case="column_wise_mixed_width", optimizer="sgd")
    except AssertionError as e:
        if _MIXED_WIDTH_ERROR not in str(e):
            raise RuntimeError(f"failed for another reason than the known limitation: {e}") from e
        raise
