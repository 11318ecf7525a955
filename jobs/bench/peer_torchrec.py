"""The hand-written peer: DLRM training with plain TorchRec + torchrun, as TorchRec's docs and examples teach it.

Same model, data and optimizers as a rayemb job (``--embedding-dim``, ``--bottom-mlp``, ``--top-mlp``,
``--lr``; defaults: jobs/configs/synth_small.yaml): TorchRec's ``DLRM`` (pairwise dot interaction; one
table per sparse feature, sizes from the dataset's ``schema.yaml``) wrapped in ``DLRMTrain``, its
embeddings on the meta device until ``DistributedModelParallel`` places them on gloo; the stock
``EmbeddingShardingPlanner`` over a ``Topology`` of the cluster (world size, ranks per host from
torchrun's ``LOCAL_WORLD_SIZE``, and ``--inter-host-mbit``: the link speed as a user knows it, given to
the planner as ``inter_host_bw`` in its bytes/ms); fused row-wise Adagrad for the sharded embeddings
(``apply_optimizer_in_backward``), dense Adagrad, ``TrainPipelineSparseDist`` driving the steps (the
next batches' input all-to-all overlapped with this step, as in TorchRec's DLRM example).

``--qcomm bf16`` (or ``fp16``) hands the ``EmbeddingBagCollectionSharder`` TorchRec's quantized-comm
codecs: ``get_qcomm_codecs_registry(QCommsConfig(forward_precision=..., backward_precision=...),
device=...)``, which encodes the pooled all-to-all, the row-wise reduce-scatter and the sequence
all-to-all. What they do on CPU/gloo (torchrec 1.8, ``fbgemm_qcomm_codec.py``): the registry replaces a
bf16 precision by fp16 on a ``cpu`` device ("BF16 ... is not supported on GLOO - falling back to
FP16"), so ``--qcomm bf16`` sends fp16 on the wire here, still 2 bytes per element; the encoder itself
is FBGEMM's clamp-and-cast. The gradients of the data-parallel tables and the dense layers go through
DDP's all-reduce, which the codecs do not touch: they stay fp32. The result records the precision asked
(``qcomm``) and the one each collective's codec uses (``qcomm_effective``).

Each rank reads its equal share of the train split's rows (contiguous ranges over the parquet files)
into numpy arrays before any timing (dense: ``log1p(max(x, 0))``, nulls as 0; one id per bag) and
builds every batch by slicing them. Embedding tables TorchRec places data-parallel are plain DDP
parameters (the in-backward optimizer does not apply to them), so, as in TorchRec's own examples, the
dense Adagrad trains them. It runs ``--warmup`` steps, then times ``--steps`` steps between two
barriers; then (``--valid``, default on) scores the whole valid split, each rank its share in batches
of ``--batch-size`` (the last one padded, the padding left out), and rank 0 computes the AUC over all
of it: ``valid_auc`` after ``warmup + steps`` steps, what a rayemb job of as many steps reports.

This file imports nothing from rayemb (it reads ``schema.yaml`` with PyYAML).

Usage::

    torchrun --standalone --nproc-per-node 2 jobs/bench/peer_torchrec.py \\
        --data data/synth_small --batch-size 512 --steps 200 --warmup 20 --out /tmp/peer.json

Across nodes (``multinode.py``'s ``torchrec@fp32`` and ``torchrec@bf16`` rows), one ``torchrun --nnodes
N --node-rank K --nproc-per-node 1 --master-addr HEAD --master-port P`` per node.

Writes (rank 0) ``{"schema_version": 2, "samples_per_s": ..., "step_ms": {...}, "sharding": {...},
"valid_auc": ..., ...}`` and prints one summary line. Notes on the sharding TorchRec picks on CPU: its
default ``EmbeddingBagCollectionSharder`` offers row-wise (and table-row-wise) only on CUDA, so on CPU
the planner chooses among data-parallel, table-wise, column-wise and table-column-wise.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

SCHEMA_VERSION = 2
#: ``--qcomm`` values: TorchRec's ``CommType`` names
QCOMM_PRECISIONS = ("fp32", "bf16", "fp16")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="dataset directory (schema.yaml, train/*.parquet)")
    ap.add_argument("--batch-size", type=int, default=512, help="rows per rank per step (global = this x world)")
    ap.add_argument("--steps", type=int, default=200, help="timed steps")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps before the timed window")
    ap.add_argument("--window", type=int, default=20,
                    help="steps per window for samples_per_s_window_median (rayemb's train.log_every_n_steps)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads per rank (default: CPU cores // world size, at least 1)")
    ap.add_argument("--embedding-dim", type=int, default=16)
    ap.add_argument("--bottom-mlp", default="64,16")
    ap.add_argument("--top-mlp", default="64,32,1")
    ap.add_argument("--lr", type=float, default=0.05, help="dense and embedding learning rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--qcomm", choices=QCOMM_PRECISIONS, default="fp32",
                    help="wire precision of the sharded tables' collectives, both directions (TorchRec's QCommsConfig)")
    ap.add_argument("--inter-host-mbit", type=float, default=None,
                    help="the links between hosts in mbit/s, for the planner's Topology (default: TorchRec's own)")
    ap.add_argument("--no-valid", dest="valid", action="store_false",
                    help="skip scoring the valid split after the timed steps")
    ap.add_argument("--out", default=None, help="result JSON (written by rank 0)")
    ap.add_argument("--torch-profile", action="store_true",
                    help="run the timed window under the torch profiler and print rank 0's top operators")
    return ap.parse_args(argv)


def default_threads(world_size: int, cores: int | None = None) -> int:
    """One equal share of the machine's cores per rank."""
    cores = cores if cores is not None else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                             else os.cpu_count() or 1)
    return max(1, cores // max(1, world_size))


def read_schema(data_dir: str) -> Dict[str, Any]:
    import yaml

    with open(os.path.join(data_dir, "schema.yaml")) as f:
        schema = yaml.safe_load(f)
    for feat in schema["sparse"]:
        if feat.get("multi_hot"):
            raise SystemExit(f"peer_torchrec: feature {feat['name']} is multi-hot; this peer handles one-hot data only")
    return schema


def rank_slices(file_rows: Sequence[int], rank: int, world: int,
                every_row: bool = False) -> List[Tuple[int, int, int]]:
    """This rank's equal share of the split: ``[(file index, first row, end row), ...]``.

    The files' rows, in file order, are cut into ``world`` contiguous ranges of
    ``total // world`` rows (the remainder is dropped so every rank holds as many;
    ``every_row``: the last rank takes it, as scoring a whole split wants).
    """
    per_rank = sum(file_rows) // world
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    if every_row and rank == world - 1:
        hi = sum(file_rows)
    out, offset = [], 0
    for i, n in enumerate(file_rows):
        a, b = max(lo, offset), min(hi, offset + n)
        if a < b:
            out.append((i, a - offset, b - offset))
        offset += n
    return out


def load_arrays(files: Sequence[str], schema: Dict[str, Any], rank: int, world: int,
                every_row: bool = False) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense (N, 13) float32, ids (F, N) int64 feature-major, labels (N,) float32) of this rank's share
    (:func:`rank_slices`)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    dense_cols, sparse = schema["dense"], [f["name"] for f in schema["sparse"]]
    columns = [schema["label"], *dense_cols, *sparse]
    files = sorted(files)
    slices = rank_slices([pq.ParquetFile(f).metadata.num_rows for f in files], rank, world, every_row)
    table = pa.concat_tables([pq.read_table(files[i], columns=columns).slice(a, b - a) for i, a, b in slices])
    n = table.num_rows
    dense = np.empty((n, len(dense_cols)), dtype=np.float32)
    for i, c in enumerate(dense_cols):
        dense[:, i] = pc.fill_null(table.column(c), 0).to_numpy()
    np.log1p(np.maximum(dense, 0.0), out=dense)
    ids = np.empty((len(sparse), n), dtype=np.int64)
    for i, c in enumerate(sparse):
        col = table.column(c)
        if col.null_count:
            raise SystemExit(f"peer_torchrec: sparse column {c} has nulls; this peer expects one id per row")
        ids[i] = col.to_numpy()
    labels = table.column(schema["label"]).to_numpy().astype(np.float32)
    return dense, ids, labels


