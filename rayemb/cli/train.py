"""``rayemb train`` (also ``jobs/train.py``) and ``rayemb gen-data``: thin layers over the library."""

from __future__ import annotations

import argparse
import os

from rayemb.logs import redact_uri


def add_gen_data_arguments(g: argparse.ArgumentParser) -> None:
    g.add_argument("--out", required=True, help="output directory (parquet splits + schema.yaml)")
    g.add_argument("--profile", metavar="NAME",
                   help="a named workload that fixes the tables, their sizes and Zipf exponents, e.g. "
                        "criteo-1tb-scaled (docs/workloads.md); writes profile.json beside schema.yaml")
    g.add_argument("--rows", type=int, help="total rows (train + valid); required without --profile, which has "
                                            "its own default")
    g.add_argument("--tables", type=int, help="sparse features/tables (default 26)")
    g.add_argument("--zipf", type=float, help="Zipf exponent of id popularity (default 1.1)")
    g.add_argument("--multi-hot", action="store_true", help="variable-length id lists instead of one id per row")
    g.add_argument("--pooling", type=float, default=8.0, help="mean ids per bag with --multi-hot (default 8)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--scale", type=int, help="divide Criteo 1TB cardinalities by this (default 1000)")
    g.add_argument("--valid-fraction", type=float, default=0.1)
    g.add_argument("--sequence-length", type=int, default=0,
                   help="add a user-history column H1 (sequence feature, target C1) keeping this many recent "
                        "items (default 0: none; docs/sequence.md)")
    g.add_argument("--second-label", action="store_true",
                   help="add a second label column 'like' (a second task, learnable from other tables than the "
                        "first label's; docs/api.md, multi-task)")


#: gen-data options a profile fixes, with their values without one
_SHAPE_DEFAULTS = {"tables": 26, "zipf": 1.1, "scale": 1000}


def gen_data_main(args: argparse.Namespace) -> int:
    from rayemb.data.profiles import PROFILE_JSON, generate_profile, get_profile
    from rayemb.data.synthetic import SyntheticSpec, generate, log_progress
    from rayemb.errors import DataError

    common = dict(multi_hot=args.multi_hot, mean_pooling=args.pooling, valid_fraction=args.valid_fraction,
                  sequence_length=args.sequence_length, second_label=args.second_label)
    note = ""
    if args.profile:
        fixed = [f"--{k}" for k in _SHAPE_DEFAULTS if getattr(args, k) is not None]
        if fixed:
            raise DataError(f"--profile {args.profile} fixes the tables' shape; drop {' '.join(fixed)}, or drop "
                            "--profile to choose the shape yourself.")
        rows = get_profile(args.profile).default_rows if args.rows is None else args.rows
        schema = generate_profile(args.profile, args.out, rows=rows, seed=args.seed, progress=log_progress(),
                                  **common)
        note = f"; profile {args.profile}, its tables' Zipf exponents in {PROFILE_JSON}"
    else:
        if args.rows is None:
            raise DataError("gen-data needs --rows N (total rows, train + valid), or --profile NAME, which has its "
                            "own default.")
        shape = {k: v if getattr(args, k) is None else getattr(args, k) for k, v in _SHAPE_DEFAULTS.items()}
        spec = SyntheticSpec(rows=args.rows, num_tables=shape["tables"], zipf_alpha=shape["zipf"], seed=args.seed,
                             scale=shape["scale"], **common)
        stale = os.path.join(args.out, PROFILE_JSON)
        if os.path.exists(stale):  # an earlier profile's record would describe data it no longer matches
            os.remove(stale)
        schema = generate(spec, args.out, progress=log_progress())
        rows = args.rows
    sizes = [f.num_embeddings for f in schema.sparse]
    history = f", history column {schema.sequence[0].name}" if schema.sequence else ""
    print(f"gen-data: wrote {rows:,} rows, {len(sizes)} tables ({min(sizes):,}..{max(sizes):,} rows){history} "
          f"to {args.out}{note}")
    return 0


