"""Hybrid embedding under DMP trains exactly like an unsharded EmbeddingBagCollection.

On 2 and 3 gloo ranks, a ``HybridEmbeddingBagCollection`` (hot halves
data-parallel, cold halves row-/table-/column-wise, one plain table) plus a
dense linear head is sharded with ``DistributedModelParallel`` and trained
STEPS steps, each rank on its slice of a global batch. The reference is an
unsharded ``EmbeddingBagCollection`` + the same head trained on the whole
global batch with the loss ``mean over ranks of each rank's mean loss`` (=
mean over the global batch). After training every table row (hot, cold and
plain shards mapped back to logical ids) and every dense parameter must match
to 1e-5, for SGD and for row-wise Adagrad (fused FBGEMM in backward for the
sharded halves, TorchRec ``RowWiseAdagrad`` for the data-parallel hot halves; the
reference is plain torch and a few lines of row-wise Adagrad).

Cases in one model: a table with a partial hot set (bags all hot, all cold,
mixed, empty, with duplicate ids: the data is checked to contain each), a
mean-pooled table, a table with an empty hot set, an entirely hot table, a
second embedding dim (a second cold EmbeddingCollection) and a non-hybrid
table; a second model covers per-id weights. Each world size is one spawned
run (process start-up dominates), iterating placements and optimizers.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _sparse import kjt_slice, reference_rows, rowwise_adagrad_

from rayemb.multiprocess import run_multiprocess
from rayemb.planner.types import HYBRID_COLD_PLACEMENTS

LOCAL_BATCH = 4
STEPS = 3
LR = 0.1
EPS = 1e-8
ATOL = 1e-5
#: every cold-half sharding the hybrid module supports
COLD_PLACEMENTS = tuple(p.value for p in HYBRID_COLD_PLACEMENTS)
OPTIMIZERS = ("sgd", "rowwise_adagrad")

# name, rows, dim, pooling, hot ids (None = plain table)
_TABLES: List[Tuple[str, int, int, str, object]] = [
    ("mixed", 40, 8, "sum", np.arange(0, 12, 2)),
    ("mean", 30, 8, "mean", np.array([0, 1, 2, 3])),
    ("nohot", 20, 8, "sum", np.array([], dtype=np.int64)),
    ("allhot", 12, 8, "sum", np.arange(12)),
    ("dim4", 25, 4, "sum", np.array([5, 9])),
    ("plain", 16, 8, "sum", None),
]
_WEIGHTED_TABLES: List[Tuple[str, int, int, str, object]] = [
    ("wmixed", 40, 8, "sum", np.arange(0, 12, 2)),
    ("wnohot", 20, 8, "sum", np.array([], dtype=np.int64)),
    ("wplain", 16, 8, "sum", None),
]


def _configs(spec):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

    return [
        EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=v, feature_names=[f"f_{n}"],
                           pooling=PoolingType.MEAN if p == "mean" else PoolingType.SUM)
        for n, v, d, p, _ in spec
    ]


def _hot(spec) -> Dict[str, np.ndarray]:
    return {n: h for n, _, _, _, h in spec if h is not None}


def _global_batches(spec, world_size: int, weighted: bool, seed: int = 11):
    """STEPS global batches: per feature (lengths, values, weights), labels.

    Half of the ids are drawn from the table's hot set (when it has one) and
    half uniformly, bags of 0..4 ids, ids drawn from small ranges so bags
    repeat ids.
    """
    rng = np.random.default_rng(seed)
    b = LOCAL_BATCH * world_size
    out = []
    for _ in range(STEPS):
        feats = {}
        for n, v, _, _, hot in spec:
            lengths = rng.integers(0, 5, size=b)
            lengths[0] = 0  # an empty bag in every step
            nnz = int(lengths.sum())
            uniform = rng.integers(0, v, size=nnz)
            if hot is not None and len(hot):
                pick_hot = rng.random(nnz) < 0.5
                uniform = np.where(pick_hot, rng.choice(hot, size=nnz), uniform)
            w = rng.uniform(0.5, 1.5, size=nnz).astype(np.float32) if weighted else None
            feats[f"f_{n}"] = (lengths.astype(np.int64), uniform.astype(np.int64), w)
        labels = rng.integers(0, 2, size=b).astype(np.float32)
        out.append((feats, labels))
    return out


def _bag_kinds(remapper, feats) -> set:
    """Which of all-hot / all-cold / mixed / empty / duplicate bags the hybrid tables' data holds."""
    kinds = set()
    for t in remapper.hybrid_tables():
        lengths, values, _ = feats[f"f_{t}"]
        hot = remapper.hot_ids(t)
        offs = np.concatenate([[0], np.cumsum(lengths)])
        for i in range(len(lengths)):
            bag = values[offs[i]:offs[i + 1]]
            if bag.size == 0:
                kinds.add("empty")
                continue
            h = np.isin(bag, hot)
            kinds.add("all_hot" if h.all() else "all_cold" if not h.any() else "mixed")
            if np.unique(bag).size < bag.size:
                kinds.add("duplicate")
    return kinds


