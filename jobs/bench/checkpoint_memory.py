"""Host memory and time of a checkpoint save and load: staged and memory-mapped vs the rows in anonymous memory.

    python jobs/bench/checkpoint_memory.py [--sizes 1000000,2000000,4000000] [--tables 2] [--dim 64] [--runs 3] \
        [--chunk-mib 64] [--old-ref <commit>] [--old-max-rows N] \
        [--out bench-results/checkpoint_memory_<YYYY-MM-DD>_<commit7>.json]

For each size N, two gloo ranks (processes on this machine) hold a TorchRec-sharded
``EmbeddingBagCollection`` of ``--tables`` tables of N rows at ``--dim`` (the last row-wise, the others
table-wise) with the fused row-wise Adagrad state. Each rank saves a logical checkpoint
(:func:`rayemb.checkpoint.store.save_logical`) and loads it back (:func:`~rayemb.checkpoint.store.load_logical`),
once with the code of ``--old-ref`` (its ``store.py`` and ``exchange.py`` read with ``git show``: the exchange
in rounds, but the rank's canonical share in anonymous memory for one ``dcp.save``, and each stored piece read
whole by DCP on load) and once with this checkout's (the share staged in memory-mapped files beside the
checkpoint, the stored pieces memory-mapped on load), at ``--chunk-mib``, the two sides alternating run by run
(``--runs`` each). ``--old-max-rows`` leaves the old side out above that size (when it would not fit in memory).
In every run the two sides' DCP files are compared: ``.distcp`` byte for byte, ``.metadata`` byte for byte but
for the save's id and directory name.

**Memory** is each rank's ``RssAnon`` and ``VmRSS`` (``/proc/self/status``, sampled every 2 ms by a thread, and
once more at the end) above what it held just before the call: the peak extra. The verdict is on ``RssAnon``:
anonymous memory is what the kernel cannot reclaim without swap, so it is what runs a host or a container into
the OOM killer; ``VmRSS`` also counts the page cache of the mapped files, which the kernel writes back and drops
under pressure. The ranks run with ``MALLOC_MMAP_THRESHOLD_`` fixed at 64 KiB, so that every buffer of 64 KiB or
more is its own mapping and freeing it returns it (glibc's default threshold grows up to 32 MiB and keeps freed
buffers below it in the heap, which would carry one call's peak into the next one's base).

**The bound** is max(256 MiB, 1/8 of the rank's share of the checkpoint's table state: its canonical rows of
every table, weights and optimizer state); the verdict (PASS/FAIL) asks the new side's save and load peaks of
extra ``RssAnon`` (medians over the runs, with min and max) to be within it on every rank at every size, and the
files to be identical. Staging needs local disk of about the rank's share beside the checkpoint.
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

SCHEMA_VERSION = 2
#: the commit before the save staged its rows and the load mapped the stored pieces
OLD_REF = "3fa19d1"
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}
BOUND_FLOOR_MIB = 256.0
BOUND_SHARE = 1 / 8
SAMPLE_S = 0.002
SIDES = ("in_memory", "staged")
#: the directory name of each side's checkpoint: the same length, so .metadata compares byte for byte
_TAGS = {"in_memory": "old", "staged": "new"}


def _memory() -> Dict[str, int]:
    """RssAnon and VmRSS of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("RssAnon", "VmRSS"):
                out[key] = int(line.split()[1]) * 1024
    return out


def _peak_extra(fn) -> Dict[str, float]:
    """Peak ``RssAnon`` and ``VmRSS`` above the start (MiB) and seconds of ``fn()``."""
    import gc

    gc.collect()
    base = _memory()
    peak = dict(base)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for k, v in _memory().items():
                peak[k] = max(peak[k], v)
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
    for k, v in _memory().items():
        peak[k] = max(peak[k], v)
    return {"anon_extra_mib": (peak["RssAnon"] - base["RssAnon"]) / 2**20,
            "rss_extra_mib": (peak["VmRSS"] - base["VmRSS"]) / 2**20, "seconds": seconds}


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


