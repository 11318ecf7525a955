"""``rayemb stats``: compute a dataset's statistics, write stats.json, print a summary.

``--data`` and ``--out`` take local paths or URIs (``s3://bucket/data``, see docs/storage.md)::

    rayemb stats --data s3://bucket/criteo --out s3://bucket/criteo/stats.json
"""

from __future__ import annotations

import argparse

from rayemb.constants import TRAIN_SPLIT
from rayemb.data.sketches import DEFAULT_NUM_HEAVY_HITTERS
from rayemb.data.stats import compute_stats
from rayemb.data.stats_io import write_stats_json
from rayemb.data.stats_report import format_stats_table, plot_frequencies
from rayemb.logs import redact_uri


def add_stats_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rayemb stats`` (then :func:`stats_main`)."""
    parser.add_argument("--data", required=True, help="dataset directory (schema.yaml, train/, valid/); a path or a URI "
                                                         "(s3://bucket/data)")
    parser.add_argument("--out", required=True, help="stats.json to write (a path or a URI)")
    parser.add_argument("--exact", action="store_true", help="exact counts of every id (small data, slower)")
    parser.add_argument("--split", default=TRAIN_SPLIT, help="which split to scan (default: %(default)s)")
    parser.add_argument(
        "--num-heavy-hitters", type=int, default=DEFAULT_NUM_HEAVY_HITTERS,
        help="Misra-Gries counters per table (default: %(default)s)",
    )
    parser.add_argument("--plot", default=None, help="also write a log-log frequency PNG here")


def stats_main(args: argparse.Namespace) -> int:
    """``rayemb stats --data DIR --out stats.json [--exact]``: computes, writes, prints a summary.

    User errors propagate as :class:`DataError` for the CLI's error handler.
    """
    from rayemb.publish import resolve_dataset

    stats = compute_stats(
        resolve_dataset(args.data),  # a published dataset: the version its marker names
        exact=bool(getattr(args, "exact", False)),
        split=getattr(args, "split", TRAIN_SPLIT),
        num_heavy_hitters=getattr(args, "num_heavy_hitters", DEFAULT_NUM_HEAVY_HITTERS),
        progress=True,
    )
    write_stats_json(stats, args.out)
    print(format_stats_table(stats))
    bad = [n for n, t in stats.tables.items() if t.invalid]
    if bad:
        print(f"warning: out-of-range ids in {bad}; training fails unless data.id_policy is hash or clip")
    if getattr(args, "plot", None):
        plot_frequencies(stats, args.plot)
        print(f"wrote {args.plot}")
    print(f"wrote {redact_uri(args.out)} ({stats.rows:,} rows, {stats.elapsed_s:.1f} s)")
    return 0


__all__ = ["add_stats_arguments", "stats_main"]