def window_rates(step_s: Sequence[float], window: int, global_batch: int) -> List[float]:
    """samples/s of each full window of ``window`` consecutive steps."""
    out = []
    for i in range(0, len(step_s) - window + 1, window):
        t = float(sum(step_s[i:i + window]))
        out.append(window * global_batch / t if t > 0 else float("inf"))
    return out


def sharding_of(plan: Any) -> Dict[str, Dict[str, Any]]:
    """{table: {sharding_type, compute_kernel, ranks}} of a TorchRec ``ShardingPlan``."""
    out: Dict[str, Dict[str, Any]] = {}
    for module_plan in plan.plan.values():
        for table, ps in module_plan.items():
            out[table] = {"sharding_type": ps.sharding_type, "compute_kernel": ps.compute_kernel,
                          "ranks": list(ps.ranks) if ps.ranks is not None else None}
    return out


def qcomm_registry(precision: str, device: Any) -> Tuple[Any, Dict[str, Dict[str, str]]]:
    """``(qcomm_codecs_registry, {collective: {forward, backward}})``: TorchRec's codecs for ``precision`` on
    ``device`` as its docs build them (None for fp32), and the wire precision each codec really uses."""
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry

    if precision not in QCOMM_PRECISIONS:
        raise SystemExit(f"peer_torchrec: --qcomm {precision!r} is unknown; use one of {QCOMM_PRECISIONS}")
    kind = CommType[precision.upper()]
    registry = get_qcomm_codecs_registry(QCommsConfig(forward_precision=kind, backward_precision=kind),
                                         device=device)
    effective = {op: {"forward": str(codecs.forward.quantized_dtype).replace("torch.", ""),
                      "backward": str(codecs.backward.quantized_dtype).replace("torch.", "")}
                 for op, codecs in (registry or {}).items()}
    return registry, effective


