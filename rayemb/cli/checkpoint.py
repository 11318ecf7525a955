"""``rayemb checkpoint export|reshard|show``: what a user does with a job's logical checkpoint.

``--checkpoint`` and ``--out`` take local paths or URIs (a job whose ``tracking.output_dir``
is ``s3://bucket/runs`` prints its checkpoints as ``s3://...``)::

    rayemb checkpoint show --checkpoint s3://bucket/runs/ray_results/<job>/checkpoint_2026-01-01_00-00-00.000000
    rayemb checkpoint export --checkpoint s3://bucket/runs/ray_results/<job>/checkpoint_... --out model.pt
"""

from __future__ import annotations

import argparse
import json


def add_checkpoint_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    e = sub.add_parser("export", help="one unsharded file: a [num_embeddings, dim] tensor per table, optimizer "
                                      "state, dense weights (torch.load(..., weights_only=True))")
    e.add_argument("--checkpoint", required=True,
                   help="a checkpoint directory or URI, e.g. s3://bucket/... (rayemb train prints its last)")
    e.add_argument("--out", required=True, help="output file (a path or a URI), e.g. model.pt")
    r = sub.add_parser("reshard", help="rewrite a checkpoint for another world size (any plan loads either)")
    r.add_argument("--checkpoint", required=True)
    r.add_argument("--world-size", required=True, type=int)
    r.add_argument("--plan", help="plan.json of the job that will load it (recorded; its tables are checked)")
    r.add_argument("--out", required=True, help="new checkpoint directory (must not exist)")
    s = sub.add_parser("show", help="a checkpoint's meta.json summary, after checking every file's size and hash")
    s.add_argument("--checkpoint", required=True)


def checkpoint_main(args: argparse.Namespace) -> int:
    from rayemb.logs import redact_uri

    if args.action == "export":
        from rayemb.checkpoint.export import export_checkpoint

        summary = export_checkpoint(args.checkpoint, args.out)
        print(f"checkpoint export: {summary['tables']} tables, {summary['dense_tensors']} dense tensors, step "
              f"{summary['step']} -> {summary['out']} ({summary['bytes'] / 2**20:,.1f} MiB)")
        return 0
    if args.action == "reshard":
        from rayemb.checkpoint.export import reshard_checkpoint

        meta = reshard_checkpoint(args.checkpoint, args.world_size, args.out, args.plan)
        print(f"checkpoint reshard: {redact_uri(args.checkpoint)} ({meta['resharded_from']['world_size']} ranks) -> "
              f"{redact_uri(args.out)} ({meta['world_size']} ranks, {len(meta['tables'])} tables)")
        return 0
    from rayemb.checkpoint.meta import CheckpointMeta
    from rayemb.checkpoint.reader import verify

    meta = verify(args.checkpoint)
    written = CheckpointMeta.from_dict(meta, shown=f"Checkpoint {redact_uri(args.checkpoint)!r}").to_dict()
    keys = ("epoch", "step", "epoch_complete", "epoch_samples", "plan_fingerprint", "best_valid_auc",
            "best_valid_hit_rate_at_50")
    print(json.dumps({"format": meta.get("format"), "world_size": meta.get("world_size"),
                      **{k: written.get(k) for k in keys}, "states": meta.get("states"), "tables": len(meta["tables"]),
                      "table_dtypes": sorted({t.get("dtype", "fp32") for t in meta["tables"].values()}),
                      "bytes": sum(f["bytes"] for f in meta["files"].values())}, indent=1))
    return 0
