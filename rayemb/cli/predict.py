"""``rayemb predict``: score parquet with an exported model (Ray Data batch inference); see docs/serving.md.

The library side is :mod:`rayemb.serve.predict`.
"""

from __future__ import annotations

import argparse

from rayemb.constants import TRACKING_URI_ENV_VAR


def add_predict_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True,
                   help="the --out directory of `rayemb export`, or an MLflow URI: models:/NAME/VERSION, "
                        "runs:/ID/model")
    p.add_argument("--data", required=True, help="a parquet file or a directory of them (e.g. a dataset's valid/); "
                                                 "a local path or a URI (s3://, gs://, hdfs://)")
    p.add_argument("--out", required=True, help="new directory for the prediction parquet files (path or URI)")
    p.add_argument("--num-workers", type=int, default=1, help="scoring actors, each holding the model once (default 1)")
    p.add_argument("--use-gpu", action="store_true", help="one GPU per scoring actor")
    p.add_argument("--batch-size", type=int, default=4096, help="rows per scored batch (default 4096)")
    p.add_argument("--keep-columns", default="",
                   help="comma-separated input columns copied to the output (e.g. an id); the label is kept "
                        "when present")
    p.add_argument("--output", choices=("score", "user_embedding", "item_embedding"),
                   help="retrieval models only (model.name: two_tower, or a model naming an item_feature): the pair "
                        "score (default), the rows' user vectors, or their items' vectors (list<float> columns)")
    p.add_argument("--tracking-uri", help=f"MLflow store of an MLflow --model URI (default: ${TRACKING_URI_ENV_VAR}, "
                                          "else runs/mlflow.db)")


def predict_main(args: argparse.Namespace) -> int:
    import tempfile

    from rayemb.logs import redact_uri
    from rayemb.serve.export import check_out
    from rayemb.serve.mlflow_model import is_mlflow_uri, local_model_dir
    from rayemb.serve.predict import input_files, predict

    check_out(args.out)
    input_files(args.data)
    keep = [c.strip() for c in args.keep_columns.split(",") if c.strip()]
    with tempfile.TemporaryDirectory(prefix="rayemb-model-") as scratch:
        uri = None
        if is_mlflow_uri(args.model):
            from rayemb.tracking.compare import resolve_tracking_uri

            uri = resolve_tracking_uri(args.tracking_uri)
        model_dir, where = local_model_dir(args.model, uri, scratch)
        s = predict(model_dir, args.data, args.out, num_workers=args.num_workers, use_gpu=args.use_gpu,
                    batch_size=args.batch_size, keep_columns=keep, model_source=where, output=args.output)
    print(f"rayemb predict: {s['rows']:,} rows -> {s['files']} file(s) in {redact_uri(s['out'])} "
          f"({', '.join(s['columns'])}); "
          f"{s['seconds']:.1f}s, {s['rows_per_s']:,.0f} rows/s")
    return 0
