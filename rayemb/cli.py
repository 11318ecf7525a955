"""The ``rayemb`` console script: gen-data, stats, plan, train, compare.

Every command has ``--help`` with an example. User errors exit non-zero with a
one-paragraph message (no traceback); ``RAYEMB_DEBUG=1`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Callable, List, Optional, Sequence

from rayemb.errors import RayembError

EXAMPLES = {
    "gen-data": "rayemb gen-data --out data/synth_small --rows 400000 --zipf 1.1",
    "stats": "rayemb stats --data data/synth_small --out stats.json",
    "plan": "rayemb plan --config jobs/configs/synth_small.yaml --world-size 64 --gpus-per-node 8 --hbm-gib 80 --out plan.json",
    "train": "rayemb train --config jobs/configs/synth_small.yaml --set train.epochs=2",
    "compare": "rayemb compare --experiment rayemb-synth-small --metric valid_auc --out compare/",
}

# Commands implemented elsewhere: (module, add-arguments function, main function).
_EXTERNAL = {
    "stats": ("rayemb.data.stats", "add_stats_arguments", "stats_main", "Per-table statistics of a dataset (stats.json)."),
    "plan": ("rayemb.planner.planner", "add_plan_arguments", "plan_main", "Sharding plan for the live or a described cluster."),
    "compare": ("rayemb.tracking.compare", "add_compare_arguments", "compare_main", "Compare MLflow runs: table + PNG charts."),
}


def _gen_data(args: argparse.Namespace) -> int:
    from rayemb.data.synthetic import SyntheticSpec, generate, log_progress

    spec = SyntheticSpec(
        rows=args.rows, num_tables=args.tables, zipf_alpha=args.zipf, multi_hot=args.multi_hot,
        mean_pooling=args.pooling, seed=args.seed, scale=args.scale, valid_fraction=args.valid_fraction,
    )
    schema = generate(spec, args.out, progress=log_progress())
    sizes = [f.num_embeddings for f in schema.sparse]
    print(f"gen-data: wrote {args.rows:,} rows, {len(sizes)} tables ({min(sizes):,}..{max(sizes):,} rows) to {args.out}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from rayemb.config import load_config
    from rayemb.train.trainer import run_training

    cfg = load_config(args.config, args.set or [])
    if not args.sweep:
        result = run_training(cfg)
        _print_result(result)
        return 0

    from rayemb.config import resolve_path
    from rayemb.tracking.mlflow import default_tracking_uri, ensure_store
    from rayemb.tracking.sweep import run_sweep

    def run_one(overrides: List[str], parent_run_id: str) -> int:
        try:
            result = run_training(load_config(args.config, overrides), parent_run_id=parent_run_id)
        except RayembError as e:  # keep the sweep going; the parent run ends FAILED
            print(f"rayemb: error: {e}", file=sys.stderr)
            return e.exit_code
        _print_result(result)
        return 0 if result.status == "FINISHED" else 1

    uri = cfg.tracking.tracking_uri or default_tracking_uri(resolve_path(cfg.tracking.output_dir))
    ensure_store(uri)
    return run_sweep(args.set or [], args.sweep, run_one, uri, cfg.tracking.experiment)


def _print_result(result) -> None:
    from rayemb.logs import redact_uri

    m = result.metrics
    nan = float("nan")
    best, best_epoch = m.get("best_valid_auc", m.get("valid_auc", nan)), int(m.get("best_epoch", m.get("epoch", 0)))
    print(
        f"rayemb: run {result.run_id} {result.status} in {result.wall_time_s:.0f}s; "
        f"best_valid_auc={best:.4f} (epoch {best_epoch + 1}); last epoch valid_auc={m.get('valid_auc', nan):.4f} "
        f"valid_logloss={m.get('valid_logloss', nan):.4f}"
    )
    if result.best_checkpoint:
        print(f"rayemb: best checkpoint: {result.best_checkpoint}")
    uri = redact_uri(result.tracking_uri)
    print(f"rayemb: MLflow store: {uri}")
    print(f"rayemb: browse it with:  mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000")


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML job config, e.g. jobs/configs/synth_small.yaml")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable)")
    p.add_argument("--sweep", action="append", metavar="KEY=V1,V2,...",
                   help="run one job per value as child runs of one parent MLflow run")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rayemb",
        description="Hybrid data/model-parallel TorchRec embedding training on Ray, tracked in MLflow.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, epilog=f"example:\n  {EXAMPLES[name]}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    g = add("gen-data", "Generate a Criteo-shaped synthetic parquet dataset with a learnable label.")
    g.add_argument("--out", required=True, help="output directory (parquet splits + schema.yaml)")
    g.add_argument("--rows", required=True, type=int, help="total rows (train + valid)")
    g.add_argument("--tables", type=int, default=26, help="sparse features/tables (default 26)")
    g.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of id popularity (default 1.1)")
    g.add_argument("--multi-hot", action="store_true", help="variable-length id lists instead of one id per row")
    g.add_argument("--pooling", type=float, default=8.0, help="mean ids per bag with --multi-hot (default 8)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--scale", type=int, default=1000, help="divide Criteo 1TB cardinalities by this (default 1000)")
    g.add_argument("--valid-fraction", type=float, default=0.1)
    g.set_defaults(func=_gen_data)

    t = add("train", "Train a job config on the Ray cluster (same as jobs/train.py).")
    add_train_arguments(t)
    t.set_defaults(func=_train)

    for name, (module, add_args, main_fn, help_) in _EXTERNAL.items():
        p = add(name, help_)
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            p.set_defaults(func=_unavailable(name, e))
            continue
        getattr(mod, add_args)(p)
        p.set_defaults(func=getattr(mod, main_fn))
    return parser


def _unavailable(name: str, err: Exception) -> Callable[[argparse.Namespace], int]:
    def run(_: argparse.Namespace) -> int:
        raise RayembError(f"`rayemb {name}` cannot run here: {err}. Reinstall with `make install`.")

    return run


def run_cli(argv: Optional[Sequence[str]], parser: argparse.ArgumentParser) -> int:
    from rayemb.logs import quiet_third_party_logs

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    quiet_third_party_logs()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except RayembError as e:
        if os.environ.get("RAYEMB_DEBUG"):
            raise
        from rayemb.logs import redact_text

        print(f"rayemb: error: {redact_text(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("rayemb: interrupted", file=sys.stderr)
        return 130


def main(argv: Optional[List[str]] = None) -> int:
    return run_cli(argv, build_parser())


if __name__ == "__main__":
    sys.exit(main())