def inter_host_bw(mbit: float | None) -> Dict[str, float]:
    """The planner's ``Topology`` keyword for a link of ``mbit`` mbit/s (TorchRec counts bandwidths in
    bytes per ms); none when not given, so TorchRec's default stands."""
    return {} if mbit is None else {"inter_host_bw": mbit * 1e6 / 8 / 1e3}


def build_model(tables: Sequence[Tuple[str, int]], dense_in_features: int, *, embedding_dim: int,
                bottom_mlp: Sequence[int], top_mlp: Sequence[int], batch_size: int, world_size: int,
                device: Any, embedding_lr: float, dense_lr: float, local_world_size: int | None = None,
                train_wrapper: bool = False, qcomm_codecs_registry: Dict[str, Any] | None = None,
                topology: Dict[str, float] | None = None) -> Tuple[Any, Any, Any]:
    """The peer's model and optimizer: ``(DistributedModelParallel, CombinedOptimizer, ShardingPlan)``.

    TorchRec's ``DLRM`` with one table per sparse feature (``tables``: ``[(name, rows), ...]``), its
    embeddings on the meta device until DMP places them, fused row-wise Adagrad for the sharded embeddings,
    dense Adagrad for everything else, planned by TorchRec's planner over a ``Topology`` of ``device``'s type
    (``topology``: more of its keywords, e.g. :func:`inter_host_bw`). Without ``qcomm_codecs_registry`` the
    sharders are TorchRec's defaults; with it, an ``EmbeddingBagCollectionSharder`` carrying the codecs, as
    TorchRec's DLRM example builds it. The process group must be initialised. ``train_wrapper`` wraps the
    model in ``DLRMTrain`` (its forward takes a TorchRec ``Batch`` and returns ``(loss, (loss, logits,
    labels))``), which ``TrainPipelineSparseDist`` needs; without it the forward is ``model(dense, kjt)``.
    """
    import torch
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    configs = [EmbeddingBagConfig(name=name, embedding_dim=embedding_dim, num_embeddings=rows, feature_names=[name])
               for name, rows in tables]
    dlrm = DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=configs, device=torch.device("meta")),
        dense_in_features=dense_in_features,
        dense_arch_layer_sizes=list(bottom_mlp),
        over_arch_layer_sizes=list(top_mlp),
        dense_device=device,
    )
    apply_optimizer_in_backward(RowWiseAdagrad, dlrm.sparse_arch.parameters(), {"lr": embedding_lr})
    module = DLRMTrain(dlrm) if train_wrapper else dlrm
    sharders = ([EmbeddingBagCollectionSharder(qcomm_codecs_registry=qcomm_codecs_registry)]
                if qcomm_codecs_registry else get_default_sharders())
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, local_world_size=local_world_size,
                                                         compute_device=device.type, **(topology or {})),
                                       batch_size=batch_size)
    plan = planner.collective_plan(module, sharders, dist.GroupMember.WORLD)
    model = DistributedModelParallel(module=module, device=device, plan=plan, sharders=sharders)
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                      lambda params: torch.optim.Adagrad(params, lr=dense_lr))
    return model, CombinedOptimizer([model.fused_optimizer, dense_opt]), plan


