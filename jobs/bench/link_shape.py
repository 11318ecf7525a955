"""What a collective costs by message size on an emulated shaped link: is the α-β line the step-time model
uses a good description of the wire?

Brings up ``--nodes`` network-namespace nodes with links shaped to
``--bandwidth-mbit`` (``cluster/emulate.py``, needs root), starts one gloo rank
per node (no Ray work: plain processes in the namespaces), and times, in one
interleaved set (``rayemb.train.calibration.probes.Interleaved``), all-to-all and
all-reduce of 4 KiB .. 1 MiB per rank: one call between the other collectives,
one call after a 30 ms idle gap, and three all-to-alls back to back. Prints,
per size and pattern, the bytes one rank sent, the median time, ns per byte,
and what the calibration's α-β line (through 4 KiB and 1 MiB, as
``rayemb.train.calibration.calibrate`` fits it) predicts for the same call.

Usage::

    python jobs/bench/link_shape.py --bandwidth-mbit 100 --out bench-results/link_shape.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path[:0] = [_HERE, _REPO]

from _report import report  # noqa: E402

SIZES = (4096, 16384, 32768, 65536, 131072, 2**20)
#: runs in each node's namespace: one gloo rank; rank 0 prints one JSON line of medians
_RANK = r"""
import datetime, json, statistics, sys, time
import torch, torch.distributed as dist
from rayemb.train.calibration.probes import Interleaved
rank, world, master, sizes, rounds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=120))
iv = Interleaved(barrier=dist.barrier)
idle = {}  # the idle pattern times its own call, after its gap


def after_gap(key, fn):
    def step():
        time.sleep(0.03)
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        idle.setdefault(key, []).append(time.perf_counter() - t0)
    return step


for s in sizes:
    n = s // 4 // world * world
    x, y = torch.ones(n), torch.empty(n)
    iv.add(f"all_to_all/{s}", lambda x=x, y=y: dist.all_to_all_single(y, x))
    iv.add(f"all_to_all_x3/{s}", lambda x=x, y=y: [dist.all_to_all_single(y, x) for _ in range(3)])
    iv.add(f"all_to_all_idle/{s}", after_gap(f"all_to_all_idle/{s}", lambda x=x, y=y: dist.all_to_all_single(y, x)))
    iv.add(f"all_reduce/{s}", lambda x=x: dist.all_reduce(x))
iv.run(rounds=rounds, warmup=2)
if rank == 0:
    times = {**iv.times, **{k: v[2:] for k, v in idle.items()}}  # the idle calls of the warm-up rounds dropped
    print("MEDIANS " + json.dumps({k: statistics.median(v) for k, v in times.items()}), flush=True)
dist.destroy_process_group()
"""


def rows_of(medians: Dict[str, float], world: int) -> List[Dict[str, Any]]:
    """One row per (pattern, size): bytes one rank sent, median ms, ns/B, and the α-β line's ms for the call."""
    q = (world - 1) / world
    small, large = min(SIZES), max(SIZES)
    line = {}
    for fam, factor in (("all_to_all", q), ("all_reduce", 2 * q)):
        x0, x1 = factor * small, factor * large
        t0, t1 = medians[f"{fam}/{small}"], medians[f"{fam}/{large}"]
        beta = max((t1 - t0) / (x1 - x0), 0.0)
        line[fam] = (max(t0 - beta * x0, 0.0), beta)
    rows = []
    for key, t in medians.items():
        pattern, size = key.split("/")
        fam = "all_reduce" if pattern == "all_reduce" else "all_to_all"
        calls = 3 if pattern.endswith("x3") else 1
        sent = (2 * q if fam == "all_reduce" else q) * int(size) * calls
        alpha, beta = line[fam]
        rows.append({"pattern": pattern, "bytes_per_rank": int(size), "sent_kb": sent / 1e3, "ms": 1e3 * t,
                     "ns_per_byte": 1e9 * t / sent, "line_ms": 1e3 * (calls * alpha + beta * sent)})
    return sorted(rows, key=lambda r: (r["pattern"], r["bytes_per_rank"]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bandwidth-mbit", type=float, default=100)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=os.path.join(_REPO, "bench-results", "link_shape.json"))
    args = ap.parse_args(argv)

    from cluster.emulate import IFNAME, EmulatedCluster

    world = 2
    tmp = tempfile.mkdtemp(prefix="rbl-")
    cluster = EmulatedCluster(name="rayemb-link", nodes=world, cpus_per_node=1, bandwidth_mbit=args.bandwidth_mbit,
                              state_dir=os.path.join(tmp, "cluster"))
    cluster.up(replace=True)
    try:
        master = f"{cluster.node_ip(0)}:29517"
        env = {**os.environ, "GLOO_SOCKET_IFNAME": IFNAME, "PYTHONPATH": _REPO}
        procs = [subprocess.Popen(cluster.node_exec_argv(k, [sys.executable, "-c", _RANK, str(k), str(world), master,
                                                             json.dumps(SIZES), str(args.rounds)]),
                                  env=env, stdout=subprocess.PIPE, text=True) for k in range(world)]
        outs = [p.communicate(timeout=900)[0] for p in procs]
    finally:
        cluster.down()
    lines = [line for line in outs[0].splitlines() if line.startswith("MEDIANS ")]
    if not lines:
        print(f"link_shape: rank 0 printed no result (exit {procs[0].returncode})", file=sys.stderr)
        return 1
    rows = rows_of(json.loads(lines[0][8:]), world)
    doc = {"schema_version": 1, "benchmark": "link_shape", "config": vars(args), "rows": rows}
    columns = [("pattern", "<16", "{}"), ("bytes/rank", ">10", "{:,}"), ("sent KB", ">8", "{:.1f}"),
               ("ms", ">8", "{:.2f}"), ("ns/B", ">7", "{:.1f}"), ("α-β ms", ">8", "{:.2f}")]
    return report(args.out, doc, rows, columns, ["pattern", "bytes_per_rank", "sent_kb", "ms", "ns_per_byte", "line_ms"],
                  footer=f"{world} nodes at {args.bandwidth_mbit:g} mbit; α-β: the line through "
                         f"{min(SIZES)} and {max(SIZES)} bytes, as rayemb.train.calibration.calibrate fits it")


if __name__ == "__main__":
    sys.exit(main())
