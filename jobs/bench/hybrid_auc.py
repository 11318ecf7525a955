"""Validation AUC with and without hybrid tables on the same job config (hybrid must not cost accuracy).

    python jobs/bench/hybrid_auc.py --seeds 0 1 2 --pin-hybrid --out bench-results/hybrid_auc.json

Trains the config with planner.hybrid true and false for every seed of
``--seeds`` (``train.seed``: model initialisation and batch order; default
0 1 2), on one local Ray cluster, same data. The runs are interleaved seed by
seed, alternating which setting goes first (seed 0: true then false, seed 1:
false then true, ...), so drift of the machine's load does not favour one
setting. Reports per setting the mean, min, max and sample standard deviation
(ddof=1) of valid AUC and logloss over the seeds, and the per-seed paired
difference hybrid - no hybrid with the same statistics.

Writes ``{"schema_version": 1, "seeds": [...], "results": [{"seed", "hybrid", "valid_auc", "valid_logloss",
"placements", "bytes_per_step", "wall_time_s", "run_id"}], "auc_diff": mean paired AUC difference,
"summary": {"hybrid"|"no_hybrid": {"valid_auc"|"valid_logloss": {"n", "mean", "min", "max", "std"}}},
"paired": {"seeds", "valid_auc", "valid_logloss", "valid_auc_stats", "valid_logloss_stats"},
"warnings": [...]}``
(rewritten after every run, with ``"complete": false`` until the last) and prints the runs and the summary.
``warnings`` names every planner.hybrid=true run that placed no table hybrid and every setting whose plan
differs between seeds (the planner's live step-time calibration varies with load; ``--set
planner.calibrate=false`` uses built-in constants): such pairs compare more, or less, than hybrid tables.
``--pin-hybrid`` makes the planner.hybrid=true runs place every table with a hot set and a cold remainder
hybrid (``planner.tables.<T>.hybrid=true``, tables from the job's own statistics pass and split), so that
the comparison is about hybrid tables even where the cost model would choose none.

Quick check: ``--seeds 0 1 --set train.epochs=1 --set train.max_steps_per_epoch=40``. ``--config`` defaults
to jobs/configs/synth_small.yaml.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import format_table, report, write_result  # noqa: E402

COLUMNS = [("seed", ">4", "{}"), ("hybrid", ">7", "{}"), ("valid_auc", ">10", "{:.4f}"), ("logloss", ">8", "{:.4f}"),
           ("bytes/step", ">11", "{:.0f}"), ("wall s", ">7", "{:.0f}"), ("placements", "", "{}")]
KEYS = ["seed", "hybrid", "valid_auc", "valid_logloss", "bytes_per_step", "wall_time_s", "placements"]

SUMMARY_COLUMNS = [("setting", "<24", "{}"), ("n", ">2", "{}"),
                   ("AUC mean", ">9", "{:.4f}"), ("min", ">8", "{:.4f}"), ("max", ">8", "{:.4f}"),
                   ("std", ">7", "{:.4f}"),
                   ("logloss mean", ">12", "{:.4f}"), ("min", ">8", "{:.4f}"), ("max", ">8", "{:.4f}"),
                   ("std", ">7", "{:.4f}")]
SUMMARY_KEYS = ["setting", "n", "auc_mean", "auc_min", "auc_max", "auc_std",
                "ll_mean", "ll_min", "ll_max", "ll_std"]

METRICS = ("valid_auc", "valid_logloss")


# ---- aggregation (pure) ---- #


def describe(values: Sequence[float]) -> Dict[str, Any]:
    """``{"n", "mean", "min", "max", "std"}``; std is the sample standard deviation (ddof=1), None below 2 values."""
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "min": None, "max": None, "std": None}
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else None
    return {"n": n, "mean": mean, "min": min(vals), "max": max(vals), "std": std}


def paired_differences(results: Sequence[Dict[str, Any]], metric: str) -> Tuple[List[int], List[float]]:
    """(seeds, hybrid - no hybrid) of ``metric`` for every seed that has both settings, in seed order."""
    by_seed: Dict[int, Dict[bool, float]] = {}
    for r in results:
        by_seed.setdefault(r["seed"], {})[bool(r["hybrid"])] = r[metric]
    seeds = sorted(s for s, v in by_seed.items() if True in v and False in v)
    return seeds, [by_seed[s][True] - by_seed[s][False] for s in seeds]


def aggregate(results: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Per-setting statistics of every metric over seeds, and the per-seed paired differences."""
    summary = {
        ("hybrid" if hybrid else "no_hybrid"): {
            m: describe([r[m] for r in results if bool(r["hybrid"]) == hybrid]) for m in METRICS
        }
        for hybrid in (True, False)
    }
    paired: Dict[str, Any] = {}
    for m in METRICS:
        seeds, diffs = paired_differences(results, m)
        paired["seeds"] = seeds
        paired[m] = diffs
        paired[f"{m}_stats"] = describe(diffs)
    return {"summary": summary, "paired": paired}


