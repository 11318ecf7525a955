"""``rayemb sweep``: a job config searched over a space by Ray Tune (:mod:`rayemb.sweep.engine`)."""

from __future__ import annotations

import argparse
import os


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML job config, e.g. jobs/configs/synth_small.yaml")
    p.add_argument("--space", required=True,
                   help="YAML mapping of config keys to {grid|choice: [...]} or {uniform|loguniform|randint: [lo, hi]}")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable)")
    p.add_argument("--num-samples", type=int, default=1,
                   help="trials per grid point (each samples the other keys; default 1)")
    p.add_argument("--max-concurrent", type=int,
                   help="trials at once (default: as many as the cluster's CPUs hold, leaving CPUs for data reads)")
    p.add_argument("--scheduler", default="asha", help="asha (stop trials below the median at each rung, the "
                                                       "default) or fifo (run every trial to its end)")
    p.add_argument("--search", default="random", help="random (grid and random sampling, the default) or optuna")
    p.add_argument("--metric", default="valid_auc", help="the validation metric searched on (default valid_auc)")
    p.add_argument("--mode", help="max or min (default: the metric's own direction)")
    p.add_argument("--name", help="the sweep's name: its folder under tracking.output_dir/sweeps (default: the "
                                  "job's name)")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep of this name whose driver died, in its parent MLflow run")
    p.add_argument("--export-best", metavar="NAME",
                   help="at the end, export the best trial's model and register it as a version of model NAME")


def sweep_main(args: argparse.Namespace) -> int:
    from rayemb.sweep.engine import run_sweep

    space_text = None
    if os.path.isfile(args.space):
        with open(args.space) as f:
            space_text = f.read()
    result = run_sweep(args.config, args.space, overrides=list(args.set or []), metric=args.metric, mode=args.mode,
                       num_samples=args.num_samples, scheduler=args.scheduler, search=args.search,
                       max_concurrent=args.max_concurrent, name=args.name, resume=args.resume, space_text=space_text)
    print_sweep(result)
    if args.export_best and result.best_run_id is not None:
        from rayemb.sweep.best import export_best

        summary = export_best(result.parent_run_id, args.export_best, result.tracking_uri)
        print(f"rayemb: best trial's model registered as {args.export_best} version {summary.get('version')} "
              f"(run {summary.get('run_id')})")
    return 0 if result.best_run_id is not None else 1


def print_sweep(result) -> None:
    from rayemb.logs import redact_uri

    for t in result.trials:
        value = "-" if t["value"] is None else f"{t['value']:.4f}"
        print(f"rayemb: trial {t['trial_id']} {t['status']} {result.metric}={value} run {t['run_id'] or '-'}"
              + (f": {t['error']}" if t.get("error") else ""))
    if result.best_run_id is None:
        print(f"rayemb: sweep ended with no trial reporting {result.metric} (parent run {result.parent_run_id})")
    else:
        print(f"rayemb: best {result.metric}={result.best_value:.4f}: run {result.best_run_id} (parent run "
              f"{result.parent_run_id})")
    print(f"rayemb: MLflow store: {redact_uri(result.tracking_uri)}; sweep folder: {result.folder}")
