"""rayemb's CUDA path on one GPU: FBGEMM CUDA kernels through TorchRec sharding, NCCL, world size 1.

The CPU suite (``tests/dist``) proves the sharded model equal to an unsharded one over gloo; this
module runs the same checks on a GPU machine (``docs/dev/gpu.md``), with the same reference code
(imported from ``tests/dist/test_hybrid_equivalence.py``, ``tests/dist/test_export_equivalence.py``
and ``tests/_sparse.py``, not copied):

* the hybrid module (hot halves data-parallel under DDP/NCCL, cold halves and a plain table
  table-/row-/column-wise on FBGEMM's CUDA ``fused`` kernel), SGD and row-wise Adagrad, plain and
  per-id weighted: logits every step and every row after STEPS steps equal an unsharded CPU
  ``EmbeddingBagCollection`` trained on the same batches, to 1e-5;
* a table the planner caches on CUDA (``kernel: cached`` -> TorchRec ``fused_uvm_caching``, rows in
  UVM host memory behind an HBM cache of 10 % of them): the same equivalence;
* the job's DLRM (``rayemb.train.worker.build.sharded_model``) trained on generated data: finite, falling loss;
* the calibration's compute probes (``rayemb.train.calibration.calibrate.measure_compute``) on the GPU.

One GPU means one NCCL rank: NCCL cannot put two ranks on the same device, so the collectives
are real NCCL calls over a world of one (multi-rank equivalence stays with the gloo suite).
Without CUDA the module is skipped (CI has no GPU).
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Dict

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU: rayemb's CUDA path (FBGEMM CUDA kernels, NCCL); see docs/gpu.md",
                allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dist"))

import test_export_equivalence as export_eq  # noqa: E402
import test_hybrid_equivalence as hyb  # noqa: E402
from _sparse import kjt_slice, reference_rows, rowwise_adagrad_  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

DEVICE = torch.device("cuda", 0)
#: (name, rows, dim, pooling, hot ids): one table cached on the GPU, one plain
_CACHED_TABLES = [("big", 4000, 16, "sum", None), ("small", 64, 16, "sum", None)]
CACHE_LOAD_FACTOR = 0.1
#: _global_batches draws LOCAL_BATCH x this many rows per step: 128 bags, ~250 distinct rows of "big"
CACHED_BATCH_MULTIPLE = 32


@pytest.fixture(scope="module")
def nccl_world():
    """The default process group: NCCL, one rank on cuda:0."""
    import torch.distributed as dist

    from rayemb.multiprocess import free_port, process_group

    torch.cuda.set_device(DEVICE)
    with process_group(0, 1, free_port(), backend="nccl"):
        assert dist.get_backend() == "nccl"
        yield


def _optimizer(name: str):
    from torchrec.optim import RowWiseAdagrad

    return (torch.optim.SGD, {"lr": hyb.LR}) if name == "sgd" else (RowWiseAdagrad, {"lr": hyb.LR, "eps": hyb.EPS})


def _shards(value):
    """(tensor on CPU, (row0, col0), (rows, cols)) of every shard this rank holds of a state-dict entry."""
    if hasattr(value, "local_shards"):
        return [(s.tensor.cpu(), s.metadata.shard_offsets, s.metadata.shard_sizes) for s in value.local_shards()]
    return [(value.cpu(), [0, 0], list(value.shape))]


def _train_and_compare(model, opts, reference, remapper, batches, optimizer: str, ada_blocks, rows=None) -> Dict:
    """STEPS steps of the sharded CUDA ``model`` and the CPU ``reference`` on the same global batches.

    Logits must agree every step (before the step); returns the largest logit difference and step
    times. ``rows``: rows per batch (default: all of the global batch).
    """
    bce = torch.nn.BCEWithLogitsLoss()
    ref_params = list(reference.sparse.parameters())
    ref_head_opt = torch.optim.SGD(reference.head.parameters(), lr=hyb.LR)
    ref_sparse_opt = torch.optim.SGD(ref_params, lr=hyb.LR) if optimizer == "sgd" else None
    ada_state: Dict[int, torch.Tensor] = {}
    logit_diff, times = 0.0, []
    for feats, labels in batches:
        n = rows or len(labels)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(remapper.remap(kjt_slice(feats, 0, n)).to(DEVICE))
        bce(logits, torch.from_numpy(labels[:n]).to(DEVICE)).backward()
        for o in opts:
            o.step()
            o.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        assert logits.device.type == DEVICE.type

        ref_logits = reference(kjt_slice(feats, 0, n))
        torch.testing.assert_close(logits.detach().cpu(), ref_logits.detach(), atol=hyb.ATOL, rtol=0)
        logit_diff = max(logit_diff, float((logits.detach().cpu() - ref_logits.detach()).abs().max()))
        reference.zero_grad()
        bce(ref_logits, torch.from_numpy(labels[:n])).backward()
        ref_head_opt.step()
        if ref_sparse_opt is not None:
            ref_sparse_opt.step()
        else:
            for p in ref_params:
                block_rows, cols = ada_blocks.get(id(p), (None, ()))
                rowwise_adagrad_(p, ada_state, id(p), hyb.LR, hyb.EPS, cols, block_rows)
    return {"logit_diff": logit_diff, "step_s": times}


def _compare_rows(model, reference, remapper, init, configs) -> float:
    """Every row the model holds (hot, cold, plain, cached) equals the reference's; every table trained."""
    ref_sd = reference.state_dict()
    covered = {c.name: 0 for c in configs}
    max_diff = 0.0
    for key, value in model.state_dict().items():
        key = key.removeprefix("module.")
        if key.startswith("head."):
            torch.testing.assert_close(value.cpu(), ref_sd[key], atol=hyb.ATOL, rtol=0)
            continue
        if not key.endswith(".weight"):
            continue  # optimizer state or cache bookkeeping exposed as buffers
        table = key.split(".")[-2]
        logical, ref = reference_rows(ref_sd, remapper, table)
        for tensor, (r0, c0), (r, c) in _shards(value):
            expect = ref[r0:r0 + r, c0:c0 + c]
            torch.testing.assert_close(tensor, expect, atol=hyb.ATOL, rtol=0, msg=lambda m: f"{key}: {m}")
            max_diff = max(max_diff, float((tensor - expect).abs().max()) if tensor.numel() else 0.0)
            covered[logical] += tensor.numel()
    for c in configs:
        assert covered[c.name] == c.num_embeddings * c.embedding_dim, (c.name, covered[c.name])
        assert not torch.equal(ref_sd[f"sparse.embedding_bags.{c.name}.weight"],
                               init[f"sparse.embedding_bags.{c.name}.weight"]), f"{c.name} did not train"
    return max_diff


