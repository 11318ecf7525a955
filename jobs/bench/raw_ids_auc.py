"""Raw-id tables against encoded ids and against hashing, on the same rows: validation AUC side by side.

    python jobs/bench/raw_ids_auc.py --out bench-results/raw_ids_auc_<date>_<commit>.json

The default synthetic job (jobs/configs/synth_small.yaml on ``--data``, generated with ``rayemb gen-data --rows
400000`` when absent) trained four ways on the same rows, every sparse table each way:

* ``encoded``: the ids as generated, in ``[0, V)``: an exact vocabulary;
* ``raw_full``: each id replaced by a random 64-bit value (one fixed value per id, the same in both splits:
  what a hashed user id or SKU looks like), ``ids: raw`` with a capacity of ``V + CAPACITY_SLACK`` rows, room
  for every distinct id (each rank's shard keeps one row for unseen ids), placed as a job places them: hybrid
  (heavy hitters in replicated rows, the rest managed row-wise) where the split gives a table hot ids;
* ``raw_full_row_wise``: the same, every raw table row-wise (``planner.hybrid=false``);
* ``raw_quarter``: the same raw ids with a capacity of ``V // 4`` (at least ``QUARTER_MIN``): the
  managed-collision table evicts;
* ``hash_quarter``: the encoded ids with ``num_embeddings`` of that same size and ``data.id_policy: hash`` (``id
  mod`` it): what a table of that size does without managed collisions.

Verdicts, on every seed and on the last epoch's AUC (``valid_auc``; the best epoch's, picked on the same
validation rows, is reported beside it): ``|raw_full - encoded| <= 0.005`` and the same for ``raw_full_row_wise``, each with
the raw tables placed as it says (``raw_placements``, from the job's plan: a side whose plan does not place them
so FAILs); ``raw_quarter > hash_quarter``; the raw_quarter job logged evictions (its MLflow metrics). A missing or failed run FAILs its verdicts. Runs go seed by seed, the
sides' order rotating per seed, on one local Ray cluster; the result is written after each run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, write_result  # noqa: E402
from model_auc import epoch_aucs, schema_view  # noqa: E402  (the judged AUC; a dataset view over the same files)
from sequence_auc import run_order  # noqa: E402  (seed by seed, the sides rotated by one per seed)

COLUMNS = [("seed", ">4", "{}"), ("side", ">12", "{}"), ("last AUC", ">9", "{:.4f}"), ("best AUC", ">9", "{:.4f}"),
           ("epochs", ">6", "{}"), ("evictions", ">10", "{:,.0f}"), ("wall s", ">7", "{:.0f}")]
KEYS = ["seed", "side", "valid_auc", "best_valid_auc", "epochs", "evictions", "wall_time_s"]
#: side -> (the dataset view it trains on, extra overrides)
SIDES: Dict[str, Tuple[str, List[str]]] = {
    "encoded": ("encoded", []), "raw_full": ("raw_full", []), "raw_full_row_wise": ("raw_full", ["planner.hybrid=false"]),
    "raw_quarter": ("raw_quarter", []), "hash_quarter": ("hash_quarter", ["data.id_policy=hash"])}
#: the placement each full-capacity raw side must give its raw tables (from plan.json) for its verdict to count
FULL_SIDES = {"raw_full": "hybrid", "raw_full_row_wise": "row_wise"}
MARGIN = 0.005
#: raw_full's rows beyond the distinct ids: every rank's shard keeps one row for ids it has not seen
CAPACITY_SLACK = 16
#: the quarter tables' least rows (both sides alike): a raw table's row-wise shard needs 2 rows on each rank
QUARTER_MIN = 8


def raw_keys(num_embeddings: int, seed: int) -> Any:
    """One distinct random int64 per encoded id (a fixed map, so both splits agree)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    while True:
        keys = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=num_embeddings, dtype=np.int64)
        if len(np.unique(keys)) == num_embeddings:
            return keys


