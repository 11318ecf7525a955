"""Validation AUC with and without hybrid tables on the same job config (issue: hybrid must not cost accuracy).

    python jobs/bench/hybrid_auc.py --config jobs/configs/synth_small.yaml --out bench-results/hybrid_auc.json

Trains the config twice on one local Ray cluster — planner.hybrid true and
false, same data, same seed — and writes
``{"schema_version": 1, "results": [{"hybrid": bool, "valid_auc", "valid_logloss", "placements", "wall_time_s"}],
"auc_diff": float}`` and prints a table.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report  # noqa: E402

COLUMNS = [("hybrid", ">7", "{}"), ("valid_auc", ">10", "{:.4f}"), ("logloss", ">8", "{:.4f}"),
           ("bytes/step", ">11", "{:.0f}"), ("placements", "", "{}")]
KEYS = ["hybrid", "valid_auc", "valid_logloss", "bytes_per_step", "placements"]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="jobs/configs/synth_small.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import ray

    from rayemb.config import load_config
    from rayemb.train.trainer import run_training

    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")
    results = []
    for hybrid in (True, False):
        cfg = load_config(args.config, [*args.set, f"planner.hybrid={str(hybrid).lower()}",
                                        f"tracking.run_name=hybrid-{hybrid}"])
        r = run_training(cfg)
        placements = {}
        for t in r.plan["tables"].values():
            placements[t["placement"]] = placements.get(t["placement"], 0) + 1
        results.append({"hybrid": hybrid, "valid_auc": r.metrics["valid_auc"],
                        "valid_logloss": r.metrics["valid_logloss"], "placements": placements,
                        "bytes_per_step": r.metrics.get("bytes_per_step.total"), "wall_time_s": r.wall_time_s,
                        "run_id": r.run_id})
    out = {"schema_version": 1, "config": args.config, "overrides": args.set, "results": results,
           "auc_diff": results[0]["valid_auc"] - results[1]["valid_auc"]}
    return report(args.out, out, results, COLUMNS, KEYS, footer=f"AUC(hybrid) - AUC(no hybrid) = {out['auc_diff']:+.4f}")


if __name__ == "__main__":
    sys.exit(main())
