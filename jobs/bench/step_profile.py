"""Where a rayemb training step's time goes: the job's real model and plan, 2 gloo ranks, no Ray, data in memory.

Builds the plan of ``--config`` (with ``--set`` overrides) from a ``stats.json``
(a job's output, or ``rayemb stats``) exactly as a job does, then each rank
(``rayemb.multiprocess``) sets the job's step up with ``rayemb.train.worker.build.build_step``,
converts its share of the train split in memory, and times ``--steps`` steps
per phase (forward, backward, optimizer), with the collective byte counter
on and off, and the torch profiler's top operators on request. Use it to find
what to cut; throughput claims come from ``throughput.py``.

``--ab`` compares two sides (the counter, the prefetch, the whole exchange prefetched against its split sizes
only, one DDP against TorchRec's DDPs); with
``--interleave`` both sides live in the same ranks and take turns step by step, the fair comparison on a
host whose speed drifts.

Usage::

    python jobs/bench/step_profile.py --stats runs/jobs/<job>/stats.json --set planner.hybrid=false --steps 100
    python jobs/bench/step_profile.py --stats stats.json --ab one_ddp --interleave --rounds 3 --steps 150
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path[:0] = [_HERE, _REPO]

from _report import report  # noqa: E402


def _rank_batches(cfg: Any, schema: Any, remap: Any, rank: int, world: int, max_batches: int) -> List[Any]:
    import pyarrow.parquet as pq

    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import parquet_files
    from rayemb.config import resolve_path
    from rayemb.train.worker.step import StepBatch

    files = parquet_files(resolve_path(cfg.data.path), "train")
    table = pq.read_table(files)
    per_rank = table.num_rows // world
    mine = table.slice(rank * per_rank, per_rank)
    conv = BatchConverter(schema, cfg.data.id_policy, remap=remap)
    bs = cfg.data.batch_size
    batches = [conv(mine.slice(i * bs, bs)) for i in range(min(per_rank // bs, max_batches))]
    return [StepBatch((b.dense, b.sparse), b.labels, b.sparse) for b in batches]


class _Variant:
    """One model of a rank, built and stepped as the job does (its :class:`~rayemb.train.worker.step.TrainStep`), with
    its own timers (and counter, prefetch)."""

    def __init__(self, cfg: Any, schema: Any, job_plan: Any, counter: bool, prefetch: bool, one_ddp: bool,
                 exchange: Optional[str] = None) -> None:
        import torch

        import dataclasses

        from rayemb.embedding.comm import CommCounter
        from rayemb.train.worker.build import build_step
        from rayemb.train.worker.step import StepTimer

        torch.manual_seed(cfg.train.seed)
        cfg = cfg.replace(train=dataclasses.replace(cfg.train, prefetch_input_dist=prefetch))
        built = build_step(cfg, schema, job_plan, torch.device("cpu"), instrument=counter, one_ddp=one_ddp)
        self.model, self.optimizer, self.remapper = built.model, built.optimizer, built.remapper
        self.cc = CommCounter() if counter else None
        self.pre = built.prefetch
        if self.pre is not None and exchange is not None:
            self.pre.exchange = exchange
        self.phases: Dict[str, List[float]] = {"forward": [], "backward": [], "optimizer": [], "step": []}
        self.timer = StepTimer()
        self.train_step = built.train_step(counter=self.cc, timer=self.timer)

    def step(self, b: Any, following: Optional[Any], timed: bool) -> None:
        """One step of ``b``; the next batch's input exchange (``following``'s) runs during its backward."""
        self.timer.reset()
        self.train_step(b, following)
        if timed:
            totals = self.timer.totals
            for k in ("forward", "backward", "optimizer"):
                self.phases[k].append(totals[k])
            self.phases["step"].append(sum(totals.values()))

    def result(self) -> Dict[str, Any]:
        n = max(1, len(self.phases["step"]))
        comm = None if self.cc is None else {
            "bytes_per_step": {p: {c: v / n for c, v in d.items()} for p, d in self.cc.bytes_by_phase().items()},
            "calls_per_step": {c: k / n for c, k in self.cc.calls().items()}}
        return {"ms": {k: 1e3 * statistics.median(v) for k, v in self.phases.items()}, "steps": len(self.phases["step"]),
                "comm": comm, "prefetch_hits": None if self.pre is None else self.pre.hits}


def _profile_rank(rank: int, world_size: int, cfg: Any, schema: Any, job_plan: Any, steps: int, warmup: int,
                  threads: int, variants: Sequence[Dict[str, bool]], torch_profile: bool) -> List[Dict[str, Any]]:
    """Each of ``variants`` (``counter``, ``prefetch``, ``one_ddp`` flags) as a model of its own on this rank;
    with two or more they take turns step by step on the same batches (the order flipped every step), so a
    host whose speed drifts slows them alike."""
    import torch

    from rayemb.logs import quiet_third_party_logs

    quiet_third_party_logs()
    torch.set_num_threads(threads)
    runs = [_Variant(cfg, schema, job_plan, **v) for v in variants]
    batches = _rank_batches(cfg, schema, runs[0].remapper.remap, rank, world_size, steps + warmup)
    prof = None
    for i, b in enumerate(batches):  # _rank_batches made at most steps + warmup
        if i == warmup:
            for r in runs:
                if r.cc:
                    r.cc.reset()  # per-step comm figures from the timed steps only
            if torch_profile and rank == 0:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                prof = torch.profiler.profile(activities=activities)
                prof.__enter__()
        following = batches[i + 1] if i + 1 < len(batches) else None
        for r in (runs if i % 2 == 0 else runs[::-1]):
            r.step(b, following, timed=i >= warmup)
    out = [r.result() for r in runs]
    if prof is not None:
        prof.__exit__(None, None, None)
        out[0]["top_ops"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        out[0]["launches_per_step"] = launches_per_step(prof.events(), (len(batches) - warmup) * len(runs))
    return out


def launches_per_step(events: Sequence[Any], steps: int) -> Dict[str, float]:
    """Operators one step runs, from the profiler's events: ``aten_ops`` (every ATen operator call on the host,
    nested ones included: what a launch-bound step pays for), ``top_level_aten_ops`` (those not inside another)
    and ``device_kernels`` (kernels on the accelerator; 0 on a CPU)."""
    aten = [e for e in events if e.name.startswith("aten::")]
    top = [e for e in aten if not any(p.name.startswith("aten::") for p in _parents(e))]
    kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA") and not e.name.startswith(
        ("aten::", "cuda"))]
    names: Dict[str, int] = {}
    for e in top:
        names[e.name] = names.get(e.name, 0) + 1
    most = sorted(names.items(), key=lambda kv: (-kv[1], kv[0]))[:15]
    return {"aten_ops": len(aten) / steps, "top_level_aten_ops": len(top) / steps,
            "device_kernels": len(kernels) / steps,
            "top_level_by_name": {n: c / steps for n, c in most}}


def _parents(event: Any) -> List[Any]:
    out, p = [], getattr(event, "cpu_parent", None)
    while p is not None:
        out.append(p)
        p = getattr(p, "cpu_parent", None)
    return out


def _comm_summary(per_rank: List[Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
    """Collective family -> calls (rank 0) and bytes per phase summed over ranks, per step."""
    fams = sorted({c for r in per_rank for d in r["bytes_per_step"].values() for c in d})
    return {c: {"calls": per_rank[0]["calls_per_step"].get(c, 0.0),
                **{p: sum(r["bytes_per_step"][p].get(c, 0.0) for r in per_rank) for p in ("forward", "backward")}}
            for c in fams}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(_REPO, "jobs", "configs", "synth_small.yaml"))
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--stats", default=None, help="stats.json of the dataset (default: the newest under runs/)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--torch-profile", action="store_true", help="print rank 0's top operators")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternating rounds of --ab on/off (the table adds each row's median over rounds)")
    ap.add_argument("--ab", choices=("counter", "prefetch", "prefetch_full", "one_ddp"), default="counter",
                    help="what each round runs with and without: the collective byte counter (default), the "
                         "next batch's input exchange started before this backward (rayemb.embedding.prefetch; "
                         "counter off), the whole next exchange (split sizes, lengths, values) started there "
                         "against its split sizes only (prefetch_full; counter off), or one DDP for every "
                         "replicated parameter against TorchRec's DDP per data-parallel lookup "
                         "(rayemb.embedding.data_parallel; counter off)")
    ap.add_argument("--interleave", action="store_true",
                    help="run both sides of --ab in the same ranks, alternating step by step on the same batches "
                         "(each --rounds one spawn): this host's speed drifts by up to 2x within minutes, which "
                         "separate runs cannot tell from an effect")
    ap.add_argument("--out", default=os.path.join(_REPO, "bench-results", "step_profile.json"))
    args = ap.parse_args(argv)

    from rayemb.config import load_config
    from rayemb.data.schema import load_checked
    from rayemb.config import resolve_path
    from rayemb.data.stats_io import load_stats_json
    from rayemb.multiprocess import run_multiprocess
    from rayemb.planner.topology import described_topology
    from rayemb.train.sharding import make_job_plan
    from rayemb.train.world_plan import plan_world

    cfg = load_config(args.config, args.overrides + [f"scaling.num_workers={args.world}"])
    schema = load_checked(resolve_path(cfg.data.path))
    stats_path = args.stats or max(glob.glob(os.path.join(_REPO, "runs", "**", "stats.json"), recursive=True),
                                   key=os.path.getmtime, default=None)
    if not stats_path:
        ap.error("no stats.json: pass --stats (a job's output dir has one, or run `rayemb stats`)")
    stats = load_stats_json(stats_path)
    topology = described_topology(world_size=args.world, gpus_per_node=args.world, compute_device="cpu", ddr_gib=8)
    world = plan_world(cfg, topology, stats)
    global_batch = world.batch.global_size
    job_plan = make_job_plan(cfg, schema, stats, world.split, topology)
    rows = []
    def flags(on: bool) -> Dict[str, bool]:
        full = args.ab == "prefetch_full"
        return {"counter": on and args.ab == "counter", "prefetch": full or on and args.ab == "prefetch",
                "one_ddp": on or args.ab != "one_ddp", "exchange": ("full" if on else "splits") if full else None}

    def add_row(on: bool, rnd: Any, res: List[Dict[str, Any]]) -> None:
        ms = {k: statistics.fmean(r["ms"][k] for r in res) for k in res[0]["ms"]}
        if on and args.ab in ("prefetch", "prefetch_full") and not res[0]["prefetch_hits"]:
            print("warning: no forward used a prefetched input exchange (nothing sharded to prefetch?)")
        rows.append({args.ab: on, "round": rnd, **{f"{k}_ms": v for k, v in ms.items()},
                     "samples_per_s": global_batch / (ms["step"] / 1e3)})
        if res[0].get("top_ops"):
            print(res[0]["top_ops"])
            nonlocal launches
            launches = res[0]["launches_per_step"]
            print("operators per step (rank 0): " + ", ".join(f"{k} {v:.1f}" for k, v in launches.items()
                                                               if not isinstance(v, dict)))
            print("  most frequent top-level: " + ", ".join(f"{k} {v:.1f}"
                                                          for k, v in launches["top_level_by_name"].items()))
        if on and args.ab == "counter":
            nonlocal comm
            comm = _comm_summary([r["comm"] for r in res])

    comm: Dict[str, Dict[str, float]] = {}
    launches: Dict[str, float] = {}
    common = dict(cfg=cfg, schema=schema, job_plan=job_plan, steps=args.steps, warmup=args.warmup,
                  threads=args.threads)
    if args.interleave:  # both sides on each rank, taking turns step by step: host drift hits them alike
        for r in range(args.rounds):
            res = run_multiprocess(_profile_rank, args.world, variants=[flags(True), flags(False)],
                                   torch_profile=False, **common)
            for j, on in enumerate((True, False)):
                add_row(on, r, [per_rank[j] for per_rank in res])
    else:
        # alternate the order each round so neither side always runs first on a warming host
        order = [c for r in range(args.rounds) for c in ((True, False) if r % 2 == 0 else (False, True))]
        for i, on in enumerate(order):
            res = run_multiprocess(_profile_rank, args.world, variants=[flags(on)],
                                   torch_profile=args.torch_profile and not on and i < 2, **common)
            add_row(on, i // 2, [per_rank[0] for per_rank in res])
    if args.rounds > 1:
        for on in (True, False):
            mine = [r for r in rows if r[args.ab] is on]
            rows.append({args.ab: on, "round": "median",
                         **{k: statistics.median(r[k] for r in mine) for k in mine[0] if k.endswith(("_ms", "_s"))}})
    if comm:
        print("collectives per step (bytes sent off-rank summed over ranks; calls on rank 0):")
    for fam, d in comm.items():
        print(f"  {fam:<15} calls {d['calls']:5.1f}   forward {d['forward']/1e3:9.1f} kB   "
              f"backward {d['backward']/1e3:9.1f} kB")
    placements = [t["placement"] for t in job_plan.summary["tables"].values()]
    plan = ", ".join(f"{p} x{placements.count(p)}" for p in sorted(set(placements)))
    doc = {"schema_version": 1, "benchmark": "step_profile", "plan": plan, "overrides": args.overrides, "ab": args.ab,
           "interleaved": args.interleave,
           "comm_per_step": comm, "launches_per_step": launches,
           "threads": args.threads, "world": args.world, "rows": rows,
           # the step-time model's figure for this plan (no plan probe runs here, so no probed_step_time_s)
           "predicted_step_time_s": job_plan.summary.get("predicted_step_time_s")}
    columns = [(args.ab, "<8", "{}"), ("round", ">6", "{}"), ("fwd ms", ">7", "{:.2f}"), ("bwd ms", ">7", "{:.2f}"),
               ("opt ms", ">7", "{:.2f}"), ("step ms", ">8", "{:.2f}"), ("samples/s", ">10", "{:,.0f}")]
    keys = [args.ab, "round", "forward_ms", "backward_ms", "optimizer_ms", "step_ms", "samples_per_s"]
    return report(args.out, doc, rows, columns, keys, footer=f"plan: {plan}")


if __name__ == "__main__":
    sys.exit(main())