class _Head(torch.nn.Module):
    def __init__(self, in_dim: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(in_dim, 1)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.linear(pooled).squeeze(1)


class _Model(torch.nn.Module):
    def __init__(self, sparse: torch.nn.Module, in_dim: int) -> None:
        super().__init__()
        self.sparse = sparse
        self.head = _Head(in_dim)

    def forward(self, kjt) -> torch.Tensor:
        return self.head(self.sparse(kjt).values())


def _train_one(rank: int, world_size: int, placement: str, optimizer: str, spec, weighted: bool) -> Dict[str, float]:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from rayemb.embedding.comm import CommCounter, instrument_ddp
    from rayemb.embedding.data_parallel import replicated_embedding_parameters
    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
    from rayemb.embedding.sharders import cpu_capable_sharders

    configs = _configs(spec)
    in_dim = sum(c.embedding_dim for c in configs)
    torch.manual_seed(0)
    reference = _Model(EmbeddingBagCollection(configs, is_weighted=weighted), in_dim)
    init = {k: v.detach().clone() for k, v in reference.state_dict().items()}

    hybrid = HybridEmbeddingBagCollection(configs, _hot(spec), is_weighted=weighted)
    remapper = hybrid.remapper
    src = _Model(hybrid, in_dim)
    with torch.no_grad():
        src.head.load_state_dict(reference.head.state_dict())
    if optimizer == "sgd":
        fused_cls, fused_kw = torch.optim.SGD, {"lr": LR}
    else:
        fused_cls, fused_kw = RowWiseAdagrad, {"lr": LR, "eps": EPS}
    apply_optimizer_in_backward(fused_cls, src.sparse.parameters(), dict(fused_kw))

    plain_types = {n: [placement] for n, _, _, _, h in spec if h is None}
    constraints = hybrid.parameter_constraints(placement, plain_types, min_partition=2)
    sharders = cpu_capable_sharders()
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                       constraints=constraints)
    plan = planner.collective_plan(src, sharders, dist.GroupMember.WORLD)
    for path, module_plan in plan.plan.items():
        for table, ps in module_plan.items():
            want = "data_parallel" if table.endswith("__hot") else placement
            assert ps.sharding_type == want, (path, table, ps.sharding_type, want)
    model = DistributedModelParallel(src, device=torch.device("cpu"), plan=plan, sharders=sharders)

    # load the reference's initial rows into hot/cold/plain shards (DMP accepts full tensors)
    state = {"head.linear.weight": init["head.linear.weight"], "head.linear.bias": init["head.linear.bias"]}
    state.update(hybrid.split_state_dict({c.name: init[f"sparse.embedding_bags.{c.name}.weight"] for c in configs},
                                         prefix="sparse."))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert not [k for k in missing if "weight" in k or "bias" in k], missing

    # data-parallel hot halves and the head use regular optimizers on DDP-averaged gradients
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    hot_dense = replicated_embedding_parameters(model)
    assert sorted(hot_dense) == sorted(k for k in dense if "__hot" in k) and hot_dense, sorted(dense)
    head_dense = {k: p for k, p in dense.items() if k not in hot_dense}
    assert set(head_dense) == {"head.linear.weight", "head.linear.bias"}, sorted(dense)
    opts = [KeyedOptimizerWrapper(head_dense, lambda ps: torch.optim.SGD(ps, lr=LR))]
    if hot_dense:
        opts.append(KeyedOptimizerWrapper(hot_dense, lambda ps: fused_cls(ps, **fused_kw)))
    instrument_ddp(model)

    ref_sparse_params = list(reference.sparse.parameters())
    ref_head_opt = torch.optim.SGD(reference.head.parameters(), lr=LR)
    ref_sparse_opt = torch.optim.SGD(ref_sparse_params, lr=LR) if optimizer == "sgd" else None
    ada_state: Dict[int, torch.Tensor] = {}
    ada_blocks = _column_blocks(plan, reference, remapper) if placement == "column_wise" else {}
    if placement == "column_wise":  # otherwise CW would degenerate to TW
        assert any(len(cols) > 1 for _, cols in ada_blocks.values()), ada_blocks
    bce = torch.nn.BCEWithLogitsLoss()
    lo, hi = rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH
    kinds: set = set()
    bytes_seen = 0.0
    for feats, labels in _global_batches(spec, world_size, weighted):
        kinds |= _bag_kinds(remapper, feats)
        with CommCounter() as cc:
            logits = model(remapper.remap(kjt_slice(feats, lo, hi)))
            bce(logits, torch.from_numpy(labels[lo:hi])).backward()
        bytes_seen += cc.total()
        for o in opts:
            o.step()
            o.zero_grad()

        ref_logits = reference(kjt_slice(feats, 0, LOCAL_BATCH * world_size))
        torch.testing.assert_close(logits.detach(), ref_logits[lo:hi].detach(), atol=ATOL, rtol=0)
        reference.zero_grad()
        bce(ref_logits, torch.from_numpy(labels)).backward()
        ref_head_opt.step()
        if ref_sparse_opt is not None:
            ref_sparse_opt.step()
        else:
            for p in ref_sparse_params:
                rows, cols = ada_blocks.get(id(p), (None, ()))
                rowwise_adagrad_(p, ada_state, id(p), LR, EPS, cols, rows)

    assert {"empty", "all_hot", "all_cold", "mixed", "duplicate"} <= kinds, kinds
    assert bytes_seen > 0

    # every row each rank holds equals the reference row of the same logical id
    ref_sd = reference.state_dict()
    covered: Dict[str, float] = {c.name: 0.0 for c in configs}
    max_diff = 0.0
    for key, value in model.state_dict().items():
        key = key.removeprefix("module.")
        if key.startswith("head."):
            torch.testing.assert_close(value, ref_sd[key], atol=ATOL, rtol=0)
            continue
        table = key.split(".")[-2]
        logical, ref = reference_rows(ref_sd, remapper, table)
        shards = (
            [(s.tensor, s.metadata.shard_offsets, s.metadata.shard_sizes) for s in value.local_shards()]
            if hasattr(value, "local_shards") else [(value, [0, 0], list(value.shape))]
        )
        for tensor, (r0, c0), (r, c) in shards:
            expect = ref[r0:r0 + r, c0:c0 + c]
            torch.testing.assert_close(tensor, expect, atol=ATOL, rtol=0, msg=lambda m: f"{key}: {m}")
            max_diff = max(max_diff, float((tensor - expect).abs().max()) if tensor.numel() else 0.0)
            share = 1.0 / world_size if not hasattr(value, "local_shards") else 1.0
            covered[logical] += tensor.numel() * share
    for c in configs:
        assert not torch.equal(ref_sd[f"sparse.embedding_bags.{c.name}.weight"],
                               init[f"sparse.embedding_bags.{c.name}.weight"]), f"{c.name} did not train"
    cov = torch.tensor([covered[c.name] for c in configs], dtype=torch.float64)
    dist.all_reduce(cov)
    torch.testing.assert_close(cov, torch.tensor([float(c.num_embeddings * c.embedding_dim) for c in configs],
                                                 dtype=torch.float64))
    return {"max_diff": max_diff, "bytes": bytes_seen}


