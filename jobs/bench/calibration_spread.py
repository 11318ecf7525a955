"""How much the step-time calibration moves between back-to-back runs on one emulated cluster.

Brings up ``--nodes`` Ray nodes in network namespaces with links shaped to
``--bandwidth-mbit`` (``cluster/emulate.py``, needs root), then calls
``rayemb.train.calibration.calibrate.calibrate_cluster`` ``--repeats`` times from the head's
namespace, placed as ``jobs/bench/multinode.py``'s jobs are (one rank per node,
1 CPU each, SPREAD), with the default job's shape. Prints, per probe kind, the
fixed cost per step and the cost per table of every calibration, with their
spread (max - min over median), and the links' β and the replicated element's
cost. Nothing is trained. A planner whose predictions follow the calibration
can be no steadier than this (docs/benchmarks.md, multinode).

Usage::

    python jobs/bench/calibration_spread.py --bandwidth-mbit 100 --repeats 5 --out bench-results/calibration_spread.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path[:0] = [_HERE, _REPO]

from _report import report  # noqa: E402

#: runs in the head's namespace: K calibrations, one JSON line each
_CALIBRATE = r"""
import json, sys
from rayemb._ray import init_ray
from rayemb.train.calibration.calibrate import calibrate_cluster
init_ray()
shape = json.loads(sys.argv[1])
for _ in range(int(sys.argv[2])):
    c = calibrate_cluster(int(sys.argv[3]), 1.0, False, int(sys.argv[3]), shape, strategy="SPREAD")
    print("CAL " + json.dumps(c.to_dict()), flush=True)
"""
SHAPE = dict(local_batch=512, num_dense=13, num_sparse=26, dim=16, bottom_mlp=[64, 16], top_mlp=[64, 32, 1],
             prefetch_input_dist=True)  # the default job's (rayemb.train.calibration.store.calibrate)


def spread(values: Sequence[float]) -> Optional[float]:
    """(max - min) / median, None when the median is 0."""
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else None


def rows_of(cals: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per probe kind (fixed ms, per-table ms) and per link/element constant, over the calibrations."""
    rows: List[Dict[str, Any]] = []
    for kind in sorted(cals[0].get("groups", {})):
        for i, what in enumerate(("fixed", "per_table")):
            ms = [1e3 * float(c["groups"][kind][i]) for c in cals]
            rows.append({"figure": f"{kind} {what} ms", "values": ms, "median": statistics.median(ms),
                         "spread": spread(ms)})
    for name, get in (("all_reduce ns/B", lambda c: 1e9 * c["all_reduce"]["seconds_per_byte"]),
                      ("all_to_all ns/B", lambda c: 1e9 * c["all_to_all"]["seconds_per_byte"]),
                      ("replicated ns/elem", lambda c: 1e9 * c["replicated_elem_s"]),
                      ("dense step ms", lambda c: 1e3 * c["dense_step_s"]),
                      ("ddp wrapper ms", lambda c: 1e3 * c.get("ddp_step_s", 0.0))):
        vals = [float(get(c)) for c in cals]
        rows.append({"figure": name, "values": vals, "median": statistics.median(vals), "spread": spread(vals)})
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bandwidth-mbit", type=float, default=100)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--cpus-per-node", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(_REPO, "bench-results", "calibration_spread.json"))
    args = ap.parse_args(argv)

    from cluster.emulate import EmulatedCluster

    tmp = tempfile.mkdtemp(prefix="rbc-")
    cluster = EmulatedCluster(name="rayemb-cal", nodes=args.nodes, cpus_per_node=args.cpus_per_node,
                              bandwidth_mbit=args.bandwidth_mbit, state_dir=os.path.join(tmp, "cluster"))
    cluster.up(replace=True)
    try:
        cmd = [sys.executable, "-c", _CALIBRATE, json.dumps(SHAPE), str(args.repeats), str(args.nodes)]
        p = subprocess.run(cluster.exec_argv(cmd), cwd=_REPO, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": _REPO})
    finally:
        cluster.down()
    cals = [json.loads(line[4:]) for line in p.stdout.splitlines() if line.startswith("CAL ")]
    if not cals:
        print(f"calibration_spread: no calibration finished (exit {p.returncode}):\n{p.stderr[-3000:]}",
              file=sys.stderr)
        return 1
    rows = rows_of(cals)
    for r in rows:
        r["values_text"] = " ".join(f"{v:.2f}" for v in r["values"])
    doc = {"schema_version": 1, "benchmark": "calibration_spread", "config": vars(args), "shape": SHAPE,
           "rows": rows, "calibrations": cals}
    columns = [("figure", "<26", "{}"), ("median", ">8", "{:.2f}"), ("spread", ">7", "{:.0%}"),
               ("each calibration", "<40", "{}")]
    return report(args.out, doc, rows, columns, ["figure", "median", "spread", "values_text"],
                  footer=f"{len(cals)} calibrations, {args.nodes} nodes at {args.bandwidth_mbit:g} mbit")


if __name__ == "__main__":
    sys.exit(main())
