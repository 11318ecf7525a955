"""Validation AUC with and without the user-history tower on the same data: does the tower help?

    python jobs/bench/sequence_auc.py --data data/synth_small_hist --rows 400000 --sequence-length 16 \\
        --seeds 0 1 --out bench-results/sequence_auc.json

Generates ``--data`` if it has no schema.yaml (``rayemb gen-data --rows R --sequence-length L``: the
default synthetic data plus the history column H1, target C1), then trains the config (default
jobs/configs/synth_small.yaml) once per ``model.sequence_tower`` of ``--towers`` (default none attention)
for every seed of ``--seeds`` (``train.seed``: initialisation and batch order), same data, one local Ray
cluster. Runs go seed by seed, the tower order rotating per seed, so the machine's load drift favours none.

Both the job's reported AUC (``best_valid_auc``: the best epoch, which early stopping keeps) and the last
epoch's ``valid_auc`` are recorded. Writes ``{"schema_version": 1, "data", "towers", "seeds", "complete",
"results": [{"seed", "tower", "best_valid_auc", "valid_auc", "valid_logloss", "sequence_plan",
"wall_time_s", "run_id"}], "paired": {tower: {"seeds", "best_valid_auc_diff", "mean", "min", "max"}}}``
(paired: tower minus ``none``, per seed) after every run and prints a table.

Quick check: ``--rows 40000 --seeds 0 --set train.epochs=1``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, write_result  # noqa: E402

COLUMNS = [("seed", ">4", "{}"), ("tower", ">9", "{}"), ("best AUC", ">9", "{:.4f}"), ("last AUC", ">9", "{:.4f}"),
           ("logloss", ">8", "{:.4f}"), ("wall s", ">7", "{:.0f}"), ("sequence plan", "", "{}")]
KEYS = ["seed", "tower", "best_valid_auc", "valid_auc", "valid_logloss", "wall_time_s", "sequence_plan"]


def run_order(seeds: Sequence[int], towers: Sequence[str]) -> List[Tuple[int, str]]:
    """(seed, tower) in run order: seed by seed, the towers rotated by one per seed."""
    order = []
    for i, seed in enumerate(seeds):
        k = i % len(towers)
        order += [(seed, t) for t in [*towers[k:], *towers[:k]]]
    return order


def paired(results: Sequence[Dict[str, Any]], towers: Sequence[str]) -> Dict[str, Any]:
    """Per tower other than none: best_valid_auc(tower) - best_valid_auc(none) for every seed with both."""
    by_seed: Dict[int, Dict[str, float]] = {}
    for r in results:
        by_seed.setdefault(r["seed"], {})[r["tower"]] = r["best_valid_auc"]
    out: Dict[str, Any] = {}
    for tower in towers:
        if tower == "none":
            continue
        seeds = sorted(s for s, v in by_seed.items() if tower in v and "none" in v)
        diffs = [by_seed[s][tower] - by_seed[s]["none"] for s in seeds]
        out[tower] = {"seeds": seeds, "best_valid_auc_diff": diffs,
                      "mean": sum(diffs) / len(diffs) if diffs else None,
                      "min": min(diffs) if diffs else None, "max": max(diffs) if diffs else None}
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="jobs/configs/synth_small.yaml")
    p.add_argument("--data", required=True, help="dataset with a sequence feature (generated here if absent)")
    p.add_argument("--rows", type=int, default=400_000, help="rows to generate (default %(default)s)")
    p.add_argument("--sequence-length", type=int, default=16, help="history max_length to generate (default 16)")
    p.add_argument("--towers", nargs="+", default=["none", "attention"], choices=["none", "mean", "attention"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    for key in ("train.seed", "model.sequence_tower", "data.path"):
        if any(s.split("=", 1)[0].strip() == key for s in args.set):
            p.error(f"{key} is set by this script; drop it from --set")

    import ray

    from rayemb.config import load_config
    from rayemb.data.synthetic import SyntheticSpec, generate
    from rayemb.train.driver.trainer import run_training

    data = os.path.abspath(args.data)
    if not os.path.exists(os.path.join(data, "schema.yaml")):
        print(f"generating {args.rows:,} rows with a history of {args.sequence_length} into {data}", flush=True)
        generate(SyntheticSpec(rows=args.rows, sequence_length=args.sequence_length), data)
    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")

    def document(results: List[Dict[str, Any]], complete: bool) -> Dict[str, Any]:
        return {"schema_version": 1, "config": args.config, "overrides": args.set, "data": data,
                "towers": args.towers, "seeds": args.seeds, "complete": complete, "results": results,
                "paired": paired(results, args.towers)}

    results: List[Dict[str, Any]] = []
    order = run_order(args.seeds, args.towers)
    for i, (seed, tower) in enumerate(order):
        print(f"[{i + 1}/{len(order)}] seed {seed}, model.sequence_tower={tower}", flush=True)
        cfg = load_config(args.config, [*args.set, f"data.path={data}", f"model.sequence_tower={tower}",
                                        f"train.seed={seed}", f"tracking.run_name=sequence-{tower}-seed{seed}"])
        r = run_training(cfg, new_run=True)  # each repeat is a run of its own
        seq = (r.plan.get("sequence") or {}).get("tables", {})
        results.append({"seed": seed, "tower": tower, "best_valid_auc": r.metrics["best_valid_auc"],
                        "valid_auc": r.metrics["valid_auc"], "valid_logloss": r.metrics["valid_logloss"],
                        "sequence_plan": {t: f"{v['sharding_type']} {v['ranks']}" for t, v in seq.items()},
                        "wall_time_s": r.wall_time_s, "run_id": r.run_id})
        write_result(args.out, document(results, complete=False))  # a later failure keeps the runs done so far

    out = document(results, complete=True)
    rows = sorted(results, key=lambda r: (r["seed"], args.towers.index(r["tower"])))
    footer = "".join(
        f"\nbest_valid_auc({t}) - best_valid_auc(none) per seed: "
        f"{', '.join(f'{s}: {v:+.4f}' for s, v in zip(d['seeds'], d['best_valid_auc_diff']))}"
        + (f"; mean {d['mean']:+.4f}, range [{d['min']:+.4f}, {d['max']:+.4f}]" if d["mean"] is not None else "")
        for t, d in out["paired"].items())
    return report(args.out, out, rows, COLUMNS, KEYS, footer=footer)


if __name__ == "__main__":
    sys.exit(main())