def _shard(src, plan, sharders):
    """Sharded as the job shards: one DDP (NCCL) for the head and the hot halves' data-parallel lookup."""
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from rayemb.embedding.data_parallel import OneDataParallelWrapper

    return DistributedModelParallel(src, device=DEVICE, plan=plan, sharders=sharders,
                                    data_parallel_wrapper=OneDataParallelWrapper())


def _load_reference(model, hybrid, configs, init) -> None:
    state = {"head.linear.weight": init["head.linear.weight"], "head.linear.bias": init["head.linear.bias"]}
    state.update(hybrid.split_state_dict({c.name: init[f"sparse.embedding_bags.{c.name}.weight"] for c in configs},
                                         prefix="sparse."))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert not [k for k in missing if k.endswith("weight") or k.endswith("bias")], missing


def _dense_optimizers(model, fused_cls, fused_kw):
    """Head: SGD; data-parallel hot halves: the embedding optimizer on DDP-averaged gradients (as loop.py)."""
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from rayemb.embedding.data_parallel import replicated_embedding_parameters

    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    hot = replicated_embedding_parameters(model)
    head = {k: p for k, p in dense.items() if k not in hot}
    assert set(head) == {"head.linear.weight", "head.linear.bias"}, sorted(dense)
    opts = [KeyedOptimizerWrapper(head, lambda ps: torch.optim.SGD(ps, lr=hyb.LR))]
    if hot:
        opts.append(KeyedOptimizerWrapper(hot, lambda ps: fused_cls(ps, **fused_kw)))
    return opts, hot


