"""Measures the step-time model's constants on the live cluster, before planning (a few seconds).

One Ray actor per rank, placed like the Train workers (same CPU share,
PACK), joins a process group on the job's backend (gloo or nccl) and
measures, all ranks at once (as in training, so they contend for the same
cores):

* each collective family's latency α and seconds per byte β: all-reduce and
  all-to-all of a small and a large message across the job's ranks (on a
  multi-node cluster that is the inter-node path);
* how far the two families overlap when they run at once, as DDP's gradient
  all-reduce and the sharded modules' all-to-alls do in a backward: each
  alone and both together, at the job's sizes (:func:`add_overlap`);
* compute: FBGEMM's fused table-batched embedding (row-wise Adagrad) and its
  dense variant (the kernels TorchRec runs) per id and per replicated element,
  local pooling of cold rows per id, a sharded module's fixed cost, and the
  dense arch's forward + backward + optimizer on the local batch.

The result is a :class:`~rayemb.planner.step_time.Calibration` (the ranks'
compute figures averaged), recorded in plan.json and MLflow.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from rayemb.planner.step_time import Calibration, LinkCost, normalize_probes
from rayemb.train.calibration.probes import PROBE_DP_ROWS, PROBE_HOT_ROWS, PROBE_HOT_SHARE, PROBE_ROWS, Interleaved
from rayemb.train.worker.gpu_timing import GPU_MAX_ELEMS, GPU_MAX_IDS, gpu_timed, grown_slope

logger = logging.getLogger(__name__)

#: message sizes (bytes per rank) of the collective probes
SMALL_MESSAGE_BYTES = 4 * 1024
LARGE_MESSAGE_BYTES = 4 * 2**20
#: on gloo: 1 MiB already costs many times the small message on loopback and is slow on a slow link (each of
#: the calibration's rounds runs every size once, so the large ones set its length on slow links)
CPU_LARGE_MESSAGE_BYTES = 2**20
COLLECTIVES = ("all_reduce", "all_to_all")
#: rounds of the collectives when measured alone (measure_collectives' retry)
REPEATS = 7
#: tries of a collective's two-size probe when the large message did not time slower than the small one
COLLECTIVE_ATTEMPTS = 3
#: each retry's large message this many times the last one's
COLLECTIVE_GROWTH = 4
#: bytes one rank sends in the link fingerprint's all-to-all: well above a shaped link's burst (tc's bucket holds
#: about one timer tick of data, 50 KB at 100 Mbit/s), so that the link's rate sets the time, not its bucket
FINGERPRINT_BYTES = 2**20
#: timed all-to-alls of the link fingerprint, its best kept (a busy host only ever slows one down)
FINGERPRINT_ROUNDS = 5
#: 100 Mbit/s Ethernet's payload rate in MB/s (84 ns/B, the all-to-all's β measured on the emulated 100 Mbit/s
#: link, docs/planner.md): the centre of link band 0
LINK_BAND_ANCHOR_MB_S = 11.9


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


def _collective_steps(device: Any, world: int, growth: int = 1) -> Dict[str, Tuple[float, Callable[[], None]]]:
    """``family/small`` and ``family/large`` -> (bytes one rank sends, one call) for all-reduce and all-to-all."""
    import torch
    import torch.distributed as dist

    q = (world - 1) / world
    large = (LARGE_MESSAGE_BYTES if device.type == "cuda" else CPU_LARGE_MESSAGE_BYTES) * growth
    out: Dict[str, Tuple[float, Callable[[], None]]] = {}
    for name in COLLECTIVES:
        for label, size in (("small", SMALL_MESSAGE_BYTES), ("large", large)):
            n = size // 4 // world * world
            x = torch.ones(n, dtype=torch.float32, device=device)
            y = torch.empty_like(x)
            fn = (lambda x=x: dist.all_reduce(x)) if name == "all_reduce" else (lambda x=x, y=y: dist.all_to_all_single(y, x))
            out[f"{name}/{label}"] = ((2.0 * q if name == "all_reduce" else q) * n * 4, fn)
    return out


def add_collectives(iv: Interleaved, device: Any, world: int, growth: int = 1) -> Callable[[], Dict[str, LinkCost]]:
    """Adds a small and a large all-reduce and all-to-all to ``iv``; returns what reads each family's α-β once
    it has run: β from the median difference large - small within a round, α from the small message
    (``growth``: the large message that many times its size)."""
    steps = _collective_steps(device, world, growth)
    for name, (_, fn) in steps.items():
        iv.add(name, fn)

    def read() -> Dict[str, LinkCost]:
        out = {}
        for name in COLLECTIVES:
            x0, x1 = steps[f"{name}/small"][0], steps[f"{name}/large"][0]
            t0 = iv.median(f"{name}/small")
            out[name] = _line(x0, t0, x1, t0 + iv.difference(f"{name}/large", f"{name}/small"))
        return out

    return read


def overlap_sizes(local_batch: int, num_sparse: int, dim: int, dense_param_bytes: float) -> Tuple[int, int]:
    """Bytes one rank puts into the overlap probe's (all-reduce, all-to-all): the dense arch's gradients (DDP's
    all-reduce), and the local batch's pooled embeddings (one sharded exchange); at least SMALL_MESSAGE_BYTES."""
    return (max(int(dense_param_bytes), SMALL_MESSAGE_BYTES),
            max(4 * local_batch * max(num_sparse, 1) * dim, SMALL_MESSAGE_BYTES))