def same_files(a: str, b: str) -> Dict[str, Any]:
    """Whether two checkpoints' DCP files are equal: ``.distcp`` bytes, ``.metadata`` bytes but for id and name."""
    from rayemb.checkpoint.safe_reader import DCP_METADATA, SafeFileSystemReader

    names = sorted(n for n in os.listdir(a) if n.endswith(".distcp"))
    differ = [n for n in names if not _equal_bytes(os.path.join(a, n), os.path.join(b, n))]
    if names != sorted(n for n in os.listdir(b) if n.endswith(".distcp")):
        differ.append("the file names")
    data = []
    for d in (a, b):
        with open(os.path.join(d, DCP_METADATA), "rb") as f:
            raw = f.read()
        save_id = SafeFileSystemReader(d).metadata().storage_meta.save_id.encode()
        data.append(raw.replace(save_id, b"<id>").replace(os.path.basename(d).encode(), b"<dir>"))
    if data[0] != data[1]:
        differ.append(DCP_METADATA)
    return {"identical": not differ, "differ": differ, "files": names + [DCP_METADATA]}


def _equal_bytes(a: str, b: str) -> bool:
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 22), fb.read(1 << 22)
            if x != y:
                return False
            if not x:
                return True


def _rank(rank: int, world_size: int, rows: List[int], dim: int, runs: int, chunk_mib: float, old_dir: str,
          workdir: str, sides: List[str]) -> Dict[str, Any]:
    import shutil

    import torch.distributed as dist

    sys.path.insert(0, old_dir)
    import _old_checkpoint_store as old_store

    from rayemb.checkpoint import store as new_store
    from rayemb.checkpoint.exchange import row_range

    dmp, opt, tables, kinds = _build(world_size, rows, dim)
    meta = {"epoch": 0, "step": 0}
    code = {"in_memory": old_store, "staged": new_store}
    share = sum((lambda lo_hi: lo_hi[1] - lo_hi[0])(row_range(v, rank, world_size)) * (d + 1) * 4
                for v, d in tables.values())  # weights [rows, D] + row-wise state [rows], fp32
    out: Dict[str, Any] = {"rank": rank, "share_mib": share / 2**20, "kinds": kinds, "runs": [], "files": []}
    for run in range(runs):
        done = []
        for side in (sides if run % 2 == 0 else sides[::-1]):
            mod = code[side]
            directory = os.path.join(workdir, f"{_TAGS[side]}_{run}")
            dist.barrier()
            saved = _peak_extra(lambda: mod.save_logical(directory, dmp, opt, None, tables, meta, chunk_mib=chunk_mib))
            dist.barrier()  # rank 0 writes meta.json last
            loaded = _peak_extra(lambda: mod.load_logical(directory, dmp, opt, None, tables, chunk_mib=chunk_mib))
            dist.barrier()
            out["runs"].append({"run": run, "side": side, "save": saved, "load": loaded})
            done.append(directory)
        if rank == 0:
            if len(done) == 2:
                out["files"].append({"run": run, **same_files(*done)})
            for directory in done:
                shutil.rmtree(directory)
        dist.barrier()
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