def _hybrid_case(placement: str, optimizer: str, spec, weighted: bool) -> Dict:
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
    from rayemb.embedding.sharders import cpu_capable_sharders

    configs = hyb._configs(spec)
    in_dim = sum(c.embedding_dim for c in configs)
    torch.manual_seed(0)
    reference = hyb._Model(EmbeddingBagCollection(configs, is_weighted=weighted), in_dim)
    init = {k: v.detach().clone() for k, v in reference.state_dict().items()}

    hybrid = HybridEmbeddingBagCollection(configs, hyb._hot(spec), is_weighted=weighted, device=torch.device("meta"))
    src = hyb._Model(hybrid, in_dim)
    src.head.to(DEVICE)
    fused_cls, fused_kw = _optimizer(optimizer)
    apply_optimizer_in_backward(fused_cls, src.sparse.parameters(), dict(fused_kw))
    plain_types = {n: [placement] for n, _, _, _, h in spec if h is None}
    constraints = hybrid.parameter_constraints(placement, plain_types, min_partition=2)
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device=DEVICE.type),
                                    constraints=constraints).collective_plan(src, cpu_capable_sharders(),
                                                                             dist.GroupMember.WORLD)
    kernels = {}
    for module_plan in plan.plan.values():
        for table, ps in module_plan.items():
            want = "data_parallel" if table.endswith("__hot") else placement
            assert ps.sharding_type == want, (table, ps.sharding_type, want)
            if want != "data_parallel":
                assert ps.compute_kernel == "fused", (table, ps.compute_kernel)  # FBGEMM's CUDA TBE in HBM
                assert all(s.placement.device().type == DEVICE.type for s in ps.sharding_spec.shards), ps
            kernels[table] = ps.compute_kernel
    model = _shard(src, plan, cpu_capable_sharders())
    _load_reference(model, hybrid, configs, init)
    opts, _ = _dense_optimizers(model, fused_cls, fused_kw)
    ada_blocks = hyb._column_blocks(plan, reference, hybrid.remapper) if placement == "column_wise" else {}
    batches = hyb._global_batches(spec, 1, weighted)
    kinds = set().union(*(hyb._bag_kinds(hybrid.remapper, feats) for feats, _ in batches))
    assert {"empty", "all_hot", "all_cold", "mixed", "duplicate"} <= kinds, kinds
    out = _train_and_compare(model, opts, reference, hybrid.remapper, batches, optimizer, ada_blocks)
    out["row_diff"] = _compare_rows(model, reference, hybrid.remapper, init, configs)
    out["column_blocks"] = max((len(c) for _, c in ada_blocks.values()), default=0)
    return out


@pytest.mark.parametrize("placement", hyb.COLD_PLACEMENTS)
def test_hybrid_and_plain_tables_on_cuda_match_unsharded(nccl_world, placement: str) -> None:
    results = {}
    for optimizer in hyb.OPTIMIZERS:
        for weighted, spec in ((False, hyb._TABLES), (True, hyb._WEIGHTED_TABLES)):
            case = f"{placement}/{optimizer}/{'weighted' if weighted else 'unweighted'}"
            try:
                results[case] = r = _hybrid_case(placement, optimizer, spec, weighted)
            except AssertionError as e:
                raise AssertionError(f"case {case}: {e}") from e
            assert r["logit_diff"] <= hyb.ATOL and r["row_diff"] <= hyb.ATOL, (case, r)
    for case, r in results.items():
        print(f"GPU-RESULT hybrid {case}: max |logit diff| {r['logit_diff']:.3g}, max |row diff| {r['row_diff']:.3g}, "
              f"column blocks {r['column_blocks']}, last step {r['step_s'][-1] * 1e3:.2f} ms")