def make_views(data: str, scratch: str) -> Dict[str, str]:
    """The four datasets (module docstring) under ``scratch``; the raw parquet written once, schemas symlinked."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import yaml

    with open(os.path.join(data, "schema.yaml")) as f:
        schema = yaml.safe_load(f)
    sparse = schema["sparse"]
    raw_dir = os.path.join(scratch, "raw_ids")
    keys = {s["name"]: pa.array(raw_keys(int(s["num_embeddings"]), i)) for i, s in enumerate(sparse)}
    for split in ("train", "valid"):
        os.makedirs(os.path.join(raw_dir, split), exist_ok=True)
        for name in sorted(os.listdir(os.path.join(data, split))):
            if not name.endswith(".parquet"):
                continue
            table = pq.read_table(os.path.join(data, split, name))
            for col, k in keys.items():
                table = table.set_column(table.schema.get_field_index(col), col, pc.take(k, table[col]))
            pq.write_table(table, os.path.join(raw_dir, split, name))

    def with_sparse(entry: Any) -> Dict[str, Any]:
        return {**schema, "sparse": [entry(dict(s)) for s in sparse]}

    def raw(capacity: Any) -> Any:
        return lambda s: {**s, "ids": "raw", "num_embeddings": capacity(int(s["num_embeddings"]))}

    quarter = lambda v: max(QUARTER_MIN, v // 4)  # noqa: E731
    return {
        "encoded": data,
        "raw_full": schema_view(raw_dir, os.path.join(scratch, "raw_full"),
                                  with_sparse(raw(lambda v: v + CAPACITY_SLACK))),
        "raw_quarter": schema_view(raw_dir, os.path.join(scratch, "raw_quarter"), with_sparse(raw(quarter))),
        "hash_quarter": schema_view(data, os.path.join(scratch, "hash_quarter"),
                                      with_sparse(lambda s: {**s, "num_embeddings": quarter(int(s["num_embeddings"]))})),
    }


def raw_placements(plan: Dict[str, Any]) -> Dict[str, str]:
    """Raw table -> its placement in the job's plan.json (``{}``: no raw tables)."""
    tables = plan.get("tables", {})
    return {name: str(tables.get(name, {}).get("placement")) for name in plan.get("raw_tables", [])}


def evictions(metrics: Dict[str, Any]) -> Optional[float]:
    """The job's evictions over every raw table, from its final metrics (None: none logged)."""
    found = [float(v) for k, v in metrics.items() if "eviction" in k and isinstance(v, (int, float))]
    return sum(found) if found else None


