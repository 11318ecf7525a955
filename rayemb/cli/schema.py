"""``rayemb schema infer DATA``: a schema.yaml for one's own parquet files, so they train without writing one.

``DATA`` holds ``train/*.parquet`` and ``valid/*.parquet``; a local path or a URI (docs/storage.md). The rules
are :mod:`rayemb.data.infer`'s (docs/data.md, "Your own parquet"). A published dataset (docs/storage.md) is never
changed in place: schema.yaml goes into a new version of it, the other files copied on the store, and the marker
switches to it once complete::

    rayemb schema infer s3://bucket/clicks --label click --exclude request_id
"""

from __future__ import annotations

import argparse


def add_schema_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    i = sub.add_parser("infer", help="infer schema.yaml from the parquet files of DATA/train and DATA/valid",
                       description="Infer schema.yaml from DATA/train/*.parquet and DATA/valid/*.parquet: float and "
                                   "bool columns dense, integer and string columns (and lists of them) sparse, "
                                   "each sparse table encoded or raw by its ids (docs/data.md).")
    i.add_argument("data", metavar="DATA", help="dataset directory (train/, valid/); a path or a URI")
    i.add_argument("--label", action="append", metavar="COL",
                   help="the label column (default: the column named label); repeat it for one task per label")
    i.add_argument("--exclude", action="extend", nargs="+", default=[], metavar="COL",
                   help="columns to leave out of the schema (ids unique per row, leaks of the label ...)")
    i.add_argument("--out", default=None, help="schema.yaml to write (default: DATA/schema.yaml)")
    i.add_argument("--force", action="store_true", help="replace an existing schema.yaml")


def schema_main(args: argparse.Namespace) -> int:
    """Infers, prints the schema and each column's rule, writes it. User errors propagate as DataError."""
    from rayemb.data.infer import check_output, default_output, infer_schema, write_inferred
    from rayemb.logs import redact_uri
    from rayemb.publish import resolve, resolve_dataset

    data = resolve_dataset(args.data)  # a published dataset: the version its marker names, which training reads
    out = args.out or default_output(data)
    check_output(resolve(out), args.force)  # --out under a published dataset: the file of its version
    inferred = infer_schema(data, labels=args.label, exclude=args.exclude)
    print(inferred.yaml_text(), end="")
    for note in inferred.notes:
        print(f"note: {note}")
    written = write_inferred(inferred, out)
    s = inferred.schema
    print(f"wrote {redact_uri(written)}: {len(s.labels)} label(s), {len(s.dense)} dense, {len(s.sparse)} sparse "
          f"({sum(f.ids == 'raw' for f in s.sparse)} raw-id) columns")
    return 0


__all__ = ["add_schema_arguments", "schema_main"]
