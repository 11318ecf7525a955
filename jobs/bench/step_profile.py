"""Where a rayemb training step's time goes: the job's real model and plan, 2 gloo ranks, no Ray, data in memory.

Builds the plan of ``--config`` (with ``--set`` overrides) from a ``stats.json``
(a job's output, or ``rayemb stats``) exactly as a job does, then each rank
(``rayemb.multiprocess``) shards the DLRM with ``rayemb.train.loop.sharded_model``,
converts its share of the train split in memory, and times ``--steps`` steps
per phase (forward, backward, optimizer), with the collective byte counter
on and off, and the torch profiler's top operators on request. Use it to find
what to cut; throughput claims come from ``throughput.py``.

Usage::

    python jobs/bench/step_profile.py --stats runs/jobs/<job>/stats.json --set planner.hybrid=false --steps 100
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time
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

    files = parquet_files(resolve_path(cfg.data.path), "train")
    table = pq.read_table(files)
    per_rank = table.num_rows // world
    mine = table.slice(rank * per_rank, per_rank)
    conv = BatchConverter(schema, cfg.data.id_policy, remap=remap)
    bs = cfg.data.batch_size
    return [conv(mine.slice(i * bs, bs)) for i in range(min(per_rank // bs, max_batches))]


def _profile_rank(rank: int, world_size: int, cfg: Any, schema: Any, job_plan: Any, steps: int, warmup: int,
                  threads: int, counter: bool, torch_profile: bool, prefetch: bool = False) -> Dict[str, Any]:
    import torch

    from rayemb.embedding.comm import CommCounter, instrument_ddp
    from rayemb.embedding.prefetch import StepPrefetch
    from rayemb.logs import quiet_third_party_logs
    from rayemb.train.loop import sharded_model

    quiet_third_party_logs()
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.train.seed)
    device = torch.device("cpu")
    model, optimizer, remapper = sharded_model(cfg, schema, job_plan, device)
    if counter:
        instrument_ddp(model)
    batches = _rank_batches(cfg, schema, remapper.remap, rank, world_size, steps + warmup)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    pre = StepPrefetch(model) if prefetch else None
    phases: Dict[str, List[float]] = {"forward": [], "backward": [], "optimizer": [], "step": []}
    cc = CommCounter() if counter else None
    prof = None
    for i, b in enumerate(batches):  # _rank_batches made at most steps + warmup
        if i == warmup and cc:
            cc.reset()  # per-step comm figures from the timed steps only
        if i == warmup and torch_profile and rank == 0:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        t0 = time.perf_counter()
        if cc:
            cc.__enter__()
        loss = loss_fn(model(b.dense, b.sparse), b.labels)
        float(loss.detach())
        if pre is not None and i + 1 < len(batches):
            pre.start(batches[i + 1].sparse)  # the next batch's input exchange runs during this backward
        t1 = time.perf_counter()
        optimizer.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        if cc:
            cc.__exit__(None, None, None)
        optimizer.step()
        t3 = time.perf_counter()
        if i >= warmup:
            phases["forward"].append(t1 - t0)
            phases["backward"].append(t2 - t1)
            phases["optimizer"].append(t3 - t2)
            phases["step"].append(t3 - t0)
    top = None
    if prof is not None:
        prof.__exit__(None, None, None)
        top = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    n = max(1, len(phases["step"]))
    comm = None if cc is None else {
        "bytes_per_step": {p: {c: v / n for c, v in d.items()} for p, d in cc.bytes_by_phase().items()},
        "calls_per_step": {c: k / n for c, k in cc.calls().items()}}
    return {"ms": {k: 1e3 * statistics.median(v) for k, v in phases.items()}, "steps": len(phases["step"]),
            "top_ops": top, "comm": comm, "prefetch_hits": None if pre is None else pre.hits}


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
    ap.add_argument("--ab", choices=("counter", "prefetch"), default="counter",
                    help="what each round runs with and without: the collective byte counter (default), or the "
                         "next batch's input exchange started before this backward (rayemb.embedding.prefetch; "
                         "counter off)")
    ap.add_argument("--out", default=os.path.join(_REPO, "bench-results", "step_profile.json"))
    args = ap.parse_args(argv)

    from rayemb.config import load_config
    from rayemb.data.schema import load_checked
    from rayemb.config import resolve_path
    from rayemb.data.stats_io import load_stats_json
    from rayemb.multiprocess import run_multiprocess
    from rayemb.planner.topology import described_topology
    from rayemb.planner.tables import split_rule
    from rayemb.train.sharding import make_job_plan

    cfg = load_config(args.config, args.overrides + [f"scaling.num_workers={args.world}"])
    schema = load_checked(resolve_path(cfg.data.path))
    stats_path = args.stats or max(glob.glob(os.path.join(_REPO, "runs", "**", "stats.json"), recursive=True),
                                   key=os.path.getmtime, default=None)
    if not stats_path:
        ap.error("no stats.json: pass --stats (a job's output dir has one, or run `rayemb stats`)")
    stats = load_stats_json(stats_path)
    topology = described_topology(world_size=args.world, gpus_per_node=args.world, compute_device="cpu", ddr_gib=8)
    global_batch = cfg.data.batch_size * args.world
    split = split_rule(topology, global_batch, cfg.model.embedding_dim).split(stats)
    job_plan = make_job_plan(cfg, schema, stats, split, topology)
    rows = []
    # alternate the order each round so neither side always runs first on a warming host
    order = [c for r in range(args.rounds) for c in ((True, False) if r % 2 == 0 else (False, True))]
    comm: Dict[str, Dict[str, float]] = {}
    for i, on in enumerate(order):
        counter = on and args.ab == "counter"
        res = run_multiprocess(_profile_rank, args.world, cfg=cfg, schema=schema, job_plan=job_plan,
                               steps=args.steps, warmup=args.warmup, threads=args.threads, counter=counter,
                               torch_profile=args.torch_profile and not on and i < 2,
                               prefetch=on and args.ab == "prefetch")
        ms = {k: statistics.fmean(r["ms"][k] for r in res) for k in res[0]["ms"]}
        if on and args.ab == "prefetch" and not res[0]["prefetch_hits"]:
            print("warning: no forward used a prefetched input exchange (nothing sharded to prefetch?)")
        rows.append({args.ab: on, "round": i // 2, **{f"{k}_ms": v for k, v in ms.items()},
                     "samples_per_s": global_batch / (ms["step"] / 1e3)})
        if res[0].get("top_ops"):
            print(res[0]["top_ops"])
        if counter:
            comm = _comm_summary([r["comm"] for r in res])
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
           "comm_per_step": comm,
           "threads": args.threads, "world": args.world, "rows": rows,
           "predicted_step_time_s": job_plan.summary.get("predicted_step_time_s")}
    columns = [(args.ab, "<8", "{}"), ("round", ">6", "{}"), ("fwd ms", ">7", "{:.2f}"), ("bwd ms", ">7", "{:.2f}"),
               ("opt ms", ">7", "{:.2f}"), ("step ms", ">8", "{:.2f}"), ("samples/s", ">10", "{:,.0f}")]
    keys = [args.ab, "round", "forward_ms", "backward_ms", "optimizer_ms", "step_ms", "samples_per_s"]
    return report(args.out, doc, rows, columns, keys, footer=f"plan: {plan}")


if __name__ == "__main__":
    sys.exit(main())