def verdicts(results: Sequence[Dict[str, Any]], seeds: Sequence[int]) -> Dict[str, Any]:
    """PASS/FAIL per acceptance item, per seed, on the last epoch's AUC (``valid_auc``); a missing or failed
    run makes its item FAIL."""
    got = {(r["seed"], r["side"]): r for r in results if "error" not in r}

    def auc(seed: int, side: str) -> Optional[float]:
        r = got.get((seed, side))
        return None if r is None else r.get("valid_auc")

    def diff(seed: int, a: str, b: str) -> Optional[float]:
        x, y = auc(seed, a), auc(seed, b)
        return None if x is None or y is None else x - y

    def placed(seed: int, side: str) -> bool:  # every raw table hybrid / every one row-wise, as the side says
        kinds = set((got.get((seed, side)) or {}).get("raw_placements", {}).values())
        return kinds == {FULL_SIDES[side]} if side == "raw_full_row_wise" else FULL_SIDES[side] in kinds

    full = {side: [diff(s, side, "encoded") if placed(s, side) else None for s in seeds] for side in FULL_SIDES}
    quarter = [diff(s, "raw_quarter", "hash_quarter") for s in seeds]
    evicted = [None if (seed, "raw_quarter") not in got else got[(seed, "raw_quarter")].get("evictions")
               for seed in seeds]
    return {
        **{f"{side}_vs_encoded": {
            "diff_per_seed": full[side], "verdict": "PASS" if all(d is not None and abs(d) <= MARGIN for d in full[side])
            else "FAIL", "rule": f"|{side} - encoded| <= {MARGIN}, raw tables placed {FULL_SIDES[side]}"
            + (" (those the split gives hot ids)" if FULL_SIDES[side] == "hybrid" else "")} for side in FULL_SIDES},
        "raw_quarter_vs_hash_quarter": {"diff_per_seed": quarter, "rule": "raw_quarter - hash_quarter > 0",
                                        "verdict": "PASS" if all(d is not None and d > 0 for d in quarter)
                                        else "FAIL"},
        "raw_quarter_evictions_logged": {"per_seed": evicted, "rule": "> 0 evictions in the job's metrics",
                                         "verdict": "PASS" if all(e is not None and e > 0 for e in evicted)
                                         else "FAIL"},
    }


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(_REPO, "jobs", "configs", "synth_small.yaml"))
    p.add_argument("--data", default=os.path.join(_REPO, "data", "synth_small"))
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--sides", nargs="+", default=list(SIDES), choices=list(SIDES))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import ray

    from rayemb.config import load_config
    from rayemb.data.synthetic import SyntheticSpec, generate
    from rayemb.train.driver.trainer import run_training

    data = os.path.abspath(args.data)
    if not os.path.exists(os.path.join(data, "schema.yaml")):
        print(f"generating {args.rows:,} rows into {data}", flush=True)
        generate(SyntheticSpec(rows=args.rows), data)
    scratch = data + "-raw-views"
    shutil.rmtree(scratch, ignore_errors=True)
    views = make_views(data, scratch)
    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")

    def document(results: List[Dict[str, Any]], complete: bool) -> Dict[str, Any]:
        return {"schema_version": 1, "benchmark": "raw_ids_auc", "config": args.config, "overrides": args.set,
                "data": data, "seeds": args.seeds, "sides": {s: SIDES[s] for s in args.sides},
                "capacity": {"raw_full": f"V + {CAPACITY_SLACK}", "quarter": f"max({QUARTER_MIN}, V // 4)"},
                "complete": complete, "results": results, "verdicts": verdicts(results, args.seeds)}

    results: List[Dict[str, Any]] = []
    order = run_order(args.seeds, args.sides)
    for i, (seed, side) in enumerate(order):
        view, overrides = SIDES[side]
        print(f"[{i + 1}/{len(order)}] seed {seed}, {side}", flush=True)
        cfg = load_config(args.config, [*args.set, *overrides, f"data.path={views[view]}", f"train.seed={seed}",
                                        f"tracking.run_name=raw-ids-{side}-seed{seed}"])
        try:
            r = run_training(cfg, new_run=True)  # each repeat is a run of its own
        except Exception as e:  # noqa: BLE001 - recorded: its verdicts then FAIL
            results.append({"seed": seed, "side": side, "error": f"{type(e).__name__}: {e}"})
            write_result(args.out, document(results, complete=False))
            continue
        results.append({"seed": seed, "side": side, **epoch_aucs(r.reports), "evictions": evictions(r.metrics),
                        "wall_time_s": r.wall_time_s, "run_id": r.run_id, "raw_placements": raw_placements(r.plan)})
        write_result(args.out, document(results, complete=False))

    out = document(results, complete=True)
    rows = sorted((r for r in results if "error" not in r), key=lambda r: (r["seed"], r["side"]))
    footer = "".join(f"\n{name}: {v.get('diff_per_seed', v.get('per_seed'))} ({v['rule']}) {v['verdict']}"
                     for name, v in out["verdicts"].items())
    return report(args.out, out, rows, COLUMNS, KEYS, footer=footer)


if __name__ == "__main__":
    sys.exit(main())