@pytest.mark.parametrize("optimizer", hyb.OPTIMIZERS)
def test_planner_cached_table_runs_fused_uvm_caching_and_matches_unsharded(nccl_world, optimizer: str) -> None:
    """``kernel: cached`` on a CUDA topology: the torchrec engine's plan puts the table on FBGEMM's
    UVM-caching kernel; the sharded model built from that plan trains like the unsharded one."""
    from torchrec.distributed.types import ShardingPlan
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from rayemb.embedding.placements import hybrid_from_placements
    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.planner import ClusterTopology, TableSpec, plan

    topology = ClusterTopology(num_nodes=1, devices_per_node=1, compute_device="cuda")
    specs = [TableSpec(n, rows=v, dim=d) for n, v, d, _, _ in _CACHED_TABLES]
    result = plan(specs, topology, global_batch=hyb.LOCAL_BATCH * CACHED_BATCH_MULTIPLE, engine="torchrec",
                  pins={"big": {"kernel": "cached", "cache_load_factor": CACHE_LOAD_FACTOR}})
    big = result.tables["big"]
    assert big.compute_kernel == "fused_uvm_caching" and big.storage["kernel"] == "cached", (big, big.storage)
    kernels = {t: ps.compute_kernel for mp in result.sharding_plan.plan.values() for t, ps in mp.items()}
    assert kernels["big"] == "fused_uvm_caching", kernels

    configs = hyb._configs(_CACHED_TABLES)
    in_dim = sum(c.embedding_dim for c in configs)
    torch.manual_seed(0)
    reference = hyb._Model(EmbeddingBagCollection(configs), in_dim)
    init = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    emb, _ = hybrid_from_placements(configs, result.tables, {}, device=torch.device("meta"))
    src = hyb._Model(emb, in_dim)
    src.head.to(DEVICE)
    fused_cls, fused_kw = _optimizer(optimizer)
    apply_optimizer_in_backward(fused_cls, src.sparse.parameters(), dict(fused_kw))
    sharding_plan = ShardingPlan(plan={f"sparse.{path}": mp for path, mp in result.sharding_plan.plan.items()})
    model = _shard(src, sharding_plan, cpu_capable_sharders())
    _load_reference(model, emb, configs, init)
    opts, _ = _dense_optimizers(model, fused_cls, fused_kw)
    batches = hyb._global_batches(_CACHED_TABLES, CACHED_BATCH_MULTIPLE, False)
    big_ids = np.unique(np.concatenate([f["f_big"][1] for f, _ in batches]))
    cache_rows = math.ceil(CACHE_LOAD_FACTOR * 4000)
    assert big_ids.size > cache_rows, (big_ids.size, cache_rows)  # the steps together miss and evict
    out = _train_and_compare(model, opts, reference, emb.remapper, batches, optimizer, {})
    out["row_diff"] = _compare_rows(model, reference, emb.remapper, init, configs)
    assert out["logit_diff"] <= hyb.ATOL and out["row_diff"] <= hyb.ATOL, out
    print(f"GPU-RESULT cached/{optimizer}: kernels {kernels}, {big_ids.size} distinct rows of big over "
          f"{len(batches)} steps for {cache_rows} cache slots, max |logit diff| {out['logit_diff']:.3g}, "
          f"max |row diff| {out['row_diff']:.3g}, last step {out['step_s'][-1] * 1e3:.2f} ms")


