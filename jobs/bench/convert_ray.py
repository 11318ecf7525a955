"""Lines/s per core of ``rayemb convert criteo --engine ray`` against the single-process converter, on one file.

    python jobs/bench/convert_ray.py --lines 2000000 --runs 5 [--cpus N] \
        [--out bench-results/convert_ray_<date>_<commit>.json]

A synthetic Criteo-format file of ``--lines`` lines (:mod:`rayemb.convert.synthetic`,
uncompressed, kept under ``--data-dir`` for the next run) is converted with
``--hash-buckets`` and the default validation split by both engines, the sides
alternating run by run (so a slow phase of a shared machine hits both), after one
warm-up round that is not counted. The Ray engine runs on a local Ray of
``--cpus`` CPUs started once before the first run, as a conversion with
``--address`` finds a running cluster: Ray's own start-up is not timed. Each
run's wall time is around the whole conversion (planning, every pass, writing,
publication). Per core: the single-process engine counts 1 core (its measured
CPU seconds over wall seconds are reported beside it), the Ray engine ``--cpus``
(its tasks' CPUs, on which the chunks are parsed and encoded and the parquet
parts written; the driver, which adds up the summary, shares them).

Writes ``{"schema_version": 1, "lines", "cpus", "host", "runs": [...], "rows": [{"side", "runs", "failed",
"cores", "lines_per_s", "lines_per_s_per_core": {"median", "min", "max", "n"}, ...}], "identical",
"target"}`` and prints a table. ``target``: the Ray engine's median lines/s per core at least 1.5x the
single-process engine's; it FAILs when a side is missing, a run of it failed, it has fewer than 5 runs, or
the first round's two datasets differ.
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, spread  # noqa: E402

SIDES = ("local", "ray")
MIN_RUNS = 5
TARGET = 1.5
COLUMNS = [("side", "<6", "{}"), ("runs", ">4", "{}"), ("failed", ">6", "{}"), ("cores", ">5", "{}"),
           ("lines/s", ">10", "{:,.0f}"), ("min", ">10", "{:,.0f}"), ("max", ">10", "{:,.0f}"),
           ("per core", ">10", "{:,.0f}"), ("cpu/wall", ">8", "{:.2f}")]
KEYS = ["side", "runs", "failed", "cores", "lines_per_s", "lines_per_s_min", "lines_per_s_max", "per_core",
        "cpu_per_wall"]


def default_out(repo: str = _REPO) -> str:
    """``bench-results/convert_ray_<YYYY-MM-DD>_<commit7>.json``."""
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=repo, capture_output=True, text=True,
                            check=False).stdout.strip() or "unknown"
    return os.path.join(repo, "bench-results", f"convert_ray_{datetime.date.today().isoformat()}_{commit}.json")


def side_row(side: str, runs: Sequence[Mapping[str, Any]], cores: int) -> Dict[str, Any]:
    """One side's row: its runs' lines/s and lines/s per core (median, min, max) and how many failed."""
    mine = [r for r in runs if r["side"] == side]
    ok = [r for r in mine if "error" not in r]
    lps = spread(r["lines_per_s"] for r in ok)
    per_core = spread(r["lines_per_s"] / cores for r in ok)
    cpu = spread(r.get("cpu_per_wall") for r in ok)
    return {"side": side, "runs": len(ok), "failed": len(mine) - len(ok), "cores": cores,
            "lines_per_s": lps["median"], "lines_per_s_min": lps["min"], "lines_per_s_max": lps["max"],
            "lines_per_s_spread": lps, "per_core": per_core["median"], "lines_per_s_per_core": per_core,
            "cpu_per_wall": cpu["median"]}


def _row_problem(row: Optional[Mapping[str, Any]]) -> Optional[str]:
    if row is None:
        return "missing"
    if row.get("failed"):
        return f"{row['failed']} failed run(s)"
    if not row.get("runs") or row.get("per_core") is None:
        return "no run"
    if row["runs"] < MIN_RUNS:
        return f"{row['runs']} run(s), fewer than the {MIN_RUNS} it needs"
    return None


def verdict(rows: Sequence[Mapping[str, Any]], identical: Optional[bool]) -> Dict[str, Any]:
    """PASS when the Ray engine's median lines/s per core is >= TARGET x the single-process engine's, both
    rows complete and the engines' datasets identical; else FAIL, saying why."""
    by = {r["side"]: r for r in rows}
    problems = [f"{side}: {p}" for side in SIDES if (p := _row_problem(by.get(side)))]
    if identical is not True:
        problems.append("the engines' datasets were not compared" if identical is None else
                        "the engines' datasets differ")
    ratio = None
    if by.get("local", {}).get("per_core") and by.get("ray", {}).get("per_core") is not None:
        ratio = by["ray"]["per_core"] / by["local"]["per_core"]
    passed = not problems and ratio is not None and ratio >= TARGET
    return {"rule": f"ray engine's median lines/s per core >= {TARGET}x the single-process engine's",
            "ratio": ratio, "verdict": "PASS" if passed else "FAIL", "problems": problems}