def summarise(workloads: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One row per (size, side, rank): medians and spread of peak extra RssAnon, VmRSS and seconds; the verdict."""
    rows, verdicts, identical = [], [], []
    for w in workloads:
        for r in w["per_rank"]:
            bound = max(BOUND_FLOOR_MIB, BOUND_SHARE * r["share_mib"])
            identical += [f["identical"] for f in r["files"]]
            for side in SIDES:
                runs = [x for x in r["runs"] if x["side"] == side]
                if not runs:
                    continue
                row = {"rows": w["rows"], "side": side, "rank": r["rank"], "share_mib": r["share_mib"],
                       "bound_mib": bound, "runs": len(runs)}
                for op in ("save", "load"):
                    for figure in ("anon_extra_mib", "rss_extra_mib", "seconds"):
                        row[f"{op}_{figure}"] = _stat([x[op][figure] for x in runs])
                row["within_bound"] = (row["save_anon_extra_mib"]["median"] <= bound
                                       and row["load_anon_extra_mib"]["median"] <= bound)
                rows.append(row)
                if side == "staged":
                    verdicts.append(row["within_bound"])
    return {"rows": rows, "files_identical": all(identical) if identical else None, "comparisons": len(identical),
            "verdict": "PASS" if verdicts and all(verdicts) and all(identical) else "FAIL"}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1000000,2000000,4000000", help="rows of each table, one workload a size")
    p.add_argument("--tables", type=int, default=2, help="tables a workload (the last row-wise, others table-wise)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--runs", type=int, default=3, help="runs of each side, alternating")
    p.add_argument("--chunk-mib", type=float, default=64.0, help="train.checkpoint_chunk_mib of both sides")
    p.add_argument("--old-ref", default=OLD_REF, help="commit whose checkpoint code is the in-memory side")
    p.add_argument("--old-max-rows", type=int, default=None, help="run the in-memory side only up to this size")
    p.add_argument("--out", default=None, help="JSON result (default bench-results/checkpoint_memory_<date>_<commit>.json)")
    a = p.parse_args(argv)
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):  # glibc reads it at start: run again with it
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + (argv or sys.argv[1:]),
                  {**os.environ, **MALLOC_ENV})
    sys.path.insert(0, _REPO)
    from rayemb.multiprocess import run_multiprocess

    sizes = [int(x) for x in a.sizes.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=_REPO, capture_output=True,
                            text=True).stdout.strip()
    old_commit = subprocess.run(["git", "rev-parse", "--short=7", a.old_ref], cwd=_REPO, check=True,
                                capture_output=True, text=True).stdout.strip()
    out = a.out or os.path.join(_REPO, "bench-results",
                                f"checkpoint_memory_{datetime.date.today().isoformat()}_{commit}.json")
    workloads = []
    with tempfile.TemporaryDirectory(prefix="ckpt-mem-") as tmp:
        _old_modules(a.old_ref, tmp)
        for n in sizes:
            sides = [s for s in SIDES if s == "staged" or a.old_max_rows is None or n <= a.old_max_rows]
            print(f"{n} rows x {a.tables} tables: {', '.join(sides)}", flush=True)
            per_rank = run_multiprocess(_rank, 2, rows=[n] * a.tables, dim=a.dim, runs=a.runs, chunk_mib=a.chunk_mib,
                                        old_dir=tmp, workdir=tmp, sides=sides, timeout_s=3600)
            workloads.append({"rows": n, "sides": sides, "per_rank": per_rank})
    summary = summarise(workloads)
    doc = {"schema_version": SCHEMA_VERSION, "commit": commit, "old_ref": old_commit,
           "config": {"sizes": sizes, "tables": a.tables, "dim": a.dim, "runs": a.runs, "chunk_mib": a.chunk_mib,
                      "world_size": 2, "old_max_rows": a.old_max_rows,
                      "memory": "RssAnon and VmRSS of /proc/self/status sampled every 2 ms above the call's start, "
                                "MALLOC_MMAP_THRESHOLD_=65536",
                      "verdict_on": "RssAnon: anonymous memory is what the kernel cannot reclaim without swap (what "
                                    "runs a host or container into the OOM killer); VmRSS adds the mapped files' "
                                    "page cache, which the kernel writes back and drops under pressure",
                      "bound": f"max({BOUND_FLOOR_MIB:.0f} MiB, {BOUND_SHARE} x the rank's share of the table state)",
                      "disk": "the staged side needs local disk of about the rank's share beside the checkpoint"},
           "workloads": workloads, **summary}
    write_result(out, doc)
    table = [{**r, **{f"{k}_med": r[k]["median"] for k in r if isinstance(r[k], dict)},
              "save_anon_spread": _spread(r["save_anon_extra_mib"]), "load_anon_spread": _spread(r["load_anon_extra_mib"])}
             for r in summary["rows"]]
    print(format_table(table, [("rows", ">8", "{}"), ("side", "<10", "{}"), ("rank", ">4", "{}"),
                               ("share", ">6", "{:.0f}"), ("save anon", ">9", "{:.0f}"), ("(min-max)", ">11", "{}"),
                               ("save rss", ">8", "{:.0f}"), ("save s", ">6", "{:.1f}"), ("load anon", ">9", "{:.0f}"),
                               ("(min-max)", ">11", "{}"), ("load rss", ">8", "{:.0f}"), ("load s", ">6", "{:.1f}"),
                               ("bound", ">5", "{:.0f}")],
                       keys=["rows", "side", "rank", "share_mib", "save_anon_extra_mib_med", "save_anon_spread",
                             "save_rss_extra_mib_med", "save_seconds_med", "load_anon_extra_mib_med",
                             "load_anon_spread", "load_rss_extra_mib_med", "load_seconds_med", "bound_mib"]))
    print(f"files identical in {summary['comparisons']} comparison(s): {summary['files_identical']}")
    print(f"verdict (staged side: save and load peak extra RssAnon within the bound, same files): {summary['verdict']}")
    print(f"wrote {out}")
    return 0


def _spread(s: Dict[str, float]) -> str:
    return f"{s['min']:.0f}-{s['max']:.0f}"


if __name__ == "__main__":
    sys.exit(main())
