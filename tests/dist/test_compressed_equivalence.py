"""Compressed embedding bags (QR mult/add/concat, block) under DMP train exactly like the per-id reference.

On 2 and 3 gloo ranks, one ``CompressedEmbeddingBagCollection`` holding a
QR-mult table (two dims: two ``EmbeddingCollection`` s), a mean-pooled QR-add
table, a QR-concat table, a block table and a plain table, plus a dense
linear head, is sharded with ``DistributedModelParallel`` with every physical
table under one placement (data-parallel, table-, row-, column- or table-row-wise, the last
with the QR-mult tables row-wise: an ``EmbeddingCollection`` has no TWRW). The
reference is :class:`CompressedReference` (plain ``nn.Embedding`` rows,
combined and projected per id, then pooled) + the same head, trained on the
whole global batch with the mean loss (= the mean over ranks of each rank's
mean loss). Multi-hot bags of 0..4 ids with empty bags. Pooled outputs are
compared in every step (the second step runs after an optimizer step) and
every row each rank holds, the projection and the head after the last step,
to 1e-5, for SGD and row-wise Adagrad (fused FBGEMM in backward for sharded
tables, TorchRec ``RowWiseAdagrad`` on DDP-averaged gradients for
data-parallel ones, a few lines of torch for the reference), and with
per-id weights under every placement (SGD). Data-parallel QR-mult tables are
plain replicated rows (``ReplicatedRows``), the others TorchRec tables. Single-process tests check the unsharded module against the
reference (forward and gradients: pooling before the block projection equals
projecting each row then pooling) and that the data tells a wrong QR-mult
pooling apart.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _sparse import HeadModel, kjt_slice, rowwise_adagrad_

from rayemb.embedding.compression_math import CompressionSpec
from rayemb.multiprocess import run_multiprocess

LOCAL_BATCH = 4
STEPS = 2
LR = 0.1
EPS = 1e-8
ATOL = 1e-5
PLACEMENTS = ("data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise")
OPTIMIZERS = ("sgd", "rowwise_adagrad")

# name, rows, dim, pooling, compression
_TABLES: List[Tuple[str, int, int, str, CompressionSpec]] = [
    ("qmult", 40, 8, "sum", CompressionSpec("qr", combine="mult")),  # m = 7: 6 x 7 rows
    ("qmult4", 25, 4, "sum", CompressionSpec("qr", buckets=4, combine="mult")),  # 7 x 4 rows, second dim
    ("qadd", 30, 8, "mean", CompressionSpec("qr", buckets=4, combine="add")),
    ("qcat", 36, 16, "sum", CompressionSpec("qr", combine="concat")),  # two 6 x 8 tables
    ("block", 50, 16, "sum", CompressionSpec("block", block_dim=8)),
    ("plain", 16, 8, "sum", CompressionSpec()),
]
CASES = [(p, o, False) for p in PLACEMENTS for o in OPTIMIZERS] + [(p, "sgd", True) for p in PLACEMENTS]


def _configs():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

    return [
        EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=v, feature_names=[f"f_{n}"],
                           pooling=PoolingType.MEAN if p == "mean" else PoolingType.SUM)
        for n, v, d, p, _ in _TABLES
    ]


def _specs() -> Dict[str, CompressionSpec]:
    return {n: s for n, _, _, _, s in _TABLES}


def _global_batches(world_size: int, weighted: bool, seed: int = 5):
    """STEPS global batches: per feature (lengths, ids, weights), labels; bags of 0..4 ids, some empty."""
    rng = np.random.default_rng(seed)
    b = LOCAL_BATCH * world_size
    out = []
    for _ in range(STEPS):
        feats = {}
        for n, v, _, _, _ in _TABLES:
            lengths = rng.integers(0, 5, size=b)
            lengths[0] = 0
            lengths[1] = 4
            nnz = int(lengths.sum())
            w = rng.uniform(0.5, 1.5, size=nnz).astype(np.float32) if weighted else None
            feats[f"f_{n}"] = (lengths.astype(np.int64), rng.integers(0, v, size=nnz).astype(np.int64), w)
        out.append((feats, rng.integers(0, 2, size=b).astype(np.float32)))
    return out


def _train_one(rank: int, world_size: int, placement: str, optimizer: str, weighted: bool) -> float:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from rayemb.embedding.compressed import CompressedReference, compressed_from_placements
    from rayemb.embedding.data_parallel import replicated_embedding_parameters
    from rayemb.embedding.sharders import cpu_capable_sharders

    configs = _configs()
    in_dim = sum(c.embedding_dim for c in configs)
    torch.manual_seed(0)
    # table_row_wise: for the tables pooled in the EBC; QR mult's EmbeddingCollection has none, it goes row-wise
    types = {c.name: "row_wise" if placement == "table_row_wise" and c.name.startswith("qmult") else placement
             for c in configs}
    sparse, constraints = compressed_from_placements(configs, _specs(), types,
                                                     is_weighted=weighted, min_partition=2)
    src = HeadModel(sparse, in_dim)
    init = {k: v.detach().clone() for k, v in src.state_dict().items()}
    reference = HeadModel(CompressedReference(configs, _specs(), is_weighted=weighted), in_dim)
    reference.sparse.load_from({k[len("sparse."):]: v for k, v in init.items() if k.startswith("sparse.")})
    reference.head.load_state_dict(src.head.state_dict())
    ref_init = {k: v.detach().clone() for k, v in reference.state_dict().items()}

    if optimizer == "sgd":
        fused_cls, fused_kw = torch.optim.SGD, {"lr": LR}
    else:
        fused_cls, fused_kw = RowWiseAdagrad, {"lr": LR, "eps": EPS}
    apply_optimizer_in_backward(fused_cls, sparse.table_parameters(), dict(fused_kw))
    sharders = cpu_capable_sharders()
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                       constraints=constraints)
    plan = planner.collective_plan(src, sharders, dist.GroupMember.WORLD)
    planned = {t: ps for module_plan in plan.plan.values() for t, ps in module_plan.items()}
    physical = sorted(n for c in configs for n in sparse.physical_table_names(c.name))
    # data-parallel QR-mult tables are plain replicated nn.Embedding, outside TorchRec's plan
    replicated = sorted(sparse.replicated["embeddings"]) if sparse.replicated is not None else []
    assert replicated == (["qmult4__q", "qmult4__r", "qmult__q", "qmult__r"] if placement == "data_parallel" else [])
    assert sorted(planned) == sorted(set(physical) - set(replicated)), planned
    assert all(ps.sharding_type == types[t.split("__")[0]] for t, ps in planned.items()), planned
    model = DistributedModelParallel(src, device=torch.device("cpu"), plan=plan, sharders=sharders)
    missing, unexpected = model.load_state_dict(init, strict=False)
    assert not unexpected and not [k for k in missing if k.endswith("weight") or k.endswith("bias")], (
        missing, unexpected)

    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    dp_tables = replicated_embedding_parameters(model)
    assert bool(dp_tables) == (placement == "data_parallel"), sorted(dense)
    others = {k: p for k, p in dense.items() if k not in dp_tables}
    assert {k.removeprefix("module.") for k in others} == {"head.weight", "head.bias",
                                                           "sparse.projections.block.weight"}
    opts = [KeyedOptimizerWrapper(others, lambda ps: torch.optim.SGD(ps, lr=LR))]
    if dp_tables:
        opts.append(KeyedOptimizerWrapper(dp_tables, lambda ps: fused_cls(ps, **fused_kw)))

    ref_tables = list(reference.sparse.tables.parameters())
    ref_dense_opt = torch.optim.SGD(list(reference.head.parameters()) + list(reference.sparse.projections.parameters()),
                                    lr=LR)
    ref_table_opt = torch.optim.SGD(ref_tables, lr=LR) if optimizer == "sgd" else None
    ada_state: Dict[int, torch.Tensor] = {}
    ada_blocks = {}
    for name, ps in planned.items():
        cols = sorted({(s.shard_offsets[1], s.shard_sizes[1]) for s in ps.sharding_spec.shards}) \
            if ps.sharding_type == "column_wise" else []
        if len(cols) > 1:
            ada_blocks[id(reference.sparse.tables[name].weight)] = cols
    if placement == "column_wise":  # otherwise CW would degenerate to TW
        split = {n for n in planned if id(reference.sparse.tables[n].weight) in ada_blocks}
        assert set(planned) - {"qmult4__q", "qmult4__r"} <= split, planned  # the 4-wide ones stay whole
    bce = torch.nn.BCEWithLogitsLoss()
    lo, hi = rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH
    for feats, labels in _global_batches(world_size, weighted):
        logits = model(kjt_slice(feats, lo, hi))
        bce(logits, torch.from_numpy(labels[lo:hi])).backward()
        for o in opts:
            o.step()
            o.zero_grad()

        ref_logits = reference(kjt_slice(feats, 0, LOCAL_BATCH * world_size))
        torch.testing.assert_close(logits.detach(), ref_logits[lo:hi].detach(), atol=ATOL, rtol=0)
        reference.zero_grad()
        bce(ref_logits, torch.from_numpy(labels)).backward()
        ref_dense_opt.step()
        if ref_table_opt is not None:
            ref_table_opt.step()
        else:
            for p in ref_tables:
                rowwise_adagrad_(p, ada_state, id(p), LR, EPS, ada_blocks.get(id(p), ()))

    # every row each rank holds, the projection and the head equal the reference's
    ref_sd = reference.state_dict()
    assert not [k for k, v in ref_sd.items() if torch.equal(v, ref_init[k])], "parameters that did not train"
    covered = {name: 0.0 for name in physical}
    max_diff = 0.0
    for key, value in model.state_dict().items():
        key = key.removeprefix("module.")
        if key.startswith("head.") or key.startswith("sparse.projections."):
            ref_key = key
        else:
            covered_name = key.split(".")[-2]
            ref_key = f"sparse.tables.{covered_name}.weight"
        ref = ref_sd[ref_key]
        shards = ([(s.tensor, s.metadata.shard_offsets, s.metadata.shard_sizes) for s in value.local_shards()]
                  if hasattr(value, "local_shards") else [(value, None, None)])
        for tensor, offsets, sizes in shards:
            expect = ref if offsets is None else ref[offsets[0]:offsets[0] + sizes[0], offsets[1]:offsets[1] + sizes[1]]
            torch.testing.assert_close(tensor, expect, atol=ATOL, rtol=0, msg=lambda m: f"{key}: {m}")
            max_diff = max(max_diff, float((tensor - expect).abs().max()) if tensor.numel() else 0.0)
            if ref_key.startswith("sparse.tables."):
                covered[covered_name] += tensor.numel() / (1.0 if hasattr(value, "local_shards") else world_size)
    names = sorted(covered)
    cov = torch.tensor([covered[n] for n in names], dtype=torch.float64)
    dist.all_reduce(cov)
    torch.testing.assert_close(cov, torch.tensor([float(ref_sd[f"sparse.tables.{n}.weight"].numel()) for n in names],
                                                 dtype=torch.float64))
    return max_diff


def _equivalence_rank(rank: int, world_size: int, cases) -> Dict[str, float]:
    out = {}
    for placement, optimizer, weighted in cases:
        case = f"{placement}/{optimizer}/{'weighted' if weighted else 'unweighted'}"
        try:
            out[case] = _train_one(rank, world_size, placement, optimizer, weighted)
        except AssertionError as e:
            raise AssertionError(f"case {case}: {e}") from e
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [2, 3])
def test_compressed_matches_reference_sharded(world_size: int) -> None:
    results = run_multiprocess(_equivalence_rank, world_size, timeout_s=540, cases=CASES)
    for rank, res in enumerate(results):
        assert len(res) == len(CASES), res
        for case, diff in res.items():
            assert diff <= ATOL, (rank, case, diff)


# ---- single process: the unsharded module, the reference and the checks' power ---- #


def _module_and_reference(weighted: bool, data_parallel=()):
    from rayemb.embedding.compressed import CompressedEmbeddingBagCollection, CompressedReference

    torch.manual_seed(1)
    module = CompressedEmbeddingBagCollection(_configs(), _specs(), is_weighted=weighted, data_parallel=data_parallel)
    reference = CompressedReference(_configs(), _specs(), is_weighted=weighted)
    reference.load_from(module.state_dict())
    return module, reference


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("data_parallel", [(), ("qmult", "qmult4")])
def test_unsharded_module_matches_per_id_reference(weighted: bool, data_parallel) -> None:
    """Forward and every parameter's gradient; the block table pools before projecting, the reference
    projects each row then pools (equal by linearity), QR add/concat pool before combining."""
    module, reference = _module_and_reference(weighted, data_parallel)
    assert (module.replicated is not None) == bool(data_parallel)
    feats, _ = _global_batches(world_size=2, weighted=weighted)[0]
    kjt = kjt_slice(feats, 0, 2 * LOCAL_BATCH)
    out, ref = module(kjt), reference(kjt)
    assert out.keys() == ref.keys() == [f"f_{n}" for n, *_ in _TABLES]
    assert out.values().shape == (2 * LOCAL_BATCH, sum(d for _, _, d, _, _ in _TABLES))
    torch.testing.assert_close(out.values(), ref.values(), atol=ATOL, rtol=0)
    assert out.values()[0].abs().sum() == 0  # bag 0 of every feature is empty
    loss_w = torch.linspace(-1.0, 1.0, out.values().numel()).view_as(out.values())
    (out.values() * loss_w).sum().backward()
    (ref.values() * loss_w).sum().backward()
    grads = {k: p.grad for k, p in module.named_parameters()}
    ref_grads = {k: p.grad for k, p in reference.named_parameters()}
    assert len(grads) == len(ref_grads) == len(reference.tables) + 1
    for key, g in grads.items():
        ref_key = key if key.startswith("projections.") else f"tables.{key.split('.')[-2]}.weight"
        assert g is not None and g.abs().sum() > 0, key
        torch.testing.assert_close(g, ref_grads[ref_key], atol=ATOL, rtol=0, msg=lambda m: f"{key}: {m}")


def test_data_tells_pool_then_multiply_apart() -> None:
    """DLRM's QREmbeddingBag pools Q and R, then multiplies: cross terms in multi-hot bags the tests must see."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    module, reference = _module_and_reference(False)
    feats, _ = _global_batches(world_size=2, weighted=False)[0]
    lengths, ids, _ = feats["f_qmult"]
    m = 7
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["q", "r"], values=torch.from_numpy(np.concatenate([ids // m, ids % m])),
        lengths=torch.from_numpy(np.concatenate([lengths, lengths])))

    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name=n, embedding_dim=8, num_embeddings=rows, feature_names=[n])
                                  for n, rows in (("q", 6), ("r", 7))])
    ebc.embedding_bags["q"].weight.data.copy_(reference.tables["qmult__q"].weight.data)
    ebc.embedding_bags["r"].weight.data.copy_(reference.tables["qmult__r"].weight.data)
    pooled = ebc(kjt).to_dict()
    wrong = pooled["q"] * pooled["r"]
    right = reference(kjt_slice(feats, 0, 2 * LOCAL_BATCH))["f_qmult"]
    torch.testing.assert_close(module(kjt_slice(feats, 0, 2 * LOCAL_BATCH))["f_qmult"], right, atol=ATOL, rtol=0)
    single = torch.from_numpy(lengths <= 1)
    torch.testing.assert_close(wrong[single], right[single], atol=ATOL, rtol=0)  # equal on 0/1-id bags only
    assert (wrong[~single] - right[~single]).abs().max() > 100 * ATOL


