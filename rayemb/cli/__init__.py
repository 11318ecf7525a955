"""The ``rayemb`` console script: every command line of the project lives in this package.

Each command is a thin layer over library functions, in a module of its own:
``gen-data`` and ``train`` (:mod:`rayemb.cli.train`, also ``jobs/train.py``),
``stats`` (:mod:`rayemb.cli.stats`), ``schema infer`` (:mod:`rayemb.cli.schema`),
``plan`` (:mod:`rayemb.cli.plan`) and ``compare`` (:mod:`rayemb.cli.compare`), ``convert`` (:mod:`rayemb.cli.convert`),
``sweep`` (:mod:`rayemb.cli.sweep`),
``export`` (:mod:`rayemb.cli.export`), ``predict`` (:mod:`rayemb.cli.predict`) and ``checkpoint``
(:mod:`rayemb.cli.checkpoint`). Every command has ``--help`` with an example. User errors exit with code 2 and
one paragraph naming the input and the fix (no traceback; ``RAYEMB_DEBUG=1`` shows it), credentials in URIs redacted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import List, Optional, Sequence

from rayemb.errors import RayembError

#: name -> (module, add-arguments function, main function, help, example)
COMMANDS = {
    "gen-data": ("rayemb.cli.train", "add_gen_data_arguments", "gen_data_main",
                 "Generate a Criteo-shaped synthetic parquet dataset with a learnable label, or a named workload.",
                 "rayemb gen-data --out data/synth_small --rows 400000 --zipf 1.1\n"
                 "  rayemb gen-data --profile criteo-1tb-scaled --out data/criteo_1tb_scaled"),
    "stats": ("rayemb.cli.stats", "add_stats_arguments", "stats_main",
              "Per-table statistics of a dataset (stats.json).",
              "rayemb stats --data data/synth_small --out stats.json"),
    "schema": ("rayemb.cli.schema", "add_schema_arguments", "schema_main",
               "Infer schema.yaml for a dataset of your own parquet files (train/, valid/).",
               "rayemb schema infer data/clicks --label click --exclude request_id"),
    "plan": ("rayemb.cli.plan", "add_plan_arguments", "plan_main",
             "Sharding plan for the live or a described cluster.",
             "rayemb plan --config jobs/configs/synth_small.yaml --world-size 64 --gpus-per-node 8 --hbm-gib 80 "
             "--out plan.json"),
    "train": ("rayemb.cli.train", "add_train_arguments", "train_main",
              "Train a job config on the Ray cluster (same as jobs/train.py).",
              "rayemb train --config jobs/configs/synth_small.yaml --set train.epochs=2"),
    "sweep": ("rayemb.cli.sweep", "add_sweep_arguments", "sweep_main",
              "Search a job config over a space of config values with Ray Tune (trials as MLflow child runs).",
              "rayemb sweep --config jobs/configs/synth_small.yaml --space space.yaml --num-samples 4"),
    "checkpoint": ("rayemb.cli.checkpoint", "add_checkpoint_arguments", "checkpoint_main",
                   "Export a checkpoint to one unsharded file, reshard it for another world size, or show it.",
                   "rayemb checkpoint export --checkpoint runs/.../checkpoint_2026-... --out model.pt"),
    "convert": ("rayemb.cli.convert", "add_convert_arguments", "convert_main",
                "Convert Criteo, Avazu or MovieLens files into a dataset rayemb trains on (parquet + schema.yaml).",
                "rayemb convert criteo --input day_0 day_1 --out data/criteo --hash-buckets 1000000"),
    "export": ("rayemb.cli.export", "add_export_arguments", "export_main",
               "Export a trained job as an unsharded inference model, logged to MLflow (optionally registered).",
               "rayemb export --run-id 0123abcd --out models/criteo --register criteo-dlrm"),
    "predict": ("rayemb.cli.predict", "add_predict_arguments", "predict_main",
                "Score a parquet dataset with an exported model (Ray Data batch inference).",
                "rayemb predict --model models/criteo --data data/criteo/valid --out preds/"),
    "compare": ("rayemb.cli.compare", "add_compare_arguments", "compare_main",
                "Compare MLflow runs: table + PNG charts.",
                "rayemb compare --experiment rayemb-synth-small --metric valid_auc --out compare/"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rayemb",
        description="Hybrid data/model-parallel TorchRec embedding training on Ray, tracked in MLflow.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, add_args, main_fn, help_, example) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_, epilog=f"example:\n  {example}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod = importlib.import_module(module)
        getattr(mod, add_args)(p)
        p.set_defaults(func=getattr(mod, main_fn))
    return parser


def run_cli(argv: Optional[Sequence[str]], parser: argparse.ArgumentParser) -> int:
    """Parses ``argv`` and runs the chosen command; a :class:`RayembError` becomes one paragraph and its exit code."""
    from rayemb.logs import quiet_third_party_logs, redact_text

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
        print(f"rayemb: error: {redact_text(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("rayemb: interrupted", file=sys.stderr)
        return 130


def main(argv: Optional[List[str]] = None) -> int:
    return run_cli(argv, build_parser())


__all__ = ["main", "run_cli", "build_parser", "COMMANDS"]