def _column_blocks(plan, reference, remapper) -> Dict[int, Tuple[torch.Tensor, list]]:
    """Per reference table parameter: (rows held column-wise, column blocks) from the plan's CW shards."""
    out = {}
    for module_plan in plan.plan.values():
        for table, ps in module_plan.items():
            if ps.sharding_type != "column_wise":
                continue
            logical = table.removesuffix("__cold")
            weight = reference.sparse.embedding_bags[logical].weight
            rows = torch.ones(weight.shape[0], dtype=torch.bool)
            if table.endswith("__cold"):
                rows[:] = False
                rows[torch.from_numpy(remapper.cold_ids(logical))] = True
            cols = sorted({(s.shard_offsets[1], s.shard_sizes[1]) for s in ps.sharding_spec.shards})
            out[id(weight)] = (rows, cols)
    return out


def _equivalence_rank(rank: int, world_size: int, placements, optimizers) -> Dict[str, Dict[str, float]]:
    out = {}
    for placement in placements:
        for optimizer in optimizers:
            for weighted, spec in ((False, _TABLES), (True, _WEIGHTED_TABLES)):
                case = f"{placement}/{optimizer}/{'weighted' if weighted else 'unweighted'}"
                try:
                    out[case] = _train_one(rank, world_size, placement, optimizer, spec, weighted)
                except AssertionError as e:
                    raise AssertionError(f"case {case}: {e}") from e
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world_size", [2, 3])
def test_hybrid_matches_unsharded(world_size: int) -> None:
    results = run_multiprocess(_equivalence_rank, world_size, timeout_s=840,
                               placements=COLD_PLACEMENTS, optimizers=OPTIMIZERS)
    expected = {f"{p}/{o}/{w}" for p in COLD_PLACEMENTS for o in OPTIMIZERS for w in ("weighted", "unweighted")}
    for rank, res in enumerate(results):
        assert set(res) == expected
        for case, r in res.items():
            assert r["max_diff"] <= ATOL, (rank, case, r)
            assert r["bytes"] > 0, (rank, case, r)
