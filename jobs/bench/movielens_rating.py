"""Rating regression on MovieLens-format data: the job's held-out RMSE against the mean predictor's.

    python jobs/bench/movielens_rating.py --seeds 0 1 2 --out bench-results/movielens_rating_<date>_<commit>.json

There is no MovieLens file here, so each data seed of ``--seeds`` generates a ``ratings.csv``
(``userId,movieId,rating,timestamp``; :mod:`rayemb.data.synthetic_ratings`: per-user and per-item biases, a
rank-8 user x item affinity, half stars from 0.5 to 5, a long-tailed item popularity; ``--users`` x
``--items``), converts it with ``rayemb convert movielens --label rating`` (the rating a regression task;
each user's last rating is the held-out split) and trains it with ``rayemb train`` on jobs/configs/synth_small.yaml
as is, apart from the data path, ``--epochs`` and ``--batch-size``: 2 ranks on one local Ray.

Each seed's figures: the job's ``valid_rmse`` and ``valid_mae`` of its last epoch (no epoch chosen on the rows
it is scored on), and the mean predictor's, which predicts the train labels' mean for every held-out row
(numpy, from the same parquet). Verdict: RMSE <= ``RATIO`` (0.95) x the mean predictor's on every seed.
Writes ``{"schema_version": 1, "spec", "seeds", "complete", "results": [{"seed", "ratings", "train_rows",
"valid_rows", "rmse", "mae", "mean_rmse", "mean_mae", "rmse_ratio", "best_rmse", "best_epoch", "epochs", "wall_time_s",
"run_id"}], "verdict"}`` after every seed and prints a table.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, write_result  # noqa: E402

RATIO = 0.95
COLUMNS = [("seed", ">4", "{}"), ("ratings", ">8", "{:,}"), ("valid", ">6", "{:,}"), ("RMSE", ">7", "{:.4f}"),
           ("mean RMSE", ">9", "{:.4f}"), ("ratio", ">6", "{:.3f}"), ("MAE", ">7", "{:.4f}"),
           ("mean MAE", ">8", "{:.4f}"), ("epochs", ">6", "{}"), ("wall s", ">7", "{:.0f}")]
KEYS = ["seed", "ratings", "valid_rows", "rmse", "mean_rmse", "rmse_ratio", "mae", "mean_mae", "epochs",
        "wall_time_s"]


def _labels(data: str, split: str) -> Any:
    import numpy as np
    import pyarrow.parquet as pq

    files = sorted(glob.glob(os.path.join(data, split, "*.parquet")))
    return pq.read_table(files, columns=["rating"]).column("rating").to_numpy().astype(np.float64)


def mean_predictor(data: str) -> Dict[str, float]:
    """RMSE and MAE on the held-out split of predicting the train labels' mean for every row."""
    import numpy as np

    train, valid = _labels(data, "train"), _labels(data, "valid")
    err = valid - train.mean()
    return {"train_mean": float(train.mean()), "train_rows": int(len(train)), "valid_rows": int(len(valid)),
            "mean_rmse": float(np.sqrt(np.mean(err ** 2))), "mean_mae": float(np.mean(np.abs(err)))}


def verdict(results: Sequence[Dict[str, Any]], seeds: Sequence[int]) -> Dict[str, Any]:
    """RMSE <= RATIO x the mean predictor's on every seed (a seed without a result FAILs)."""
    by_seed = {r["seed"]: r.get("rmse_ratio") for r in results}
    ratios = {s: by_seed.get(s) for s in seeds}
    ok = all(v is not None and v <= RATIO for v in ratios.values())
    return {"rule": f"valid_rmse (last epoch) <= {RATIO} x the mean predictor's, every seed",
            "ratio_per_seed": ratios, "verdict": "PASS" if ok else "FAIL"}


def run_seed(seed: int, args: argparse.Namespace, work: str) -> Dict[str, Any]:
    from rayemb.cli import main as rayemb
    from rayemb.data.synthetic_ratings import write_ratings_csv

    raw, data = os.path.join(work, f"ratings-{seed}.csv"), os.path.join(work, f"data-{seed}")
    n = write_ratings_csv(raw, users=args.users, items=args.items, seed=seed)
    if rayemb(["convert", "movielens", "--input", raw, "--out", data, "--label", "rating", "--overwrite"]) != 0:
        return {"seed": seed, "error": "rayemb convert failed"}
    baseline = mean_predictor(data)
    result_json = os.path.join(work, f"result-{seed}.json")
    rc = rayemb(["train", "--config", args.config, "--new-run",
                 "--set", f"data.path={data}", "--set", f"data.batch_size={args.batch_size}",
                 "--set", f"train.epochs={args.epochs}", "--set", "train.early_stopping_patience=null",
                 "--set", f"tracking.output_dir={args.runs}", "--set", "tracking.experiment=movielens-rating",
                 "--set", f"tracking.run_name=movielens-rating-seed{seed}", *sum((["--set", s] for s in args.set), []),
                 "--result-json", result_json])
    if rc != 0:
        return {"seed": seed, "ratings": n, **baseline, "error": f"rayemb train exited {rc}"}
    with open(result_json) as f:
        job = json.load(f)
    m = job["metrics"]
    return {"seed": seed, "ratings": n, **baseline, "rmse": m.get("valid_rmse"), "mae": m.get("valid_mae"),
            "rmse_ratio": m["valid_rmse"] / baseline["mean_rmse"] if m.get("valid_rmse") is not None else None,
            "best_rmse": m.get("best_valid_rmse"), "best_epoch": m.get("best_epoch"), "epochs": args.epochs,
            "status": job["status"], "wall_time_s": job["wall_time_s"], "run_id": job["run_id"]}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="data seeds (at least 3 for a verdict)")
    p.add_argument("--users", type=int, default=1000)
    p.add_argument("--items", type=int, default=600)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--config", default=os.path.join(_REPO, "jobs", "configs", "synth_small.yaml"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more job overrides")
    p.add_argument("--runs", default=None, help="the jobs' output folder (default: a temporary one, removed)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if len(args.seeds) < 3:
        p.error("--seeds: give at least 3 data seeds")

    import ray

    from rayemb.data.synthetic_ratings import RatingsSpec

    work = tempfile.mkdtemp(prefix="mlr-")
    args.runs = os.path.abspath(args.runs or os.path.join(work, "runs"))
    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")
    results: List[Dict[str, Any]] = []

    def document(complete: bool) -> Dict[str, Any]:
        spec = RatingsSpec(users=args.users, items=args.items)
        return {"schema_version": 1, "spec": spec.__dict__, "config": os.path.relpath(args.config, _REPO),
                "overrides": {"epochs": args.epochs, "batch_size": args.batch_size, "set": args.set},
                "num_workers": 2, "seeds": args.seeds, "complete": complete, "results": results,
                "verdict": verdict(results, args.seeds)}

    try:
        for i, seed in enumerate(args.seeds):
            print(f"[{i + 1}/{len(args.seeds)}] data seed {seed}", flush=True)
            results.append(run_seed(seed, args, work))
            write_result(args.out, document(complete=False))
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    out = document(complete=True)
    v = out["verdict"]
    return report(args.out, out, [r for r in results if "error" not in r], COLUMNS, KEYS,
                  footer=f"\n{v['rule']}: {v['ratio_per_seed']} {v['verdict']}")


if __name__ == "__main__":
    sys.exit(main())
