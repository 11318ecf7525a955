"""Measures the step-time model's constants on the live cluster, before planning (a few seconds).

One Ray actor per rank, placed like the Train workers (same CPU share,
PACK), joins a process group on the job's backend (gloo or nccl) and
measures, all ranks at once (as in training, so they contend for the same
cores):

* each collective family's latency α and seconds per byte β: all-reduce and
  all-to-all of a small and a large message across the job's ranks (on a
  multi-node cluster that is the inter-node path);
* compute: FBGEMM's fused table-batched embedding (row-wise Adagrad) and its
  dense variant (the kernels TorchRec runs) per id and per replicated element,
  local pooling of cold rows per id, a sharded module's fixed cost, and the
  dense arch's forward + backward + optimizer on the local batch.

The result is a :class:`~rayemb.planner.step_time.Calibration` (the ranks'
compute figures averaged), recorded in plan.json and MLflow.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rayemb.planner.step_time import Calibration, LinkCost, normalize_probes
from rayemb.train.calibrate_probes import PROBE_DP_ROWS, PROBE_HOT_ROWS, PROBE_HOT_SHARE, PROBE_ROWS

logger = logging.getLogger(__name__)

#: message sizes (bytes per rank) of the collective probes
SMALL_MESSAGE_BYTES = 4 * 1024
LARGE_MESSAGE_BYTES = 4 * 2**20
REPEATS = 7
#: tries of a collective's two-size probe when the large message did not time slower than the small one
COLLECTIVE_ATTEMPTS = 3
#: CUDA compute probes. The CPU sizes (256 vs 8192 ids, 1k vs 50k replicated rows) all run in launch-bound
#: time on a GPU, so their slopes are 0 or noise there. On CUDA each probe grows by GPU_GROWTH from the CPU's
#: small size until it takes GPU_TIME_RATIO x the small size's time (the kernel's work dominates the launch),
#: capped so that no probe tensor exceeds GPU_MAX_ELEMS floats (256 MiB; about 1 GiB peak for all of them).
GPU_MAX_IDS = 2**20
GPU_MAX_ELEMS = 2**26
GPU_GROWTH = 4
GPU_TIME_RATIO = 2.0


def _timed(fn: Callable[[], Any], sync: Callable[[], None], repeats: int = REPEATS,
           barrier: Callable[[], None] = lambda: None) -> float:
    """Median seconds of ``fn`` after one warm-up call (``barrier`` before each call: collectives timed with
    the ranks lined up, not with one rank's lag)."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _line(x0: float, t0: float, x1: float, t1: float) -> LinkCost:
    """α-β through two points (x bytes, t seconds), clamped at zero."""
    beta = max((t1 - t0) / max(x1 - x0, 1.0), 0.0)
    return LinkCost(latency_s=max(t0 - beta * x0, 0.0), seconds_per_byte=beta)


def _grown_slope(step_at: Callable[[int], Callable[[], None]], x0: int, x_max: int, sync: Callable[[], None],
                 what: str) -> float:
    """Seconds per unit of x (ids, rows) on a GPU: times ``step_at(x0)``, then x0 x4, x16, ... until a step
    takes GPU_TIME_RATIO x the first one's time or x reaches ``x_max``; the slope through those two points,
    clamped at zero. Growing until the time doubles keeps the difference above launch jitter on any GPU
    without probing more than needed."""
    t0 = _timed(step_at(x0), sync)
    x, t = x0, t0
    while x < x_max and t < GPU_TIME_RATIO * t0:
        x = min(x * GPU_GROWTH, x_max)
        t = _timed(step_at(x), sync)
    logger.info("CUDA compute probe %s: %d -> %d, %.3f -> %.3f ms", what, x0, x, t0 * 1e3, t * 1e3)
    return max((t - t0) / max(x - x0, 1), 0.0)


def measure_collectives(device: Any, world: int) -> Dict[str, LinkCost]:
    """α-β of all-reduce and all-to-all on the default process group (bytes: sent by one rank)."""
    import torch
    import torch.distributed as dist

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    q = (world - 1) / world

    def points(name: str) -> List[Tuple[float, float]]:
        """(bytes sent per rank, median seconds) of ``name`` at the small and the large message."""
        pts = []
        for size in (SMALL_MESSAGE_BYTES, LARGE_MESSAGE_BYTES):
            n = size // 4 // world * world
            x = torch.ones(n, dtype=torch.float32, device=device)
            y = torch.empty_like(x)
            fn = (lambda x=x: dist.all_reduce(x)) if name == "all_reduce" else (lambda x=x, y=y: dist.all_to_all_single(y, x))
            sent = (2.0 * q if name == "all_reduce" else q) * n * 4
            pts.append((sent, _timed(fn, sync, barrier=dist.barrier)))
        return pts

    out = {}
    for name in ("all_reduce", "all_to_all"):
        for attempt in range(1, COLLECTIVE_ATTEMPTS + 1):
            (x0, t0), (x1, t1) = points(name)
            # a stall during the small message's repeats can make it the slower one (beta clamped to 0, bytes
            # free); every rank measures again when any rank saw that, so all run the same collectives
            sane = torch.tensor([float(t1 > t0)], device=device)
            dist.all_reduce(sane, op=dist.ReduceOp.MIN)
            if sane.item() > 0:
                break
            logger.warning("calibration: %s of %d bytes timed no slower than %d bytes on some rank (here %.2f vs "
                           "%.2f ms); %s (%d/%d)", name, LARGE_MESSAGE_BYTES, SMALL_MESSAGE_BYTES, t1 * 1e3, t0 * 1e3,
                           "measuring again" if attempt < COLLECTIVE_ATTEMPTS else "keeping it", attempt,
                           COLLECTIVE_ATTEMPTS)
        out[name] = _line(x0, t0, x1, t1)
    return out


def measure_compute(device: Any, local_batch: int, num_dense: int, num_sparse: int, dim: int,
                    bottom_mlp: Sequence[int], top_mlp: Sequence[int]) -> Dict[str, float]:
    """Per-id, per-element and fixed compute costs on this rank's CPU share (or GPU).

    On a CPU the probes have fixed sizes (the defaults and recorded figures come from them); on CUDA they
    grow until the kernels' work dominates the launch (:func:`_grown_slope`)."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType as OptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )
    from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch
    from torchrec.optim import RowWiseAdagrad

    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    gen = torch.Generator(device="cpu").manual_seed(0)
    # on a GPU a table larger than its L2 cache, as real ones are; the probe sizes grow too (_grown_slope)
    max_ids = min(GPU_MAX_IDS, GPU_MAX_ELEMS // dim)
    rows = max_ids if cuda else 20_000

    def ids(n: int, v: int = rows):
        idx = torch.randint(0, v, (n,), generator=gen).to(device)
        return idx, torch.arange(0, n + 1, dtype=torch.int64, device=device)  # one id per bag

    fused = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST,
          ComputeDevice.CUDA if cuda else ComputeDevice.CPU)],
        optimizer=OptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01, device=device)

    def fused_step(n: int) -> Callable[[], None]:
        idx, off = ids(n)
        return lambda: fused(idx, off).sum().backward()

    n0, n1 = 256, 8192
    if cuda:
        lookup_s = _grown_slope(fused_step, n0, max_ids, sync, "fused lookup ids")
    else:
        t_f0, t_f1 = _timed(fused_step(n0), sync), _timed(fused_step(n1), sync)
        lookup_s = max((t_f1 - t_f0) / (n1 - n0), 0.0)

    def dense_step(v: int, n: int) -> Callable[[], None]:
        # a replicated table: dense [V, D] gradient, row-wise Adagrad over all of it (as the DP path)
        weight = torch.nn.Parameter(torch.randn(v, dim, device=device) * 0.01)
        opt = RowWiseAdagrad([weight], lr=0.01)
        idx, off = ids(n, v)

        def step() -> None:
            opt.zero_grad()
            torch.nn.functional.embedding_bag(idx, weight, off[:-1], mode="sum").sum().backward()
            opt.step()
        return step

    v0, v1 = 1_000, 50_000
    if cuda:
        replicated_elem_s = _grown_slope(lambda v: dense_step(v, n0), v0, GPU_MAX_ELEMS // dim, sync,
                                         "replicated rows") / dim
        dense_lookup_s = _grown_slope(lambda n: dense_step(v0, n), n0, max_ids, sync, "replicated lookup ids")
    else:
        t_d00, t_d10 = _timed(dense_step(v0, n0), sync), _timed(dense_step(v1, n0), sync)
        t_d01 = _timed(dense_step(v0, n1), sync)
        replicated_elem_s = max((t_d10 - t_d00) / ((v1 - v0) * dim), 0.0)
        dense_lookup_s = max((t_d01 - t_d00) / (n1 - n0), 0.0)

    def pool_step(n: int) -> Callable[[], None]:
        rows_ = torch.randn(n, dim, device=device, requires_grad=True)
        bags = torch.randint(0, max(local_batch, 1), (n,), generator=gen).to(device)

        def step() -> None:
            out = torch.zeros(max(local_batch, 1), dim, device=device).index_add(0, bags, rows_)
            out.sum().backward()
        return step

    if cuda:
        pool_s = _grown_slope(pool_step, n0, max_ids, sync, "pooled ids")
    else:
        t_p0, t_p1 = _timed(pool_step(n0), sync), _timed(pool_step(n1), sync)
        pool_s = max((t_p1 - t_p0) / (n1 - n0), 0.0)

    # a sharded module's fixed cost: KJT-style permutes/splits and a kernel call on a tiny input, both passes
    def group_step() -> None:
        idx, off = ids(8)
        perm = torch.argsort(idx)
        vals = idx[perm].split([4, 4])
        fused(torch.cat(vals), off).sum().backward()
    group_overhead_s = _timed(group_step, sync) * 3  # input dist, lookup, output dist

    dense_arch = DenseArch(num_dense, list(bottom_mlp), device=device)
    inter = InteractionArch(num_sparse_features=num_sparse)
    over = OverArch(bottom_mlp[-1] + (num_sparse + 1) * num_sparse // 2, list(top_mlp), device=device)
    params = list(dense_arch.parameters()) + list(over.parameters())
    opt = torch.optim.Adagrad(params, lr=0.01)
    x = torch.randn(local_batch, num_dense, device=device)
    emb = torch.randn(local_batch, num_sparse, dim, device=device, requires_grad=True)
    y = torch.rand(local_batch, device=device).round()
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def model_step() -> None:
        opt.zero_grad()
        loss_fn(over(inter(dense_arch(x), emb)).squeeze(-1), y).backward()
        opt.step()
    dense_step_s = _timed(model_step, sync)
    dense_param_bytes = sum(p.numel() * p.element_size() for p in params)
    return {"lookup_s": lookup_s, "dense_lookup_s": dense_lookup_s, "replicated_elem_s": replicated_elem_s,
            "pool_s": pool_s, "group_overhead_s": group_overhead_s, "dense_step_s": dense_step_s,
            "dense_param_bytes": float(dense_param_bytes)}


def calibrate_rank(rank: int, world: int, master: str, backend: str, threads: int, shape: Dict[str, Any]) -> Dict[str, Any]:
    """One rank's measurements (runs in a calibration actor)."""
    import datetime

    import torch
    import torch.distributed as dist

    from rayemb.train.backend import pin_socket_interface

    pin_socket_interface()
    torch.set_num_threads(max(1, threads))
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://{master}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    shape = dict(shape)
    prefetch = bool(shape.pop("prefetch_input_dist", False))  # the probes step as the job's loop will
    try:
        links = measure_collectives(device, world) if world > 1 else {}
        compute = measure_compute(device, **shape)
        if world > 1:
            from rayemb.train.calibrate_probes import probe_ddp, probe_groups, probe_replicated_elem

            compute["groups"] = probe_groups(shape["local_batch"], shape["dim"], device,
                                             int(shape.get("num_sparse", 8)), prefetch=prefetch)
            compute["ddp_step_s"] = probe_ddp(shape["local_batch"], shape["dim"], device)
            # replaces the kernel-only figure: includes the gradient's all-reduce on the live links
            compute["replicated_elem_s"] = probe_replicated_elem(shape["local_batch"], shape["dim"], device)
        parts: List[Any] = [None] * world
        dist.all_gather_object(parts, compute)
    finally:
        dist.destroy_process_group()
    return {"links": links, "compute": parts}


def combine(results: Sequence[Dict[str, Any]], backend: str, num_nodes: int, seconds: float,
            shape: Optional[Dict[str, Any]] = None) -> Calibration:
    """One :class:`Calibration` from every rank's measurements: rank 0's links, compute averaged over ranks."""
    shape = shape or {}
    first = results[0]
    compute = first["compute"]
    mean = {k: statistics.fmean(float(c[k]) for c in compute) for k in compute[0] if k != "groups"}
    raw_groups = {kind: (statistics.fmean(c["groups"][kind][0] for c in compute),
                         statistics.fmean(c["groups"][kind][1] for c in compute))
                  for kind in compute[0].get("groups", {})}
    world = len(compute)
    links = first["links"] or {"all_reduce": LinkCost(0.0, 0.0), "all_to_all": LinkCost(0.0, 0.0)}
    ar = links["all_reduce"]
    ddp = mean.get("ddp_step_s", 0.0)
    groups = normalize_probes(raw_groups, {"all_reduce": ar, "all_to_all": links["all_to_all"]},
                              mean["replicated_elem_s"], int(shape.get("local_batch", 1)), int(shape.get("dim", 1)),
                              world, PROBE_ROWS, PROBE_HOT_ROWS, PROBE_HOT_SHARE, PROBE_DP_ROWS,
                              ddp_s=ddp) if raw_groups else {}
    # the dense arch's gradient all-reduce (DDP, one bucket) belongs to every plan's fixed step cost; its round
    # trip is in ddp_step_s when that was measured, so then only its bytes are added here
    dense_sync_bytes = 2.0 * (world - 1) / world * mean["dense_param_bytes"] if world > 1 else 0.0
    dense_sync = ar.time(dense_sync_bytes, calls=0 if ddp > 0 else 1) if world > 1 else 0.0
    return Calibration(
        all_reduce=ar, all_to_all=links["all_to_all"], lookup_s=mean["lookup_s"],
        dense_lookup_s=mean["dense_lookup_s"], replicated_elem_s=mean["replicated_elem_s"], pool_s=mean["pool_s"],
        group_overhead_s=mean["group_overhead_s"], dense_step_s=mean["dense_step_s"] + dense_sync, groups=groups,
        probe_rows=PROBE_ROWS, probe_hot_rows=PROBE_HOT_ROWS, probe_hot_share=PROBE_HOT_SHARE,
        probe_dp_rows=PROBE_DP_ROWS,
        backend=backend, source="measured", world_size=world, num_nodes=num_nodes, seconds=seconds,
        dense_sync_bytes=dense_sync_bytes, ddp_step_s=ddp,
    )


def calibrate_cluster(world: int, cpus_per_worker: float, use_gpu: bool, num_nodes: int, shape: Dict[str, Any],
                      timeout_s: float = 180.0, strategy: str = "PACK") -> Calibration:
    """Runs :func:`calibrate_rank` in ``world`` actors placed like the Train workers; returns the calibration."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    t0 = time.monotonic()
    backend = "nccl" if use_gpu else "gloo"
    bundle = {"CPU": cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
    pg = placement_group([dict(bundle) for _ in range(world)], strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=timeout_s)

        @ray.remote
        class _Rank:
            def address(self) -> str:
                import socket

                import ray.util

                with socket.socket() as s:
                    s.bind(("", 0))
                    port = s.getsockname()[1]
                return f"{ray.util.get_node_ip_address()}:{port}"

            def run(self, *args: Any) -> Dict[str, Any]:
                from rayemb.logs import quiet_third_party_logs

                quiet_third_party_logs()
                return calibrate_rank(*args)

        actors = [_Rank.options(num_cpus=cpus_per_worker, num_gpus=1 if use_gpu else 0,
                                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i))
                  .remote() for i in range(world)]
        master = ray.get(actors[0].address.remote(), timeout=timeout_s)
        threads = max(1, int(round(cpus_per_worker)))
        results = ray.get([a.run.remote(i, world, master, backend, threads, shape) for i, a in enumerate(actors)],
                          timeout=timeout_s)
        for a in actors:
            ray.kill(a)
    finally:
        remove_placement_group(pg)
    return combine(results, backend, num_nodes, time.monotonic() - t0, shape)


__all__ = ["calibrate_cluster", "calibrate_rank", "combine", "measure_collectives", "measure_compute"]
