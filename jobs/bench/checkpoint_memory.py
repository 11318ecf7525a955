"""Host memory and time of a checkpoint save and load: the exchange in bounded rounds vs all at once.

    python jobs/bench/checkpoint_memory.py [--rows 1000000,2000000,4000000] [--dim 64] [--runs 3] \
        [--chunk-mib 64] [--old-ref <commit>] [--out bench-results/checkpoint_memory_<YYYY-MM-DD>_<commit7>.json]

Two gloo ranks (processes on this machine) hold a TorchRec-sharded ``EmbeddingBagCollection``: the first
tables of ``--rows`` table-wise, the last row-wise, all at ``--dim``, with the fused row-wise Adagrad
state. Each rank saves a logical checkpoint (:func:`rayemb.checkpoint.store.save_logical`) and loads it
back (:func:`~rayemb.checkpoint.store.load_logical`), once with the code of ``--old-ref`` (its
``store.py`` and ``exchange.py`` read with ``git show``: one all-to-all per state, every row padded to
the widest table, rows through fp32) and once with this checkout's at ``--chunk-mib``, the two sides
alternating run by run (``--runs`` each).

**Memory** is each rank's resident set (``VmRSS`` of ``/proc/self/status``, sampled every 2 ms by a
thread, and once more at the end) above what it held just before the call: the peak extra host
memory. The ranks run with ``MALLOC_MMAP_THRESHOLD_`` fixed at 64 KiB, so that every buffer of 64 KiB
or more is its own mapping and freeing it returns it (glibc's default threshold grows up to 32 MiB and
keeps freed buffers below it in the heap, which would carry one call's peak into the next one's base).

**The bound** is max(256 MiB, 1/8 of the rank's share of the checkpoint's table state: its canonical
rows of every table, weights and optimizer state). A save by one ``dcp.save`` per rank (the format)
holds that share itself in memory while DCP writes it: the verdict asks the save's peak *less that share*
(``save_beyond_rows``) and the load's whole peak to be within the bound, for the chunked side.
Medians over the runs, with min and max.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_REPO, "jobs", "bench"))
from _report import format_table, write_result  # noqa: E402

SCHEMA_VERSION = 1
#: the commit before the exchange ran in rounds (the all-at-once code path)
OLD_REF = "916641f^"
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}
BOUND_FLOOR_MIB = 256.0
BOUND_SHARE = 1 / 8
SAMPLE_S = 0.002


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _peak_extra(fn) -> Dict[str, float]:
    """(peak RSS above the start, seconds) of ``fn()``."""
    import gc

    gc.collect()
    base = _rss_bytes()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(SAMPLE_S)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    try:
        fn()
    finally:
        seconds = time.perf_counter() - t0
        done.set()
        thread.join()
    return {"peak_extra_mib": (max(peak[0], _rss_bytes()) - base) / 2**20, "seconds": seconds}


def _build(world_size: int, rows: List[int], dim: int):
    import torch
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
    from rayemb.embedding.sharders import cpu_capable_sharders

    torch.manual_seed(0)
    names = [f"t{i}" for i in range(len(rows))]
    configs = [EmbeddingBagConfig(name=n, embedding_dim=dim, num_embeddings=v, feature_names=[f"f_{n}"])
               for n, v in zip(names, rows)]
    ebc = HybridEmbeddingBagCollection(configs, {}, device=torch.device("meta"))  # rayemb's table module, no hot rows
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.05})
    kinds = {n: "row_wise" if i == len(names) - 1 else "table_wise" for i, n in enumerate(names)}
    cons = ebc.parameter_constraints({}, {n: [k] for n, k in kinds.items()}, min_partition=4)
    sharders = cpu_capable_sharders()
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                    constraints=cons).collective_plan(ebc, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan, sharders=sharders)
    return dmp, dmp.fused_optimizer, {n: (v, dim) for n, v in zip(names, rows)}, kinds


def _rank(rank: int, world_size: int, rows: List[int], dim: int, runs: int, chunk_mib: float, old_dir: str,
          workdir: str) -> Dict[str, Any]:
    import shutil

    import torch.distributed as dist

    sys.path.insert(0, old_dir)
    import _old_checkpoint_store as old_store

    from rayemb.checkpoint import store as new_store
    from rayemb.checkpoint.exchange import row_range

    dmp, opt, tables, kinds = _build(world_size, rows, dim)
    meta = {"epoch": 0, "step": 0}
    sides = {
        "all_at_once": (lambda d: old_store.save_logical(d, dmp, opt, None, tables, meta),
                        lambda d: old_store.load_logical(d, dmp, opt, None, tables)),
        "chunked": (lambda d: new_store.save_logical(d, dmp, opt, None, tables, meta, chunk_mib=chunk_mib),
                    lambda d: new_store.load_logical(d, dmp, opt, None, tables, chunk_mib=chunk_mib)),
    }
    share = sum((lambda lo_hi: lo_hi[1] - lo_hi[0])(row_range(v, rank, world_size)) * (d + 1) * 4
                for v, d in tables.values())  # weights [rows, D] + row-wise state [rows], fp32
    out: Dict[str, Any] = {"rank": rank, "share_mib": share / 2**20, "kinds": kinds, "runs": []}
    for run in range(runs):
        for side in (list(sides) if run % 2 == 0 else list(sides)[::-1]):
            save, load = sides[side]
            directory = os.path.join(workdir, f"{side}_{run}")
            dist.barrier()
            saved = _peak_extra(lambda: save(directory))
            dist.barrier()
            loaded = _peak_extra(lambda: load(directory))
            dist.barrier()
            if rank == 0:
                shutil.rmtree(directory)
            out["runs"].append({"run": run, "side": side, "save": saved, "load": loaded})
    return out


def _old_modules(ref: str, into: str) -> None:
    """``store.py`` and ``exchange.py`` of ``ref`` as modules ``_old_checkpoint_store`` / ``_old_checkpoint_exchange``."""
    def show(path: str) -> str:
        return subprocess.run(["git", "show", f"{ref}:{path}"], cwd=_REPO, check=True, capture_output=True,
                              text=True).stdout

    store = show("rayemb/checkpoint/store.py").replace("from rayemb.checkpoint.exchange import",
                                                       "from _old_checkpoint_exchange import")
    with open(os.path.join(into, "_old_checkpoint_store.py"), "w") as f:
        f.write(store)
    with open(os.path.join(into, "_old_checkpoint_exchange.py"), "w") as f:
        f.write(show("rayemb/checkpoint/exchange.py"))


def _stat(values: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(per_rank: List[Dict[str, Any]], chunk_mib: float) -> Dict[str, Any]:
    """One row per (side, rank): medians and spread of peak extra MiB and seconds; the verdict on the bound."""
    rows, verdicts = [], []
    for r in per_rank:
        bound = max(BOUND_FLOOR_MIB, BOUND_SHARE * r["share_mib"])
        for side in ("all_at_once", "chunked"):
            runs = [x for x in r["runs"] if x["side"] == side]
            save = _stat([x["save"]["peak_extra_mib"] for x in runs])
            load = _stat([x["load"]["peak_extra_mib"] for x in runs])
            row = {"side": side, "rank": r["rank"], "share_mib": r["share_mib"], "bound_mib": bound,
                   "save_peak_extra_mib": save, "save_beyond_rows_mib": save["median"] - r["share_mib"],
                   "save_s": _stat([x["save"]["seconds"] for x in runs]),
                   "load_peak_extra_mib": load, "load_s": _stat([x["load"]["seconds"] for x in runs])}
            rows.append(row)
            if side == "chunked":
                verdicts.append(row["save_beyond_rows_mib"] <= bound and load["median"] <= bound)
    return {"rows": rows, "verdict": "PASS" if verdicts and all(verdicts) else "FAIL"}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1000000,2000000,4000000", help="rows of each table (the last row-wise)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--runs", type=int, default=3, help="runs of each side, alternating")
    p.add_argument("--chunk-mib", type=float, default=64.0, help="train.checkpoint_chunk_mib of the chunked side")
    p.add_argument("--old-ref", default=OLD_REF, help="commit whose checkpoint code is the all-at-once side")
    p.add_argument("--out", default=None, help="JSON result (default bench-results/checkpoint_memory_<date>_<commit>.json)")
    a = p.parse_args(argv)
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):  # glibc reads it at start: run again with it
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + (argv or sys.argv[1:]),
                  {**os.environ, **MALLOC_ENV})
    sys.path.insert(0, _REPO)
    from rayemb.multiprocess import run_multiprocess

    rows = [int(x) for x in a.rows.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=_REPO, capture_output=True,
                            text=True).stdout.strip()
    old_commit = subprocess.run(["git", "rev-parse", "--short=7", a.old_ref], cwd=_REPO, check=True,
                                capture_output=True, text=True).stdout.strip()
    out = a.out or os.path.join(_REPO, "bench-results",
                                f"checkpoint_memory_{datetime.date.today().isoformat()}_{commit}.json")
    with tempfile.TemporaryDirectory(prefix="ckpt-mem-") as tmp:
        _old_modules(a.old_ref, tmp)
        per_rank = run_multiprocess(_rank, 2, rows=rows, dim=a.dim, runs=a.runs, chunk_mib=a.chunk_mib, old_dir=tmp,
                                    workdir=tmp, timeout_s=3600)
    summary = summarise(per_rank, a.chunk_mib)
    doc = {"schema_version": SCHEMA_VERSION, "commit": commit, "old_ref": old_commit,
           "config": {"rows": rows, "dim": a.dim, "runs": a.runs, "chunk_mib": a.chunk_mib, "world_size": 2,
                      "memory": "VmRSS sampled every 2 ms above the call's start, MALLOC_MMAP_THRESHOLD_=65536",
                      "bound": f"max({BOUND_FLOOR_MIB:.0f} MiB, {BOUND_SHARE} x the rank's share of the table state)"},
           "per_rank": per_rank, **summary}
    write_result(out, doc)
    table = [{**r, "save": r["save_peak_extra_mib"]["median"], "save_spread": _spread(r["save_peak_extra_mib"]),
              "load": r["load_peak_extra_mib"]["median"], "load_spread": _spread(r["load_peak_extra_mib"]),
              "save_s_med": r["save_s"]["median"], "load_s_med": r["load_s"]["median"]} for r in summary["rows"]]
    print(format_table(table, [("side", "<12", "{}"), ("rank", ">4", "{}"), ("share MiB", ">9", "{:.0f}"),
                               ("save MiB", ">9", "{:.0f}"), ("(min-max)", ">11", "{}"), ("beyond rows", ">11", "{:.0f}"),
                               ("load MiB", ">9", "{:.0f}"), ("(min-max)", ">11", "{}"), ("bound", ">6", "{:.0f}"),
                               ("save s", ">7", "{:.2f}"), ("load s", ">7", "{:.2f}")],
                       keys=["side", "rank", "share_mib", "save", "save_spread", "save_beyond_rows_mib", "load",
                             "load_spread", "bound_mib", "save_s_med", "load_s_med"]))
    print(f"verdict (chunked side: save beyond its rows and load within the bound): {summary['verdict']}")
    print(f"wrote {out}")
    return 0


def _spread(s: Dict[str, float]) -> str:
    return f"{s['min']:.0f}-{s['max']:.0f}"


if __name__ == "__main__":
    sys.exit(main())