def add_overlap(iv: Interleaved, device: Any, world: int, all_reduce_bytes: int,
                all_to_all_bytes: int) -> Callable[[], float]:
    """Adds an all-reduce of ``all_reduce_bytes`` and an all-to-all of ``all_to_all_bytes``, each alone and both
    at once (both started, then both waited for, as DDP's reducer and the sharded modules issue theirs in a
    backward), to ``iv``; returns what reads the overlap fraction once it has run: per round,
    ``(alone_all_reduce + alone_all_to_all - together) / min(alone_all_reduce, alone_all_to_all)``, the share of
    the shorter one hidden by running them together, its median over rounds clamped to [0, 1]."""
    import torch
    import torch.distributed as dist

    def tensors(nbytes: int) -> Tuple[Any, Any]:
        x = torch.ones(max(nbytes // 4 // world, 1) * world, dtype=torch.float32, device=device)
        return x, torch.empty_like(x)

    (g, _), (x, y) = tensors(all_reduce_bytes), tensors(all_to_all_bytes)

    def together() -> None:
        works = [dist.all_reduce(g, async_op=True), dist.all_to_all_single(y, x, async_op=True)]
        for w in works:
            w.wait()

    iv.add("overlap/all_reduce", lambda: dist.all_reduce(g))
    iv.add("overlap/all_to_all", lambda: dist.all_to_all_single(y, x))
    iv.add("overlap/together", together)

    def read() -> float:
        t = [iv.times[f"overlap/{n}"] for n in ("all_reduce", "all_to_all", "together")]
        shares = [(ar + a2a - both) / max(min(ar, a2a), 1e-12) for ar, a2a, both in zip(*t)]
        return min(max(statistics.median(shares), 0.0), 1.0)

    return read


def _all_ranks(ok: bool, device: Any) -> bool:
    """Whether ``ok`` holds on every rank (a collective: every rank calls it)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([float(ok)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item() > 0)


def measure_collectives(device: Any, world: int, links: Optional[Dict[str, LinkCost]] = None) -> Dict[str, LinkCost]:
    """α-β of all-reduce and all-to-all on the default process group (bytes: sent by one rank).

    ``links``: already measured (in the calibration's interleaved set), kept when every rank found bytes
    costing time. When any rank saw a large message time no slower than the small one (β clamped to 0: bytes
    free; a stall during the small one's calls does it, or a link so fast that 1 MiB is lost in the noise, as
    gloo on loopback under load), every rank measures again, the collectives alone, so that all run the same
    collectives, each time with a large message COLLECTIVE_GROWTH x larger than the last: up to
    COLLECTIVE_ATTEMPTS measurements in all, the last one kept.
    """
    import torch
    import torch.distributed as dist

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for attempt in range(1, COLLECTIVE_ATTEMPTS + 1):
        if links is None:
            iv = Interleaved(sync, dist.barrier)
            read = add_collectives(iv, device, world, growth=COLLECTIVE_GROWTH ** (attempt - 1))
            iv.run(rounds=REPEATS, warmup=1)
            links = read()
        if _all_ranks(all(c.seconds_per_byte > 0 for c in links.values()), device):
            break
        logger.warning("calibration: a large message timed no slower than a small one on some rank (here: %s); %s "
                       "(%d/%d)", ", ".join(f"{k} {1e9 * c.seconds_per_byte:.1f} ns/B" for k, c in links.items()),
                       "measuring again" if attempt < COLLECTIVE_ATTEMPTS else "keeping it", attempt,
                       COLLECTIVE_ATTEMPTS)
        if attempt < COLLECTIVE_ATTEMPTS:
            links = None
    return links  # type: ignore[return-value]


def measure_compute(device: Any, local_batch: int, num_dense: int, num_sparse: int, dim: int,
                    bottom_mlp: Sequence[int], top_mlp: Sequence[int], model: Any = None,
                    schema: Any = None, precision: str = "fp32", dense_optimizer: str = "adagrad",
                    weight_decay: float = 0.0) -> Dict[str, float]:
    """Per-id, per-element and fixed compute costs on this rank's CPU share (or GPU).

    On a CPU the probes have fixed sizes (the defaults and recorded figures come from them); on CUDA they
    grow until the kernels' work dominates the launch (:func:`~rayemb.train.worker.gpu_timing.grown_slope`)."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType as OptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )
    from torchrec.optim import RowWiseAdagrad

    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    kernels = lambda fn: gpu_timed(fn, device, REPEATS)  # noqa: E731 - the grown probes' timer
    gen = torch.Generator(device="cpu").manual_seed(0)
    # on a GPU a table larger than its L2 cache, as real ones are; the probe sizes grow too (gpu_timing.grown_slope)
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
        lookup_s = grown_slope(fused_step, n0, max_ids, kernels, "fused lookup ids")
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
        replicated_elem_s = grown_slope(lambda v: dense_step(v, n0), v0, GPU_MAX_ELEMS // dim, kernels,
                                         "replicated rows") / dim
        dense_lookup_s = grown_slope(lambda n: dense_step(v0, n), n0, max_ids, kernels, "replicated lookup ids")
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
        pool_s = grown_slope(pool_step, n0, max_ids, kernels, "pooled ids")
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

    from rayemb.train.calibration.dense import dense_model_step

    model_step, dense_param_bytes = dense_model_step(device, local_batch, num_dense, num_sparse, dim, bottom_mlp,
                                                     top_mlp, model, schema, precision, dense_optimizer,
                                                     weight_decay)
    dense_step_s = _timed(model_step, sync)
    return {"lookup_s": lookup_s, "dense_lookup_s": dense_lookup_s, "replicated_elem_s": replicated_elem_s,
            "pool_s": pool_s, "group_overhead_s": group_overhead_s, "dense_step_s": dense_step_s,
            "dense_param_bytes": float(dense_param_bytes)}


def _on_rank(fn: Callable[..., Any], rank: int, world: int, master: str, backend: str, threads: int,
             args: Sequence[Any]) -> Any:
    """``fn(device, world, *args)`` in a process group of ``world`` ranks on ``backend`` (a rank actor's body)."""
    import datetime

    import torch
    import torch.distributed as dist

    from rayemb.train.worker.backend import pin_socket_interface

    pin_socket_interface()
    torch.set_num_threads(max(1, threads))
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://{master}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        return fn(device, world, *args)
    finally:
        dist.destroy_process_group()


def cpu_model() -> str:
    """This host's CPU model (``/proc/cpuinfo``'s ``model name``; elsewhere the platform's processor name)."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bandwidth_band(mb_s: float) -> int:
    """The band of a host-to-host bandwidth in MB/s: bands a factor of sqrt(10) wide, centred on Ethernet's
    payload rates (100 Mbit/s: :data:`LINK_BAND_ANCHOR_MB_S`, band 0; 1 Gbit/s band 2; 10 Gbit/s band 4).

    Coarse on purpose: a kept calibration is keyed by it, so the same link measured again (its best of a few
    transfers moves by tens of percent) lands in the same band, while a link 4x faster or slower never does. A
    reading near a band's edge that crosses it costs a calibration, never the reuse of another link's."""
    return int(round(2.0 * math.log10(max(mb_s, 1e-6) / LINK_BAND_ANCHOR_MB_S)))


def _host() -> str:
    """This rank's node: its Ray node in a Ray worker (emulated nodes share a host name, not a network), else the
    host's name."""
    import socket

    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside Ray: the host's name
        pass
    return socket.gethostname()


def fingerprint_rank(device: Any, world: int) -> Dict[str, Any]:
    """The link and the CPUs the job's ranks run on (a collective): ``{"hosts": n, "all_to_all_mb_s": ...,
    "cpus": [model, ...]}``.

    The bandwidth is a host's, whatever its ranks: one rank per host (its first) runs a FINGERPRINT_BYTES
    all-to-all with the others' (best of FINGERPRINT_ROUNDS, the slowest host's best). Ranks on one host share
    no network (their loopback's speed is the host's, which drifts 2x under load): there it is not measured
    (None). ``cpus``: the distinct CPU models of the ranks' hosts, sorted."""
    import torch
    import torch.distributed as dist

    mine: List[Any] = [None] * world
    dist.all_gather_object(mine, (_host(), cpu_model()))
    hosts = sorted({host for host, _ in mine})
    out = {"hosts": len(hosts), "all_to_all_mb_s": None, "cpus": sorted({cpu for _, cpu in mine})}
    if len(hosts) == 1:
        return out
    leaders = [next(r for r, (h, _) in enumerate(mine) if h == host) for host in hosts]
    group = dist.new_group(sorted(leaders))  # every rank creates it; the leaders use it
    best, n = 0.0, max(FINGERPRINT_BYTES // 4 // len(hosts), 1) * len(hosts)
    if dist.get_rank() in leaders:
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        x = torch.ones(n, dtype=torch.float32, device=device)
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x, group=group)  # warm-up: the connections are set up on first use
        sync()
        best = math.inf
        for _ in range(FINGERPRINT_ROUNDS):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            dist.all_to_all_single(y, x, group=group)
            sync()
            best = min(best, time.perf_counter() - t0)
    slowest = torch.tensor([best], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    dist.destroy_process_group(group)
    sent = (len(hosts) - 1) / len(hosts) * n * 4  # what one host sends, and receives, in one call
    out["all_to_all_mb_s"] = sent / max(float(slowest.item()), 1e-9) / 1e6
    return out


#: a kept calibration's link when every rank runs on one host
ONE_HOST = "one host"


def hardware_key(fingerprint: Mapping[str, Any]) -> Dict[str, Any]:
    """What a kept calibration's key holds of :func:`fingerprint_rank`'s figures: the link's band (not its
    bandwidth) or :data:`ONE_HOST`, and the CPU models."""
    mb_s = fingerprint.get("all_to_all_mb_s")
    return {"link": ONE_HOST if mb_s is None else f"all-to-all band {bandwidth_band(float(mb_s))}",
            "cpus": list(fingerprint["cpus"])}


def link_fingerprint(world: int, cpus_per_worker: float, use_gpu: bool, strategy: str = "PACK",
                     timeout_s: float = 60.0) -> Dict[str, Any]:
    """:func:`hardware_key` of :func:`fingerprint_rank` on ``world`` ranks placed like the Train workers (the
    ranks' start, and across hosts a few 1 MiB all-to-alls: 3 s on a busy 2-core host, most of it the ranks'
    start)."""
    return hardware_key(run_on_ranks(fingerprint_rank, (), world, cpus_per_worker, use_gpu, timeout_s, strategy)[0])


def link_rank(device: Any, world: int) -> Dict[str, Any]:
    """The ranks' :func:`fingerprint_rank` and the collectives' α-β (:func:`measure_collectives`), nothing else
    (the link measurement's actors' work)."""
    return {"fingerprint": fingerprint_rank(device, world), "links": measure_collectives(device, world)}


def measure_link(world: int, cpus_per_worker: float, use_gpu: bool, num_nodes: int, timeout_s: float = 120.0,
                 strategy: str = "PACK") -> Tuple[Calibration, Dict[str, Any]]:
    """(a :class:`Calibration` of the links measured on ``world`` ranks placed like the Train workers and the
    built-in compute figures, source ``link-measured``; the ranks' :func:`hardware_key`).

    For a job with nothing to choose (every table pinned): its prediction then prices the bytes its plan moves at
    the live link's rate, without the compute probes' seconds (the ranks' start, then a few all-reduces and
    all-to-alls, 7 rounds of a 4 KiB and a 1 MiB message each)."""
    from dataclasses import replace

    from rayemb.planner.step_time import DEFAULT_CALIBRATION, LINK_MEASURED

    t0 = time.monotonic()
    first = run_on_ranks(link_rank, (), world, cpus_per_worker, use_gpu, timeout_s, strategy)[0]
    links = first["links"]
    cal = replace(DEFAULT_CALIBRATION, all_reduce=links["all_reduce"], all_to_all=links["all_to_all"],
                  backend="nccl" if use_gpu else "gloo", source=LINK_MEASURED, world_size=world,
                  num_nodes=num_nodes, seconds=time.monotonic() - t0)
    return cal, hardware_key(first["fingerprint"])


def calibrate_rank(device: Any, world: int, shape: Dict[str, Any]) -> Dict[str, Any]:
    """One rank's measurements, every rank's compute figures gathered, and the ranks' :func:`fingerprint_rank`
    (measured first, on idle ranks, as :func:`link_fingerprint` measures it) (the calibration actors' work)."""
    import torch.distributed as dist

    fingerprint = fingerprint_rank(device, world) if world > 1 else None
    measured = measure_rank(device, world, shape)
    parts: List[Any] = [None] * world
    dist.all_gather_object(parts, measured["compute"])
    return {"links": measured["links"], "compute": parts, "fingerprint": fingerprint}


def measure_rank(device: Any, world: int, shape: Dict[str, Any]) -> Dict[str, Any]:
    """This rank's figures, in the default process group: ``{"links": family -> LinkCost, "compute": {...}}``.

    The kernels and the dense arch's step first (:func:`measure_compute`, local, each alone: timed inside the
    interleaved set below, the dense step reads slower than the job's own; alone it matches the job). Across ranks, then, one :class:`Interleaved` set of the collectives and the sharded
    probes (:func:`rayemb.train.calibration.probes.add_probes`), so that the probes, and the bytes their figures
    are netted of, are measured under the same conditions.
    """
    import torch
    import torch.distributed as dist

    shape = dict(shape)
    prefetch = bool(shape.pop("prefetch_input_dist", False))  # the probes step as the job's loop will
    compute: Dict[str, Any] = measure_compute(device, **shape)
    if world == 1:
        return {"links": {}, "compute": compute}
    from rayemb.train.calibration.probes import add_probes

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    iv = Interleaved(sync, dist.barrier)
    read_links = add_collectives(iv, device, world)
    read_overlap = add_overlap(iv, device, world, *overlap_sizes(shape["local_batch"], int(shape.get("num_sparse", 8)),
                                                                 shape["dim"], compute["dense_param_bytes"]))
    read_probes = add_probes(iv, shape["local_batch"], shape["dim"], device, int(shape.get("num_sparse", 8)),
                             prefetch=prefetch)
    iv.run()
    links = measure_collectives(device, world, read_links())
    compute.update(read_probes())  # replicated_elem_s now includes the gradient's all-reduce on the live links
    compute["overlap_fraction"] = read_overlap()
    return {"links": links, "compute": compute}


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
        # the ranks' mean (each timed the same calls): measured only across ranks
        overlap_fraction=mean.get("overlap_fraction"),
    )


def job_shape(cfg: Any, schema: Any, model: Any = None) -> Dict[str, Any]:
    """The shape calibration measures: the job's local batch, dense and sparse features, dim, MLPs, prefetch,
    precision, and the job's model (``model``, a ModelSpec) whose dense part is timed; with sequence features the
    dense step is a DLRM's (the stand-in vectors have no histories to feed a sequence module)."""
    own = model is not None and cfg.model.sequence_tower == "none"
    return dict(local_batch=cfg.data.batch_size, num_dense=len(schema.dense), dim=cfg.model.embedding_dim,
                num_sparse=len(schema.sparse), bottom_mlp=list(cfg.model.bottom_mlp), top_mlp=list(cfg.model.top_mlp),
                prefetch_input_dist=cfg.train.prefetch_input_dist, precision=cfg.train.precision,
                model=model if own else None,
                schema=schema if own else None,
                # the defaults left out: calibrations kept before the job's optimizer was measured still match
                **({"dense_optimizer": cfg.train.dense_optimizer} if cfg.train.dense_optimizer != "adagrad" else {}),
                **({"weight_decay": cfg.train.weight_decay} if cfg.train.weight_decay else {}))


def run_on_ranks(fn: Callable[..., Any], args: Sequence[Any], world: int, cpus_per_worker: float, use_gpu: bool,
                 timeout_s: float = 180.0, strategy: str = "PACK") -> List[Any]:
    """``fn(device, world, *args)`` on ``world`` Ray actors placed like the Train workers (same CPU share, GPU,
    placement strategy), joined in one process group on the job's backend; every rank's return value.

    ``fn`` must be importable on the workers (a module-level function). The actors and their placement
    group are removed before this returns, also on failure or timeout.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    backend = "nccl" if use_gpu else "gloo"
    bundle = {"CPU": cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
    pg = placement_group([dict(bundle) for _ in range(world)], strategy=strategy)
    actors: List[Any] = []
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

            def run(self, *a: Any) -> Any:
                from rayemb.logs import quiet_third_party_logs

                quiet_third_party_logs()
                return _on_rank(*a)

        actors = [_Rank.options(num_cpus=cpus_per_worker, num_gpus=1 if use_gpu else 0,
                                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i))
                  .remote() for i in range(world)]
        master = ray.get(actors[0].address.remote(), timeout=timeout_s)
        threads = max(1, int(round(cpus_per_worker)))
        return ray.get([a.run.remote(fn, i, world, master, backend, threads, tuple(args))
                        for i, a in enumerate(actors)], timeout=timeout_s)
    finally:
        for a in actors:
            ray.kill(a)
        remove_placement_group(pg)


def calibrate_cluster(world: int, cpus_per_worker: float, use_gpu: bool, num_nodes: int, shape: Dict[str, Any],
                      timeout_s: float = 180.0, strategy: str = "PACK") -> Calibration:
    """Runs :func:`calibrate_rank` on ``world`` ranks placed like the Train workers; returns the calibration."""
    return calibrate_and_fingerprint(world, cpus_per_worker, use_gpu, num_nodes, shape, timeout_s, strategy)[0]


def calibrate_and_fingerprint(world: int, cpus_per_worker: float, use_gpu: bool, num_nodes: int,
                              shape: Dict[str, Any], timeout_s: float = 180.0, strategy: str = "PACK"
                              ) -> Tuple[Calibration, Optional[Dict[str, Any]]]:
    """(:func:`calibrate_cluster`'s calibration, the ranks' :func:`hardware_key` measured by the same ranks;
    None on one rank)."""
    t0 = time.monotonic()
    results = run_on_ranks(calibrate_rank, (shape,), world, cpus_per_worker, use_gpu, timeout_s, strategy)
    cal = combine(results, "nccl" if use_gpu else "gloo", num_nodes, time.monotonic() - t0, shape)
    fingerprint = results[0].get("fingerprint")
    return cal, None if fingerprint is None else hardware_key(fingerprint)


__all__ = ["calibrate_cluster", "calibrate_and_fingerprint", "calibrate_rank", "link_fingerprint", "fingerprint_rank",
           "link_rank", "measure_link", "hardware_key", "bandwidth_band", "cpu_model", "ONE_HOST", "combine",
           "add_overlap", "overlap_sizes", "measure_collectives", "measure_compute", "measure_rank", "run_on_ranks",
           "job_shape"]
