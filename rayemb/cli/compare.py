"""``rayemb compare``: runs of an experiment, or the trials of a sweep, side by side — a table, CSV, Markdown and
PNG charts."""

from __future__ import annotations

import argparse
import os
import sys

from rayemb.constants import TRACKING_URI_ENV_VAR
from rayemb.errors import TrackingError
from rayemb.tracking.compare import (COMPARISON_RUN_NAME, CSV_FILE, DEFAULT_MAX_RUNS, DEFAULT_METRICS, MARKDOWN_FILE,
                                     build_comparison, resolve_tracking_uri, write_charts)
from rayemb.tracking.run_logger import RunLogger
from rayemb.tracking.tags import TAG_KIND


def add_compare_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the ``rayemb compare`` options to ``parser`` (the CLI calls :func:`compare_main` with the result)."""
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--experiment", help="MLflow experiment name: compare its runs")
    what.add_argument("--sweep", metavar="PARENT_RUN_ID",
                      help="a `rayemb sweep` parent run: its trials, best first, with the metric against each "
                           "swept key and a parallel-coordinates chart")
    parser.add_argument("--filter", default="",
                        help="MLflow search filter, e.g. \"params.`model.embedding_dim` = '16'\" or "
                             "\"metrics.`param.train.epochs` >= 2\" (numeric settings are also metrics param.<key>)")
    parser.add_argument("--metric", dest="metrics", action="extend", nargs="+", default=None, metavar="NAME",
                        help="metric(s) to compare, final value and curve (repeatable; "
                             f"default: {' '.join(DEFAULT_METRICS)})")
    parser.add_argument("--param", default=None,
                        help="param for the final-metric-vs-param chart (default: the differing param, if only one)")
    parser.add_argument("--out", default=None,
                        help="output folder for the CSV, Markdown and PNG charts (required with --experiment; with "
                             "--sweep default: sweep-<first 8 characters of the id>)")
    parser.add_argument("--log-run", action="store_true",
                        help=f"also log the outputs as a run named '{COMPARISON_RUN_NAME}'")
    parser.add_argument("--tracking-uri", default=None,
                        help=f"MLflow tracking URI or path of an mlflow.db (default: ${TRACKING_URI_ENV_VAR}, "
                             "else runs/mlflow.db of the workspace)")
    parser.add_argument("--max-runs", type=int, default=DEFAULT_MAX_RUNS,
                        help="compare at most the newest this many runs")
    return parser


def compare_main(args: argparse.Namespace) -> int:
    """Runs ``rayemb compare``; returns the exit code. User mistakes raise :class:`TrackingError`."""
    from mlflow import MlflowClient

    if args.sweep:
        return _compare_sweep(args)
    if not args.out:
        raise TrackingError("`rayemb compare --experiment` needs --out DIR: the folder for compare.csv, compare.md "
                            "and the charts.", category="invalid_arguments")
    uri = resolve_tracking_uri(args.tracking_uri)
    client = MlflowClient(uri)
    metrics = list(dict.fromkeys(args.metrics or DEFAULT_METRICS))
    comp = build_comparison(client, args.experiment, args.filter or "", metrics, args.max_runs)

    param = args.param
    all_params = {k for p in comp.params for k in p}
    if param is not None and param not in all_params:
        raise TrackingError(
            f"--param {param!r} is not a param of any compared run. Params that differ between these runs: "
            f"{', '.join(comp.differing_params) or 'none'}; pass one of them (flattened config keys such as "
            "model.embedding_dim).",
            category="invalid_input",
        )
    if param is None and len(comp.differing_params) == 1:
        param = comp.differing_params[0]

    os.makedirs(args.out, exist_ok=True)
    text = comp.to_text()
    print(f"{len(comp.run_ids)} runs of experiment {args.experiment!r}; "
          f"{len(comp.differing_params)} params differ, {comp.equal_params} are equal (not shown)")
    print(text)
    outputs = [comp.write_csv(os.path.join(args.out, CSV_FILE))]
    md_path = os.path.join(args.out, MARKDOWN_FILE)
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(f"# Comparison of {len(comp.run_ids)} runs of `{args.experiment}`\n\n")
        if args.filter:
            f.write(f"Filter: `{args.filter}`\n\n")
        f.write(comp.to_markdown())
    outputs.append(md_path)
    outputs += write_charts(client, comp, args.out, param)
    for p in outputs:
        print(f"wrote {p}")

    if args.log_run:
        rl = RunLogger(uri, args.experiment, run_name=COMPARISON_RUN_NAME,
                       tags={TAG_KIND: "comparison", "rayemb.compared_runs": ",".join(comp.run_ids)},
                       system_metrics_interval_s=None).start()
        rl.log_params({"filter": args.filter or "", "metrics": ",".join(comp.metric_keys), "param": param or "",
                       "num_runs": len(comp.run_ids)})
        for p in outputs:
            rl.log_artifact(p)
        if not rl.finish():
            print(f"could not log the comparison run to {rl.shown_uri}; the outputs are in {args.out}", file=sys.stderr)
            return 1
        print(f"logged comparison run {rl.run_id}")
    return 0


def _compare_sweep(args: argparse.Namespace) -> int:
    from mlflow import MlflowClient

    from rayemb.tracking.sweep_report import load_sweep, write_report

    given = [flag for flag, value in (("--filter", args.filter), ("--metric", args.metrics), ("--param", args.param),
                                      ("--log-run", args.log_run)) if value]
    if given:
        raise TrackingError(f"{', '.join(given)} do(es) not apply to --sweep: a sweep is compared on the metric and "
                            "keys its parent run names. Drop them, or compare runs with --experiment.",
                            category="invalid_arguments")
    report = load_sweep(MlflowClient(resolve_tracking_uri(args.tracking_uri)), args.sweep)
    out = args.out or f"sweep-{args.sweep[:8]}"
    paths = write_report(report, out)
    best = report.best
    print(f"sweep {report.parent_run_id}: {len(report.trials)} trials over {', '.join(report.keys)}, "
          f"{report.metric} ({report.mode}); "
          + (f"best {best.metric:.4f} by run {best.run_id}" if best else "no finished trial logged it"))
    print(report.to_markdown())
    for p in paths:
        print(f"wrote {p}")
    return 0
