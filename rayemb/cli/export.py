"""``rayemb export``: a finished job's checkpoint as an unsharded inference model, logged to MLflow (and registered).

The library side is :mod:`rayemb.serve.export`; docs/serving.md walks through it.
"""

from __future__ import annotations

import argparse

from rayemb.constants import TRACKING_URI_ENV_VAR


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("what to export (one of)")
    src.add_argument("--run-id", help="the training job's MLflow run (its checkpoint tags, config.yaml and metrics)")
    src.add_argument("--checkpoint", help="a checkpoint directory (with --config: the job config that trained it)")
    p.add_argument("--config", help="job YAML of --checkpoint (model shape, data.path of the schema, id policy)")
    p.add_argument("--checkpoint-kind", choices=("best", "last"), default="best",
                   help="with --run-id: the retained checkpoint with the best valid_auc (default) or the newest")
    p.add_argument("--out", required=True, help="new directory for model.pt + model.json (must not exist or be empty); "
                                              "a local path or a URI (s3://, gs://, hdfs://)")
    p.add_argument("--register", metavar="NAME", help="also register the logged model as a new version of NAME")
    p.add_argument("--experiment", help="with --checkpoint: experiment of the run made for the export "
                                        "(default: the config's tracking.experiment)")
    p.add_argument("--tracking-uri", help=f"MLflow store: a URI or an mlflow.db path (default: "
                                          f"${TRACKING_URI_ENV_VAR}, else runs/mlflow.db; with --checkpoint: the "
                                          "config's store)")


def export_main(args: argparse.Namespace) -> int:
    from rayemb.errors import ConfigError
    from rayemb.logs import redact_uri
    from rayemb.serve.export import check_out, export_model, source_from_checkpoint, source_from_run

    if bool(args.run_id) == bool(args.checkpoint):
        raise ConfigError("Name what to export with exactly one of --run-id ID (a training run) or --checkpoint PATH "
                          "--config job.yaml.", category="invalid_arguments")
    if args.checkpoint and not args.config:
        raise ConfigError("--checkpoint needs --config: the job YAML that trained it (model shape, the dataset's "
                          "schema.yaml at data.path, id policy).", category="invalid_arguments")
    check_out(args.out)
    if args.run_id:
        from rayemb.tracking.compare import resolve_tracking_uri

        source = source_from_run(args.run_id, resolve_tracking_uri(args.tracking_uri), args.checkpoint_kind)
    else:
        uri = args.tracking_uri
        if uri:
            from rayemb.tracking.store import sqlite_uri

            uri = uri if "://" in uri or uri.startswith("sqlite:") else sqlite_uri(uri)
        source = source_from_checkpoint(args.checkpoint, args.config, uri, args.experiment)
    print(f"rayemb export: checkpoint {redact_uri(source.checkpoint)} (step {source.meta.get('step')}, epoch "
          f"{source.meta.get('epoch')}, {len(source.schema.sparse)} tables)", flush=True)
    s = export_model(source, args.out, register=args.register)
    auc = s["metrics"].get("valid_auc")
    print(f"rayemb export: {s['tables']} tables, {s['bytes'] / 2**20:,.1f} MiB -> {redact_uri(s['out'])} in "
          f"{s['seconds']:.1f}s"
          + (f"; valid_auc {auc:.5f} at this checkpoint" if auc is not None else ""))
    print(f"rayemb export: MLflow model {s['model_uri']} ({s['runs_uri']}) at {redact_uri(source.tracking_uri)}")
    if s["version"] is not None:
        print(f"rayemb export: registered models:/{s['registered']}/{s['version']}")
    if s["item_feature"]:
        print(f"rayemb export: retrieval model (item feature {s['item_feature']!r}): outputs "
              f"{', '.join(s['outputs'])}; the catalogue's item vectors are in items.parquet")
    else:
        print(f"rayemb export: prediction column(s) {', '.join(s['outputs'])}")
    print(f"score data with: rayemb predict --model {redact_uri(s['out'])} --data DATA_DIR --out PREDICTIONS_DIR"
          + (f" [--output {'|'.join(s['outputs'])}]" if s["item_feature"] else ""))
    return 0
