"""Every TorchRec sharding type trains on CPU/gloo and matches an unsharded EBC.

For each sharding type (DP, TW, RW, CW, TWRW, TWCW) two gloo ranks shard one
EmbeddingBagCollection with ``DistributedModelParallel`` (the type forced through
``ParameterConstraints``, RW/TWRW enabled on CPU by rayemb's sharder), train 3 SGD
steps (fused in backward; DP tables with a dense optimizer, as TorchRec does), and every rank checks its pooled outputs and every
table row it holds against an unsharded EBC trained on the global batch, to 1e-5.

Gradient convention: each rank's loss ``L_r`` is the sum of its
pooled outputs times fixed weights; every table receives the gradient of
``mean_r L_r`` (DDP averages DP tables; TorchRec's comm ops divide the
all-to-all / reduce-scatter gradients by the world size,
``comm_ops.set_gradient_division(True)`` being the default). The reference
trains on ``sum_r L_r / W`` over the global batch.
"""

from __future__ import annotations

import os
from typing import List

import pytest
import torch
import torch.distributed as dist

from rayemb.multiprocess import run_multiprocess

WORLD_SIZE = 2
LOCAL_BATCH = 4
STEPS = 3
LR = 0.1
DIM = 8
TABLE_ROWS = (24, 16, 12)
ATOL = 1e-5


def _tables():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

    return [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=rows,
                           feature_names=[f"f{i}"], pooling=PoolingType.SUM)
        for i, rows in enumerate(TABLE_ROWS)
    ]


def _global_batches(seed: int = 7) -> List:
    """STEPS global batches as (lengths [F, B], values) with multi-hot bags of 0..3 ids."""
    g = torch.Generator().manual_seed(seed)
    out = []
    b = LOCAL_BATCH * WORLD_SIZE
    for _ in range(STEPS):
        lengths = torch.randint(0, 4, (len(TABLE_ROWS), b), generator=g)
        values = [torch.randint(0, TABLE_ROWS[f], (int(lengths[f].sum()),), generator=g) for f in range(len(TABLE_ROWS))]
        out.append((lengths, values))
    return out


def _kjt(lengths: torch.Tensor, values: List[torch.Tensor], lo: int, hi: int):
    """KJT of samples [lo, hi) of a global batch."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    vals, lens = [], []
    for f, v in enumerate(values):
        offs = torch.cat([torch.zeros(1, dtype=torch.long), lengths[f].cumsum(0)])
        vals.append(v[offs[lo]:offs[hi]])
        lens.append(lengths[f, lo:hi])
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(len(TABLE_ROWS))], values=torch.cat(vals), lengths=torch.cat(lens)
    )


def _ordered(kt) -> torch.Tensor:
    """Pooled embeddings [B, F*D] in feature order f0, f1, ... (sharded outputs group keys by sharding)."""
    d = kt.to_dict()
    return torch.cat([d[f"f{i}"] for i in range(len(TABLE_ROWS))], dim=1)


def _loss_weights(n: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, n * DIM * len(TABLE_ROWS)).reshape(n, DIM * len(TABLE_ROWS))


def _train_and_compare(rank: int, world_size: int, sharding_type: str, local_world_size: int) -> None:
    os.environ["LOCAL_WORLD_SIZE"] = str(local_world_size)
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from rayemb.embedding.sharders import cpu_capable_sharders

    torch.manual_seed(0)
    reference = EmbeddingBagCollection(tables=_tables(), device=torch.device("cpu"))
    init = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)

    sharded_src = EmbeddingBagCollection(tables=_tables(), device=torch.device("meta"))
    apply_optimizer_in_backward(torch.optim.SGD, sharded_src.parameters(), {"lr": LR})
    is_dp = sharding_type == ShardingType.DATA_PARALLEL.value
    kernel = "dense" if is_dp else "fused"
    constraints = {
        t.name: ParameterConstraints(sharding_types=[sharding_type], compute_kernels=[kernel], min_partition=DIM // 2)
        for t in _tables()
    }
    sharders = cpu_capable_sharders()
    topology = Topology(world_size=world_size, local_world_size=local_world_size, compute_device="cpu")
    plan = EmbeddingShardingPlanner(topology=topology, constraints=constraints).collective_plan(
        sharded_src, sharders, dist.GroupMember.WORLD
    )
    for name, ps in plan.plan[""].items():
        assert ps.sharding_type == sharding_type, (name, ps.sharding_type)
    model = DistributedModelParallel(sharded_src, device=torch.device("cpu"), plan=plan, sharders=sharders)
    model.load_state_dict(init)
    # DP tables use the dense kernel: their (DDP-averaged) gradients are applied by a
    # regular optimizer; the other tables are updated by the fused optimizer in backward.
    dense_params = dict(in_backward_optimizer_filter(model.named_parameters()))
    assert bool(dense_params) == is_dp
    dense_opt = KeyedOptimizerWrapper(dense_params, lambda ps: torch.optim.SGD(ps, lr=LR)) if is_dp else None

    lo, hi = rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH
    w = _loss_weights(LOCAL_BATCH * world_size)
    for lengths, values in _global_batches():
        out = _ordered(model(_kjt(lengths, values, lo, hi)))
        (out * w[lo:hi]).sum().backward()
        if dense_opt is not None:
            dense_opt.step()
            dense_opt.zero_grad()

        ref_out = _ordered(reference(_kjt(lengths, values, 0, LOCAL_BATCH * world_size)))
        torch.testing.assert_close(out.detach(), ref_out[lo:hi].detach(), atol=ATOL, rtol=0)
        ref_loss = (ref_out * w).sum() / world_size
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()

    # every row each rank holds equals the reference; the shards cover each table exactly once
    ref_sd = reference.state_dict()
    covered = torch.zeros(len(TABLE_ROWS), dtype=torch.float64)
    for i, (key, value) in enumerate(sorted(model.state_dict().items())):
        key = key.removeprefix("module.")
        ref = ref_sd[key]
        if hasattr(value, "local_shards"):
            for shard in value.local_shards():
                r0, c0 = shard.metadata.shard_offsets
                r, c = shard.metadata.shard_sizes
                torch.testing.assert_close(shard.tensor, ref[r0:r0 + r, c0:c0 + c], atol=ATOL, rtol=0)
                covered[i] += shard.tensor.numel()
        else:
            torch.testing.assert_close(value, ref, atol=ATOL, rtol=0)
            covered[i] += value.numel() / world_size  # replicated: each rank counts its share
        assert not torch.equal(ref, init[key]), f"{key} did not train"
    dist.all_reduce(covered)
    expected = torch.tensor([float(r * DIM) for r in TABLE_ROWS], dtype=torch.float64)
    torch.testing.assert_close(covered, expected)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "sharding_type,local_world_size",
    [
        ("data_parallel", 2),
        ("table_wise", 2),
        ("row_wise", 2),
        ("column_wise", 2),
        ("table_row_wise", 2),
        ("table_column_wise", 2),
        ("table_row_wise", 1),
    ],
)
def test_sharding_type_matches_unsharded(sharding_type: str, local_world_size: int) -> None:
    run_multiprocess(_train_and_compare, WORLD_SIZE, sharding_type=sharding_type, local_world_size=local_world_size)