def train_main(args: argparse.Namespace) -> int:
    from rayemb.api import EmbeddingTrainer
    from rayemb.config import load_config

    overrides = list(args.set or [])
    if args.resume_from:
        overrides.append(f"train.resume_from={args.resume_from}")
    cfg = load_config(args.config, overrides)
    if not args.sweep:
        result = EmbeddingTrainer.from_config(cfg).fit(new_run=args.new_run)
        print_result(result)
        if args.result_json:
            write_result_json(result, args.result_json)
        return 0

    import time

    from rayemb.cli.sweep import print_sweep
    from rayemb.sweep.engine import run_sweep
    from rayemb.tracking.sweep import grid_space

    # each `train --sweep` is a new sweep: the same command again runs the grid again, as a plain job does not
    result = run_sweep(args.config, grid_space(args.sweep), overrides=overrides, scheduler="fifo",
                       metric=cfg.train.early_stopping_metric or "valid_auc",
                       name=f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    print_sweep(result)
    return 0 if result.trials and all(t["status"] == "FINISHED" for t in result.trials) else 1


def write_result_json(result, path: str) -> None:
    """The job's outcome as JSON for scripts: run id, status, wall time, final metrics, placements."""
    import json

    doc = {"run_id": result.run_id, "status": result.status, "wall_time_s": result.wall_time_s,
           "tracking_uri": redact_uri(result.tracking_uri), "best_checkpoint": redact_uri(result.best_checkpoint),
           "last_checkpoint": redact_uri(result.last_checkpoint),
           "metrics": result.metrics,
           "placements": {t: v["placement"] for t, v in result.plan.get("tables", {}).items()},
           "predicted_step_time_s": result.plan.get("predicted_step_time_s"),  # the step-time model's
           "probed_step_time_s": result.plan.get("probed_step_time_s")}  # the plan probe's (None: it did not run)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True, default=str)


def print_result(result) -> None:
    """The lines a user reads at the end of a job: outcome, best epoch, checkpoint, where the run is."""
    from rayemb.train.worker.metrics import primary_metric, secondary_metric

    m = result.metrics
    nan = float("nan")
    metric = primary_metric(m)
    best, best_epoch = m.get(f"best_{metric}", m.get(metric, nan)), int(m.get("best_epoch", m.get("epoch", 0)))
    second = secondary_metric(metric)
    print(
        f"rayemb: run {result.run_id} {result.status} in {result.wall_time_s:.0f}s; "
        f"best_{metric}={best:.4f} (epoch {best_epoch + 1}); last epoch {metric}={m.get(metric, nan):.4f} "
        f"{second}={m.get(second, nan):.4f}"
    )
    if result.best_checkpoint:
        print(f"rayemb: best checkpoint: {redact_uri(result.best_checkpoint)}")
    if result.last_checkpoint:
        print(f"rayemb: last checkpoint: {redact_uri(result.last_checkpoint)}  (continue with --resume-from, export "
              "with `rayemb checkpoint export`)")
    uri = redact_uri(result.tracking_uri)
    print(f"rayemb: MLflow store: {uri}")
    print(f"rayemb: browse it with:  mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000")


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML job config, e.g. jobs/configs/synth_small.yaml")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable)")
    p.add_argument("--sweep", action="append", metavar="KEY=V1,V2,...",
                   help="run one job per value (per point of the grid of several --sweep) as child runs of one "
                        "parent MLflow run: `rayemb sweep` with a grid space and the fifo scheduler")
    p.add_argument("--resume-from", metavar="CHECKPOINT",
                   help="continue from a checkpoint of an earlier job: a path or a URI such as s3://bucket/... "
                        "(any world size; same as train.resume_from)")
    p.add_argument("--new-run", action="store_true",
                   help="start a new run of the job even when its last run is unfinished (which rerunning the same "
                        "command continues) or finished (which it returns as it is)")
    p.add_argument("--result-json", metavar="PATH",
                   help="also write the job's outcome (run id, status, final metrics, placements) as JSON")