def test_job_dlrm_trains_on_cuda(nccl_world, tmp_path) -> None:
    """The job's own model code (build_model + sharded_model: DLRM over the hybrid module, fused FBGEMM
    optimizer, Adagrad MLPs) on export_eq.PLAN's placements, planned for CUDA: the loss falls."""
    import pyarrow.parquet as pq
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    from rayemb.config import config_from_dict
    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import DatasetSchema, parquet_files
    from rayemb.data.synthetic import SyntheticSpec, generate
    from rayemb.embedding.placements import hybrid_from_placements
    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.contract.tables import table_configs
    from rayemb.train.worker.build import sharded_model
    from rayemb.train.sharding import JobPlan, build_model

    steps, batch, dim = 60, 256, export_eq.DIM
    data = str(tmp_path / "data")
    generate(SyntheticSpec(rows=int(steps * batch / 0.8), num_tables=6, multi_hot=True, mean_pooling=3, seed=3,
                           num_signal_tables=4, cardinalities=[60, 50, 40, 45, 30, 35], valid_fraction=0.1), data)
    cfg = config_from_dict({
        "name": "gpu-dlrm", "data": {"path": data, "batch_size": batch},
        "model": {"embedding_dim": dim, "bottom_mlp": [16, dim], "top_mlp": [16, 1]},
        "train": {"dense_lr": 0.1, "embedding_lr": 0.1},
        "tracking": {"output_dir": str(tmp_path / "runs"), "experiment": "gpu-dlrm"},
    })
    schema = DatasetSchema.load(data)
    placements = {t: export_eq._Placement(p, s) for t, (p, s, _) in export_eq.PLAN.items()}
    hot = {t: h for t, (p, _, h) in export_eq.PLAN.items() if p == "hybrid"}
    _, constraints = hybrid_from_placements(table_configs(schema, dim), placements, hot, device=torch.device("meta"))
    meta_model, _, _ = build_model(cfg, schema, placements, hot, torch.device("meta"), torch.device("meta"))
    sharding_plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device=DEVICE.type),
                                             constraints=constraints).collective_plan(
        meta_model, cpu_capable_sharders(), dist.GroupMember.WORLD)
    job_plan = JobPlan(sharding_plan=sharding_plan, placements=placements, hot_ids=hot, summary={})
    torch.manual_seed(cfg.train.seed)
    model, optimizer, remapper = sharded_model(cfg, schema, job_plan, DEVICE)
    kernels = sorted({ps.compute_kernel for mp in sharding_plan.plan.values() for ps in mp.values()})
    convert = BatchConverter(schema, cfg.data.id_policy, remap=remapper.remap)
    train = pq.read_table(parquet_files(cfg.data.path, "train"))
    assert train.num_rows >= steps * batch, train.num_rows
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses, times = [], []
    for step in range(steps):
        b = convert(train.slice(step * batch, batch))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = loss_fn(model(b.dense.to(DEVICE), b.sparse.to(DEVICE)), b.labels.to(DEVICE))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))  # synchronizes
        times.append(time.perf_counter() - t0)
    assert all(math.isfinite(x) for x in losses), losses
    first, last = float(np.mean(losses[:10])), float(np.mean(losses[-10:]))
    assert last < first - 0.02, (first, last, losses)
    step_ms = float(np.median(times[10:])) * 1e3
    print(f"GPU-RESULT dlrm: kernels {kernels}, loss mean of steps 1-10 {first:.4f} -> 51-60 {last:.4f}, "
          f"median step {step_ms:.2f} ms (batch {batch}), peak memory "
          f"{torch.cuda.max_memory_allocated(DEVICE) / 2**20:.1f} MiB")


