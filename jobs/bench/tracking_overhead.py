"""What MLflow tracking costs the training loop, with the store up and with it away.

For each scenario a "training loop" calls ``RunLogger.log_metrics`` with
``--metrics`` metrics per step for ``--steps`` steps, as fast as it can, and
records:

* ``call_us_p50`` / ``call_us_p99`` / ``call_us_max``: time inside one
  ``log_metrics`` call (what a training step pays), microseconds;
* ``points_per_s_delivered``: metric points written to the store per second,
  from the first call until ``finish()`` returned (the writer's throughput);
* ``finish_s``: how long ``finish()`` took to flush the remainder;
* ``delivered``: ``finish()``'s answer (False for the unreachable store, whose
  points stay in the spill file).

Scenarios: the embedded sqlite store; an ``http://`` URI nobody listens on
(the server is down for the whole run; ``finish`` is given 2 s). A real
``mlflow server`` outage with restart is exercised by
``tests/unit/test_tracking_logger.py`` instead (it takes ~40 s to boot twice).

Usage::

    python jobs/bench/tracking_overhead.py --out /tmp/tracking_overhead.json [--steps 2000] [--metrics 10]

Writes ``{"schema_version": 1, "results": [...]}`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import time
from typing import Any, Dict, List

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from rayemb.tracking import RunLogger, ensure_store  # noqa: E402

SCHEMA_VERSION = 1


def _pct(xs: List[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_scenario(name: str, uri: str, steps: int, num_metrics: int, finish_timeout_s: float,
                 spill: str) -> Dict[str, Any]:
    rl = RunLogger(uri, "bench-tracking", run_name=name, spill_dir=spill, system_metrics_interval_s=None).start()
    keys = [f"m{i}" for i in range(num_metrics)]
    calls = []
    t0 = time.perf_counter()
    for step in range(steps):
        values = {k: step * 1e-3 + i for i, k in enumerate(keys)}
        c0 = time.perf_counter()
        rl.log_metrics(values, step=step)
        calls.append(time.perf_counter() - c0)
    f0 = time.perf_counter()
    delivered = rl.finish(timeout_s=finish_timeout_s)
    t1 = time.perf_counter()
    return {
        "scenario": name, "steps": steps, "metrics_per_step": num_metrics, "delivered": delivered,
        "call_us_p50": 1e6 * _pct(calls, 0.5), "call_us_p99": 1e6 * _pct(calls, 0.99), "call_us_max": 1e6 * max(calls),
        "points_per_s_delivered": steps * num_metrics / (t1 - t0) if delivered else 0.0,
        "finish_s": t1 - f0,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--metrics", type=int, default=10)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="rayemb-bench-tracking-") as tmp:
        sqlite_uri = f"sqlite:///{tmp}/mlflow.db"
        ensure_store(sqlite_uri)
        results = [
            run_scenario("sqlite", sqlite_uri, args.steps, args.metrics, 120.0, os.path.join(tmp, "spill")),
            run_scenario("server_down", f"http://127.0.0.1:{_free_port()}", args.steps, args.metrics, 2.0,
                         os.path.join(tmp, "spill")),
        ]
    with open(args.out, "w") as f:
        json.dump({"schema_version": SCHEMA_VERSION, "results": results}, f, indent=2)
    cols = ["scenario", "steps", "metrics_per_step", "call_us_p50", "call_us_p99", "call_us_max",
            "points_per_s_delivered", "finish_s", "delivered"]
    print("  ".join(f"{c:>22}" for c in cols))
    for r in results:
        print("  ".join(f"{r[c]:>22.1f}" if isinstance(r[c], float) else f"{str(r[c]):>22}" for c in cols))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