def padded_batches(rows: int, batch_size: int) -> int:
    """Batches of ``batch_size`` that hold ``rows`` rows, the last one padded (at least one)."""
    return max(1, -(-rows // batch_size))


def valid_auc(model: Any, arrays: Tuple[np.ndarray, np.ndarray, np.ndarray], keys: Sequence[str],
              batch_size: int) -> Tuple[float | None, int]:
    """``(AUC over every rank's valid rows, rows scored)`` on rank 0 (``(None, rows)`` elsewhere): each rank
    scores its share in as many batches as the largest share needs (every rank runs the sharded collectives
    alike), the padding masked out, and rank 0 gathers the scores."""
    import torch
    import torch.distributed as dist
    from sklearn.metrics import roc_auc_score
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    dense_np, ids_np, labels_np = arrays
    n = dense_np.shape[0]
    need = torch.tensor([padded_batches(n, batch_size)])
    dist.all_reduce(need, op=dist.ReduceOp.MAX)
    total = int(need.item()) * batch_size
    pad = total - n
    dense = torch.from_numpy(np.concatenate([dense_np, np.zeros((pad, dense_np.shape[1]), np.float32)]))
    ids = torch.from_numpy(np.concatenate([ids_np, np.zeros((ids_np.shape[0], pad), np.int64)], axis=1))
    labels = torch.from_numpy(np.concatenate([labels_np, np.zeros(pad, np.float32)]))
    lengths = torch.ones(len(keys) * batch_size, dtype=torch.int32)
    scores = []
    model.eval()
    with torch.no_grad():
        for s in range(0, total, batch_size):
            kjt = KeyedJaggedTensor.from_lengths_sync(
                keys=list(keys), values=ids[:, s:s + batch_size].contiguous().reshape(-1), lengths=lengths)
            _, (_, logits, _) = model(Batch(dense_features=dense[s:s + batch_size], sparse_features=kjt,
                                            labels=labels[s:s + batch_size]))
            scores.append(logits.reshape(-1).float())
    model.train()
    mine = torch.stack([torch.cat(scores), labels, (torch.arange(total) < n).float()])
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine)
    every = torch.cat(parts, dim=1)
    keep = every[2] > 0
    rows = int(keep.sum().item())
    if dist.get_rank() != 0:
        return None, rows
    y, p = every[1][keep].numpy(), every[0][keep].numpy()
    return (float(roc_auc_score(y, p)) if 0 < y.sum() < len(y) else None), rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    import torch
    import torch.distributed as dist
    from torchrec.datasets.utils import Batch
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = args.threads or default_threads(world)
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    # ---- data: this rank's rows, in memory, before any timing ---- #
    schema = read_schema(args.data)
    files = glob.glob(os.path.join(args.data, "train", "*.parquet"))
    if not files:
        raise SystemExit(f"peer_torchrec: no parquet files under {args.data}/train")
    valid_files = glob.glob(os.path.join(args.data, "valid", "*.parquet"))
    if args.valid and not valid_files:
        raise SystemExit(f"peer_torchrec: no parquet files under {args.data}/valid (or pass --no-valid)")
    t_load = time.perf_counter()
    dense_np, ids_np, labels_np = load_arrays(files, schema, rank, world)
    valid_arrays = load_arrays(valid_files, schema, rank, world, every_row=True) if args.valid else None
    load_s = time.perf_counter() - t_load
    keys = [f["name"] for f in schema["sparse"]]
    bs = args.batch_size
    n_batches = torch.tensor([dense_np.shape[0] // bs])
    dist.all_reduce(n_batches, op=dist.ReduceOp.MIN)  # every rank runs the same steps
    n_batches = int(n_batches.item())
    if n_batches < 1:
        raise SystemExit(f"peer_torchrec: a rank has fewer than {bs} rows")
    lengths = torch.ones(len(keys) * bs, dtype=torch.int32)

    def batch(i: int) -> Any:
        s = (i % n_batches) * bs
        values = torch.from_numpy(np.ascontiguousarray(ids_np[:, s:s + bs]).reshape(-1))  # key-major
        return Batch(dense_features=torch.from_numpy(dense_np[s:s + bs]),
                     sparse_features=KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths),
                     labels=torch.from_numpy(labels_np[s:s + bs]))

    # ---- model, plan, optimizers ---- #
    # ranks per host from torchrun: across nodes the planner then knows which ranks share a host (left out,
    # it takes every rank for one host)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    registry, qcomm_effective = qcomm_registry(args.qcomm, device)
    model, optimizer, plan = build_model(
        [(f["name"], int(f["num_embeddings"])) for f in schema["sparse"]], len(schema["dense"]),
        embedding_dim=args.embedding_dim, bottom_mlp=[int(x) for x in args.bottom_mlp.split(",")],
        top_mlp=[int(x) for x in args.top_mlp.split(",")], batch_size=bs, world_size=world,
        local_world_size=local_world, device=device, embedding_lr=args.lr, dense_lr=args.lr, train_wrapper=True,
        qcomm_codecs_registry=registry, topology=inter_host_bw(args.inter_host_mbit))
    pipeline = TrainPipelineSparseDist(model, optimizer, device)
    # exactly the steps run: the pipeline reads ahead, and stops with the source
    source = (batch(i) for i in range(args.warmup + args.steps))

    def step(i: int) -> float:
        # forward, backward (the fused embedding update), dense step; DLRMTrain's (loss, logits, labels), detached
        return float(pipeline.progress(source)[0])

    # ---- warm-up, then the timed window ---- #
    losses = [step(i) for i in range(args.warmup)]
    dist.barrier()
    prof = None
    if args.torch_profile and rank == 0:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.__enter__()
    step_s: List[float] = []
    t0 = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        s0 = time.perf_counter()
        losses.append(step(i))
        step_s.append(time.perf_counter() - s0)
    dist.barrier()
    elapsed = time.perf_counter() - t0
    if prof is not None:
        prof.__exit__(None, None, None)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), flush=True)

    # the slowest rank's window sets the pace
    el = torch.tensor([elapsed], dtype=torch.float64)
    dist.all_reduce(el, op=dist.ReduceOp.MAX)
    elapsed = float(el.item())
    global_batch = bs * world
    auc, valid_rows = None, 0
    if valid_arrays is not None:  # untimed, after warmup + steps steps: the step count a rayemb job reports at
        auc, valid_rows = valid_auc(pipeline.detach(), valid_arrays, keys, bs)
    if rank == 0:
        ms = np.asarray(step_s) * 1e3
        windows = window_rates(step_s, args.window, global_batch)
        sharding = sharding_of(plan)
        types = [v["sharding_type"] for v in sharding.values()]
        result = {
            "schema_version": SCHEMA_VERSION,
            "framework": "torchrec+torchrun",
            "world_size": world,
            "batch_size": bs,
            "global_batch": global_batch,
            "threads_per_rank": threads,
            "warmup_steps": args.warmup,
            "steps": args.steps,
            "elapsed_s": elapsed,
            "samples_per_s": args.steps * global_batch / elapsed,
            "samples_per_s_window_median": float(np.median(windows)) if windows else None,
            "samples_per_s_windows": windows,
            "window_steps": args.window,
            "step_ms": {"mean": float(ms.mean()), "p50": float(np.median(ms)), "p90": float(np.percentile(ms, 90)),
                        "min": float(ms.min()), "max": float(ms.max())},
            "load_s": load_s,
            "rows_per_rank": int(dense_np.shape[0]),
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "sharding": sharding,
            "sharding_counts": {t: types.count(t) for t in sorted(set(types))},
            "torch_version": torch.__version__,
            "qcomm": args.qcomm,
            "qcomm_effective": qcomm_effective,
            "inter_host_mbit": args.inter_host_mbit,
            "train_loop": "TrainPipelineSparseDist",
            "valid_auc": auc,
            "valid_rows": valid_rows,
            "valid_after_steps": args.warmup + args.steps,
        }
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
        counts = ", ".join(f"{t} x{c}" for t, c in result["sharding_counts"].items())
        print(f"peer_torchrec: {result['samples_per_s']:,.0f} samples/s (window median "
              f"{result['samples_per_s_window_median'] or float('nan'):,.0f}), step {ms.mean():.1f} ms mean / "
              f"{np.median(ms):.1f} ms p50, world {world} x batch {bs}, {threads} thread(s)/rank; sharding: {counts}; "
              f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; qcomm {args.qcomm}"
              + (f"; valid_auc {auc:.4f} over {valid_rows:,} rows" if auc is not None else ""), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