def test_calibration_compute_probes_on_cuda(caplog) -> None:
    """``measure_compute`` (what ``calibrate_rank`` runs on each rank) on the GPU: the per-id and per-element
    slopes are positive and physically sane, the fixed costs positive, the whole probe fast and small.

    The CPU's probe sizes (256 vs 8192 ids, 1k vs 50k rows) are launch-bound on an H100 and gave slopes of 0
    or noise; on CUDA the probes grow until the kernels' work doubles the time (docs/dev/gpu.md). ``calibrate_rank``
    itself imports ``rayemb.train.worker.backend`` (Ray) and is exercised with Ray in CI."""
    import logging

    from rayemb.train.calibration.calibrate import measure_compute

    torch.cuda.synchronize(DEVICE)
    torch.cuda.reset_peak_memory_stats(DEVICE)
    base = torch.cuda.memory_allocated(DEVICE)
    t0 = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="rayemb.train.calibration.calibrate"):
        out = measure_compute(DEVICE, local_batch=1024, num_dense=13, num_sparse=8, dim=16,
                              bottom_mlp=[64, 16], top_mlp=[64, 1])
    seconds = time.perf_counter() - t0
    peak_gib = (torch.cuda.max_memory_allocated(DEVICE) - base) / 2**30
    for rec in caplog.records:
        print("GPU-RESULT calibrate " + rec.getMessage())
    flat = {k: float(v) for k, v in out.items() if isinstance(v, (int, float))}
    print("GPU-RESULT calibrate: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(flat.items()))
          + f"; {seconds:.2f} s, peak {peak_gib:.2f} GiB")
    assert {"lookup_s", "dense_lookup_s", "pool_s", "group_overhead_s", "dense_step_s"} <= set(flat), out
    assert all(math.isfinite(v) and v >= 0 for v in flat.values()), out
    assert flat["group_overhead_s"] > 0 and flat["dense_step_s"] > 0, out
    # a slope of 0 means the probe stayed launch-bound: the step-time model would price lookups as free
    for key in ("lookup_s", "dense_lookup_s", "replicated_elem_s"):
        assert flat[key] > 0, (key, out)
    # a million fused lookups (forward + backward + row-wise Adagrad) on an H100: more than 10 us, less than 100 ms
    assert 1e-5 < flat["lookup_s"] * 1e6 < 0.1, out
    # a replicated element costs at least a 4-byte write at HBM speed (~3 TB/s) and far less than 10 ns
    assert 1e-12 < flat["replicated_elem_s"] < 1e-8, out
    assert seconds < 10.0, seconds
    assert peak_gib < 2.0, peak_gib


def test_device_feed_copies_on_its_stream_and_trains_as_plain_copies() -> None:
    """Pinned host batches copied on the feed's stream (non_blocking) give the losses of plain synchronous copies,
    with the copies really asynchronous (pinned sources) and on a stream other than the step's."""
    from rayemb.train.worker.device_feed import DeviceFeed, pinned
    from rayemb.train.worker.step import StepBatch, TrainStep

    host = [StepBatch((torch.randn(4096, 64, generator=torch.Generator().manual_seed(i)),),
                      torch.randint(0, 2, (4096,), generator=torch.Generator().manual_seed(i)).float())
            for i in range(20)]

    def move(batch, non_blocking):
        return StepBatch(tuple(t.to(DEVICE, non_blocking=non_blocking) for t in batch.inputs),
                         batch.labels.to(DEVICE, non_blocking=non_blocking))

    def train(batches):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 1), torch.nn.Flatten(0)).to(DEVICE)
        step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.BCEWithLogitsLoss())
        return torch.stack(list(step.steps(batches))).cpu()

    pin = pinned(lambda b: b)
    staged = [pin(b) for b in host]
    assert all(b.inputs[0].is_pinned() and b.labels.is_pinned() for b in staged)
    feed = DeviceFeed(staged, move, DEVICE)
    assert feed.stream is not None and feed.stream != torch.cuda.current_stream(DEVICE)
    fed = train(feed)
    plain = train(move(b, False) for b in host)
    assert torch.equal(fed, plain), (fed - plain).abs().max()