def summary_rows(agg: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The rows of the printed summary: one per setting, then the paired difference."""
    def row(setting: str, auc: Dict[str, Any], ll: Dict[str, Any]) -> Dict[str, Any]:
        return {"setting": setting, "n": auc["n"], "auc_mean": auc["mean"], "auc_min": auc["min"],
                "auc_max": auc["max"], "auc_std": auc["std"], "ll_mean": ll["mean"], "ll_min": ll["min"],
                "ll_max": ll["max"], "ll_std": ll["std"]}

    s, p = agg["summary"], agg["paired"]
    return [row("planner.hybrid=true", s["hybrid"]["valid_auc"], s["hybrid"]["valid_logloss"]),
            row("planner.hybrid=false", s["no_hybrid"]["valid_auc"], s["no_hybrid"]["valid_logloss"]),
            row("paired diff (true-false)", p["valid_auc_stats"], p["valid_logloss_stats"])]


def plan_warnings(results: Sequence[Dict[str, Any]]) -> List[str]:
    """What makes a pair compare more (or less) than hybrid tables: no hybrid table placed, plans varying by seed.

    The planner picks placements from a step-time model calibrated on the live
    cluster, so on a loaded machine the plan (and with it the optimizer of
    data-parallel tables) can change from run to run.
    """
    out = []
    for r in results:
        if r["hybrid"] and not r.get("placements", {}).get("hybrid"):
            out.append(f"seed {r['seed']}: planner.hybrid=true placed no table hybrid ({r.get('placements')}); "
                       "this pair compares two plans without hybrid tables")
    for hybrid in (True, False):
        plans = {}
        for r in results:
            if bool(r["hybrid"]) == hybrid:
                plans.setdefault(tuple(sorted((r.get("placements") or {}).items())), []).append(r["seed"])
        if len(plans) > 1:
            seen = "; ".join(f"seeds {s}: {dict(k)}" for k, s in plans.items())
            out.append(f"planner.hybrid={str(hybrid).lower()}: the plan differs between seeds ({seen}); "
                       "--set planner.calibrate=false plans with built-in constants instead of a live calibration")
    return out


def hot_tables(split: Dict[str, Any]) -> List[str]:
    """Tables of a split document (``FrequentSplit.to_dict()``, split.json) with a hot set and a cold
    remainder, 0 < |F| < V: those a hybrid pin applies to (an all-hot table is data-parallel already)."""
    names = []
    for name, t in split.get("tables", {}).items():
        hot, rows = int(t.get("num_hot", 0)), t.get("num_embeddings")
        if hot > 0 and (rows is None or hot < int(rows)):
            names.append(name)
    return sorted(names, key=lambda n: (len(n), n))


def setting_overrides(hybrid: bool, pinned: Optional[Sequence[str]]) -> List[str]:
    """``--set`` overrides of one setting: planner.hybrid, plus the hybrid pins of ``--pin-hybrid``."""
    out = [f"planner.hybrid={str(hybrid).lower()}"]
    if hybrid and pinned:
        out += [f"planner.tables.{t}.hybrid=true" for t in pinned]
    return out


def run_order(seeds: Sequence[int]) -> List[Tuple[int, bool]]:
    """(seed, hybrid) in run order: seed by seed, the first setting alternating."""
    order = []
    for i, seed in enumerate(seeds):
        order += [(seed, True), (seed, False)] if i % 2 == 0 else [(seed, False), (seed, True)]
    return order


# ---- the runs ---- #


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="jobs/configs/synth_small.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="train.seed values; each trains both settings (default %(default)s)")
    p.add_argument("--pin-hybrid", action="store_true",
                   help="in the planner.hybrid=true runs, pin hybrid on every table whose frequent-category split "
                        "has a hot set and a cold remainder (else the cost model may choose no hybrid table)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if any(s.split("=", 1)[0].strip() == "train.seed" for s in args.set):
        p.error("train.seed is set by --seeds; drop it from --set")
    if len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds {args.seeds}: give each seed once")

    import ray

    from rayemb.config import load_config
    from rayemb.train.driver.trainer import run_training

    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")

    pinned: Optional[List[str]] = None
    if args.pin_hybrid:  # the job's own statistics pass and split, as run_training does it
        from rayemb.train.driver.trainer import check_inputs, compute_statistics, job_topology
        from rayemb.train.world_plan import plan_world

        cfg = load_config(args.config, [*args.set, "planner.hybrid=true"])
        split = plan_world(cfg, job_topology(cfg), compute_statistics(check_inputs(cfg))).split
        pinned = hot_tables(split.to_dict())
        print(f"--pin-hybrid: pinning hybrid on {len(pinned)} tables: {' '.join(pinned)}", flush=True)

    def document(results: List[Dict[str, Any]], complete: bool) -> Dict[str, Any]:
        agg = aggregate(results)
        auc_mean = agg["paired"]["valid_auc_stats"]["mean"]
        ll_mean = agg["paired"]["valid_logloss_stats"]["mean"]
        return {"schema_version": 1, "config": args.config, "overrides": args.set, "seeds": args.seeds,
                "complete": complete, "pinned_hybrid_tables": pinned, "results": results,
                # the mean over seeds of AUC(hybrid) - AUC(no hybrid) (one seed: that seed's difference)
                "auc_diff": auc_mean, "logloss_diff": ll_mean, **agg, "warnings": plan_warnings(results)}

    results: List[Dict[str, Any]] = []
    order = run_order(args.seeds)
    for i, (seed, hybrid) in enumerate(order):
        print(f"[{i + 1}/{len(order)}] seed {seed}, planner.hybrid={str(hybrid).lower()}", flush=True)
        cfg = load_config(args.config, [*args.set, *setting_overrides(hybrid, pinned), f"train.seed={seed}",
                                        f"tracking.run_name=hybrid-{hybrid}-seed{seed}"])
        r = run_training(cfg, new_run=True)  # each repeat is a run of its own
        placements: Dict[str, int] = {}
        for t in r.plan["tables"].values():
            placements[t["placement"]] = placements.get(t["placement"], 0) + 1
        results.append({"seed": seed, "hybrid": hybrid, "valid_auc": r.metrics["valid_auc"],
                        "valid_logloss": r.metrics["valid_logloss"], "placements": placements,
                        "bytes_per_step": r.metrics.get("bytes_per_step.total"), "wall_time_s": r.wall_time_s,
                        "run_id": r.run_id})
        write_result(args.out, document(results, complete=False))  # a later failure keeps the runs done so far

    out = document(results, complete=True)
    rows = sorted(results, key=lambda r: (r["seed"], not r["hybrid"]))
    d = out["paired"]["valid_auc_stats"]
    footer = format_table(summary_rows(out), SUMMARY_COLUMNS, SUMMARY_KEYS,
                          title=f"\nover seeds {args.seeds} (std: sample, ddof=1):")
    footer += (f"\nAUC(hybrid) - AUC(no hybrid) per seed: "
               f"{', '.join(f'{s}: {v:+.4f}' for s, v in zip(out['paired']['seeds'], out['paired']['valid_auc']))}"
               f"; mean {d['mean']:+.4f}, range [{d['min']:+.4f}, {d['max']:+.4f}]")
    footer += "".join(f"\nwarning: {w}" for w in out["warnings"])
    return report(args.out, out, rows, COLUMNS, KEYS, footer=footer)


if __name__ == "__main__":
    sys.exit(main())