def test_meta_module_materialises_with_its_init() -> None:
    """DMP allocates meta parameters and calls the owning module's reset_parameters (TorchRec's init_parameters):
    replicated QR-mult remainder rows then start near 1, quotient rows in the logical table's range."""
    from rayemb.embedding.compressed import CompressedEmbeddingBagCollection

    module = CompressedEmbeddingBagCollection(_configs(), _specs(), device=torch.device("meta"),
                                              data_parallel=["qmult"])
    for sub in module.replicated.modules():
        for name, p in list(sub._parameters.items()):
            sub._parameters[name] = torch.nn.Parameter(torch.empty_like(p, device="cpu"))
        if sub._parameters and hasattr(sub, "reset_parameters"):
            sub.reset_parameters()
    a = (1 / 40) ** 0.5  # TorchRec's default range for a 40-row table
    q, r = (module.replicated["embeddings"][n].weight for n in ("qmult__q", "qmult__r"))
    assert q.abs().max() <= a and q.abs().max() > a / 2
    assert (r - 1).abs().max() <= a and r.std() > 0


def test_user_errors() -> None:
    from rayemb.embedding.compressed import CompressedEmbeddingBagCollection, compressed_from_placements
    from rayemb.errors import ConfigError, DataError

    with pytest.raises(ConfigError) as e:
        CompressedEmbeddingBagCollection(_configs(), {"nope": CompressionSpec("qr")})
    assert e.value.category == "invalid_option" and "nope" in str(e.value)
    module = CompressedEmbeddingBagCollection(_configs(), _specs())
    with pytest.raises(ConfigError) as e:
        module.parameter_constraints("table_row_wise")
    assert e.value.category == "invalid_option"
    with pytest.raises(ConfigError, match="qmult"):
        module.parameter_constraints("data_parallel")  # built without data_parallel=[qmult, ...]
    module, constraints = compressed_from_placements(_configs(), _specs(), {n: "data_parallel" for n, *_ in _TABLES})
    assert "qmult__q" not in constraints and constraints["qadd__q"].compute_kernels == ["dense"]
    assert sorted(constraints) == sorted(n for c in _configs() for n in module.physical_table_names(c.name)
                                         if not n.startswith("qmult"))
    feats, _ = _global_batches(world_size=2, weighted=False)[0]
    kjt = kjt_slice(dict(reversed(list(feats.items()))), 0, 2)
    with pytest.raises(DataError):
        module(kjt)