def same_dataset(a: str, b: str) -> bool:
    """Whether two converted datasets hold the same part files, rows and schema.yaml."""
    import pyarrow.parquet as pq

    for split in ("train", "valid"):
        parts = sorted(os.listdir(os.path.join(a, split)))
        if parts != sorted(os.listdir(os.path.join(b, split))):
            return False
        for p in parts:
            if not pq.read_table(os.path.join(a, split, p)).equals(pq.read_table(os.path.join(b, split, p))):
                return False
    with open(os.path.join(a, "schema.yaml")) as fa, open(os.path.join(b, "schema.yaml")) as fb:
        return fa.read() == fb.read()


def _one_run(side: str, data: str, out: str, args: argparse.Namespace) -> Dict[str, Any]:
    from rayemb.convert import ConvertOptions, convert

    opts = ConvertOptions(inputs=(data,), out=out, overwrite=True, hash_buckets=args.hash_buckets, engine=side,
                          progress_every_s=3600.0)
    cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    try:
        summary = convert("criteo", opts)
    except Exception as e:  # noqa: BLE001 - recorded: the side's row then counts a failed run
        return {"side": side, "error": f"{type(e).__name__}: {e}"}
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"side": side, "wall_s": round(wall, 3), "lines": summary["lines_read"],
            "lines_per_s": summary["lines_read"] / wall, "driver_cpu_s": round(cpu_s, 3),
            "cpu_per_wall": round(cpu_s / wall, 3) if side == "local" else None,
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=2_000_000, help="lines of the synthetic Criteo file")
    p.add_argument("--runs", type=int, default=MIN_RUNS, help="timed runs per side (the verdict needs 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (Ray's workers start, the file is "
                                                         "cached)")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="CPUs of the local Ray")
    p.add_argument("--hash-buckets", type=int, default=1_000_000)
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "rayemb-convert-bench"),
                   help="where the synthetic file is written (and found by the next run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON result (default bench-results/convert_ray_<date>_<commit>.json)")
    args = p.parse_args(argv)

    import ray

    from rayemb.convert.synthetic import write_criteo

    os.makedirs(args.data_dir, exist_ok=True)
    data = os.path.join(args.data_dir, f"criteo_{args.lines}_{args.seed}.txt")
    if not os.path.exists(data):
        print(f"writing {args.lines:,} lines to {data}", flush=True)
        write_criteo(data + ".tmp", args.lines, seed=args.seed)
        os.replace(data + ".tmp", data)
    outs = tempfile.mkdtemp(prefix="rayemb-convert-bench-")
    runs: List[Dict[str, Any]] = []
    identical: Optional[bool] = None
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 logging_level="WARNING")
    try:
        cpus = int(ray.cluster_resources().get("CPU", args.cpus))
        for r in range(args.warmup + args.runs):
            for side in SIDES:
                run = _one_run(side, data, os.path.join(outs, side), args)
                print(f"[{'warm-up' if r < args.warmup else r - args.warmup + 1}] {side}: "
                      + (run.get("error") or f"{run['lines_per_s']:,.0f} lines/s in {run['wall_s']:.1f} s"), flush=True)
                if r >= args.warmup:
                    runs.append({"run": r - args.warmup, **run})
            if identical is None and all(os.path.exists(os.path.join(outs, s, "schema.yaml")) for s in SIDES):
                identical = same_dataset(os.path.join(outs, "local"), os.path.join(outs, "ray"))
    finally:
        if started:
            ray.shutdown()
        shutil.rmtree(outs, ignore_errors=True)
    rows = [side_row("local", runs, 1), side_row("ray", runs, cpus)]
    target = verdict(rows, identical)
    doc = {"schema_version": 1, "lines": args.lines, "data": data, "cpus": cpus, "hash_buckets": args.hash_buckets,
           "host": {"cpu_count": os.cpu_count(), "platform": sys.platform}, "runs": runs, "rows": rows,
           "identical": identical, "target": target}
    footer = (f"ray/local lines/s per core: {target['ratio']:.2f}x (target >= {TARGET}x): {target['verdict']}"
              if target["ratio"] is not None else f"target: {target['verdict']}")
    if target["problems"]:
        footer += f" ({'; '.join(target['problems'])})"
    return report(args.out or default_out(), doc, rows, COLUMNS, KEYS, footer=footer)


if __name__ == "__main__":
    sys.exit(main())
