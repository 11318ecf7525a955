"""Benchmark: planning time for what-if clusters, up to 1024 GPUs x 500 Criteo-1TB-shaped tables.

    python jobs/bench/plan_scale.py --out runs/bench/plan_scale.json

For each case (world size x tables, dim 128, 80 GiB GPUs, 8 per node,
global batch 1024 per rank) it times :func:`rayemb.planner.plan` (cost-model
choice + placement; the ``fast`` engine at scale, ``torchrec`` where auto picks
it) in a fresh measurement after one warm-up, and records whether every rank
fits, the max/mean per-rank memory, the placements and the predicted bytes per
step. With ``--torchrec-baseline`` it also times TorchRec's stock
``EmbeddingShardingPlanner`` (default enumerator and proposers) on the same
meta-device tables, up to ``--baseline-timeout-s`` per case.

Writes ``{"schema_version": 1, "results": [{"world_size", "tables", "engine",
"seconds", "all_fit", "memory_imbalance", "placements",
"predicted_bytes_per_step"}], "baseline": [...]}`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SCHEMA_VERSION = 1
DEFAULT_CASES = ("8x26", "64x26", "128x100", "512x250", "1024x500")


def _case(world_size: int, num_tables: int, engine: str) -> Dict[str, Any]:
    from rayemb.batch_shape import BatchShape
    from rayemb.planner import criteo_1tb_tables, described_topology, plan

    topo = described_topology(world_size, min(8, world_size), hbm_gib=80)
    tables = criteo_1tb_tables(num_tables, dim=128)
    batch = BatchShape(1024, world_size).global_size
    plan(tables[:2], topo, batch, engine="fast")  # warm-up: imports, caches
    t0 = time.perf_counter()
    r = plan(tables, topo, batch, engine=engine)
    seconds = time.perf_counter() - t0
    return {
        "world_size": world_size, "tables": num_tables, "engine": r.engine, "seconds": seconds,
        "all_fit": r.all_fit(), "memory_imbalance": r.memory_imbalance, "max_rank_gib": r.max_memory_bytes / 2**30,
        "placements": r.placement_counts(), "predicted_bytes_per_step": r.predicted_bytes_per_step,
    }


def _torchrec_baseline(world_size: int, num_tables: int, q: Any) -> None:
    import torch
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.planner import criteo_1tb_tables, described_topology
    from rayemb.planner.torchrec_plan import to_torchrec_topology

    tables = criteo_1tb_tables(num_tables, dim=128)
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                                     feature_names=[t.name]) for t in tables],
                                 device=torch.device("meta"))
    topo = to_torchrec_topology(described_topology(world_size, min(8, world_size), hbm_gib=80))
    t0 = time.perf_counter()
    try:
        EmbeddingShardingPlanner(topology=topo, batch_size=1024).plan(ebc, cpu_capable_sharders())
        q.put({"seconds": time.perf_counter() - t0, "ok": True})
    except Exception as e:  # report the planner's failure as a result, not a crash
        q.put({"seconds": time.perf_counter() - t0, "ok": False, "error": f"{type(e).__name__}: {str(e)[:200]}"})


def _baseline(world_size: int, num_tables: int, timeout_s: float) -> Dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_torchrec_baseline, args=(world_size, num_tables, q))
    p.start()
    p.join(timeout_s)
    if p.is_alive():
        p.kill()
        p.join()
        return {"world_size": world_size, "tables": num_tables, "seconds": None, "ok": False,
                "error": f"timed out after {timeout_s:.0f} s"}
    out = q.get() if not q.empty() else {"seconds": None, "ok": False, "error": f"exit code {p.exitcode}"}
    return {"world_size": world_size, "tables": num_tables, **out}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON result file")
    ap.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), help="WORLDxTABLES, e.g. 1024x500")
    ap.add_argument("--engine", default="auto", choices=("auto", "fast", "torchrec"))
    ap.add_argument("--torchrec-baseline", action="store_true", help="also time TorchRec's stock planner")
    ap.add_argument("--baseline-timeout-s", type=float, default=120.0)
    args = ap.parse_args(argv)
    results, baseline = [], []
    for case in args.cases:
        w, n = (int(x) for x in case.lower().split("x"))
        results.append(_case(w, n, args.engine))
        if args.torchrec_baseline:
            baseline.append(_baseline(w, n, args.baseline_timeout_s))
    doc = {"schema_version": SCHEMA_VERSION, "config": vars(args), "results": results, "baseline": baseline}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"{'world':>6} {'tables':>6} {'engine':>8} {'seconds':>8} {'fit':>4} {'max/mean':>8} {'max GiB':>8} "
          f"{'TiB/step':>9}  placements")
    for r in results:
        print(f"{r['world_size']:>6} {r['tables']:>6} {r['engine']:>8} {r['seconds']:>8.3f} {str(r['all_fit']):>4} "
              f"{r['memory_imbalance']:>8.3f} {r['max_rank_gib']:>8.2f} {r['predicted_bytes_per_step'] / 2**40:>9.3f}  "
              f"{r['placements']}")
    if baseline:
        print("\nTorchRec stock EmbeddingShardingPlanner (default enumerator + proposers):")
        for b in baseline:
            s = f"{b['seconds']:.2f} s" if b["seconds"] is not None else "-"
            print(f"{b['world_size']:>6} {b['tables']:>6} {s:>10} {'ok' if b['ok'] else b.get('error', '')}")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
