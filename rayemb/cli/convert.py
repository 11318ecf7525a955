"""``rayemb convert criteo|avazu|movielens``: raw click logs -> a dataset ``rayemb train`` reads as is.

Example::

    rayemb convert criteo --input day_0 day_1 day_23 --out data/criteo --hash-buckets 10000000 --valid-days 23
    rayemb convert criteo --input s3://bucket/raw/day_{0..23}.gz --out s3://bucket/criteo --ids raw \
        --capacity 40000000 --valid-days 23 --engine ray --address head:6379
    rayemb train --config jobs/configs/synth_small.yaml --set data.path=data/criteo
"""

from __future__ import annotations

import argparse
from typing import Any, Dict

from rayemb.convert.common import (AUTO_RAY_MIN_BYTES, DEFAULT_BLOCK_SIZE, DEFAULT_MAX_BAD_FRACTION,
                                   DEFAULT_PROGRESS_EVERY_S, DEFAULT_ROWS_PER_FILE, DEFAULT_VALID_FRACTION, ENGINES)


def add_convert_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``rayemb convert`` (then :func:`convert_main`)."""
    from rayemb.convert import FORMATS

    p.add_argument("format", choices=FORMATS, help="input format")
    p.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help="input files (.gz/.bz2 read as such): Criteo train.txt or day_N, Avazu train, "
                        "MovieLens u.data / ratings.dat / ratings.csv")
    p.add_argument("--out", required=True, help="dataset directory to create (schema.yaml, train/, valid/)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    ids = p.add_mutually_exclusive_group()
    ids.add_argument("--hash-buckets", type=int, metavar="N",
                     help="criteo/avazu: id = value mod N (Criteo: int(hex, 16) %% N), N rows per table")
    ids.add_argument("--vocab-from-train", action="store_true",
                     help="criteo/avazu: one extra pass counts the train rows' values; ids by descending "
                          "frequency (0 = most frequent), one out-of-vocabulary id last")
    ids.add_argument("--ids", choices=["raw"],
                     help="criteo: --ids raw keeps each category's value as its id (int(hex, 16) as int64; one "
                          "above 2**63-1 keeps its low 63 bits; empty -> null), no vocabulary pass; schema.yaml marks "
                          "the tables ids: raw with num_embeddings = --capacity")
    p.add_argument("--capacity", type=int, metavar="N",
                   help="--ids raw: num_embeddings (capacity) of every raw table; default: the table's distinct train "
                        "ids + 1, counted while writing (8 bytes per distinct id: give N for large inputs)")
    p.add_argument("--min-count", type=int, default=1, metavar="K",
                   help="vocabulary keeps values seen at least K times in train rows (default: %(default)s)")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--valid-fraction", type=float, metavar="F",
                       help=f"validation rows by a seeded hash of (input, line number) (default {DEFAULT_VALID_FRACTION}"
                            " for criteo/avazu; movielens always splits leave-last-out)")
    split.add_argument("--valid-days", type=int, nargs="+", metavar="D",
                       help="criteo: inputs named day_D are validation (1TB: --valid-days 23); "
                            "avazu: rows whose hour falls on day-of-month D")
    split.add_argument("--valid-input", nargs="+", metavar="PATH", help="these files are the validation split")
    p.add_argument("--seed", type=int, default=0, help="seed of the validation hash and the MovieLens shuffle")
    p.add_argument("--rows-per-file", type=int, default=DEFAULT_ROWS_PER_FILE,
                   help="rows per parquet part (default: %(default)s)")
    p.add_argument("--max-bad-fraction", type=float, default=DEFAULT_MAX_BAD_FRACTION,
                   help="fail when more than this fraction of lines is malformed (default: %(default)s)")
    p.add_argument("--block-size-mib", type=float, default=DEFAULT_BLOCK_SIZE / 2**20,
                   help="input text parsed at a time, the bound on memory (default: %(default)s)")
    p.add_argument("--rating-threshold", type=float, default=4.0,
                   help="movielens: label = rating >= this (default: %(default)s)")
    p.add_argument("--label", choices=["binary", "rating"], default="binary",
                   help="movielens: binary (default): label = rating >= --rating-threshold; rating: the rating itself "
                        "in a float column `rating`, declared a regression task (task_types: {rating: regression}) "
                        "that rayemb train fits with MSE and scores by RMSE/MAE")
    p.add_argument("--history-length", type=int, default=20,
                   help="movielens: items in a row's history list (default: %(default)s)")
    p.add_argument("--history-as-sequence", action="store_true",
                   help="movielens: declare history a sequence feature (max_length = --history-length, target item) "
                        "for model.sequence_tower: mean|attention, instead of a pooled multi-hot bag")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="local: one process on one core; ray: criteo as Ray tasks on a cluster's CPUs, the same "
                        "dataset (avazu and movielens always run locally); auto (default): ray for criteo when "
                        f"--address is given or the inputs hold >= {AUTO_RAY_MIN_BYTES >> 30} GiB (below that Ray's "
                        "start-up seconds outweigh the gain), else local")
    p.add_argument("--address", metavar="HOST:PORT",
                   help="--engine ray: the cluster to use (default: the Ray this process joined, $RAY_ADDRESS, or a "
                        "local Ray started and stopped for the conversion)")
    p.add_argument("--chunk-size-mib", type=float, metavar="MIB",
                   help="--engine ray: bytes of an uncompressed input per task (default: 4 chunks per CPU, at most "
                        "256; a .gz/.bz2 input is one chunk)")
    p.add_argument("--progress-every", type=float, default=DEFAULT_PROGRESS_EVERY_S, metavar="SECONDS",
                   help="seconds between progress lines on stderr (default: %(default)s)")


def options_from_args(args: argparse.Namespace) -> Any:
    from rayemb.convert import ConvertOptions

    return ConvertOptions(
        inputs=tuple(args.input), out=args.out, overwrite=args.overwrite, hash_buckets=args.hash_buckets,
        vocab_from_train=args.vocab_from_train, min_count=args.min_count, valid_fraction=args.valid_fraction,
        valid_days=tuple(args.valid_days or ()), valid_inputs=tuple(args.valid_input or ()), seed=args.seed,
        rows_per_file=args.rows_per_file, max_bad_fraction=args.max_bad_fraction,
        block_size=int(args.block_size_mib * 2**20), rating_threshold=args.rating_threshold, label=args.label,
        history_length=args.history_length,
        history_as_sequence=args.history_as_sequence, progress_every_s=args.progress_every,
        raw_ids=args.ids == "raw", capacity=args.capacity, engine=args.engine, address=args.address,
        chunk_bytes=None if args.chunk_size_mib is None else int(args.chunk_size_mib * 2**20),
    )


def format_summary(s: Dict[str, Any]) -> str:
    """The lines a user reads at the end of a conversion (the whole summary is in convert_summary.json)."""
    from rayemb.logs import redact_text

    bad = s["bad_lines"]
    kinds = ", ".join(f"{k} {v:,}" for k, v in bad["by_kind"].items())
    out = [f"convert {s['format']}: {s['lines_read']:,} lines -> train {s['rows']['train']:,} rows, valid "
           f"{s['rows']['valid']:,} rows (label mean {s['label_mean']['train']:.3f} / {s['label_mean']['valid']:.3f})",
           f"  split: {s['split']}",
           f"  bad lines dropped: {bad['total']:,} ({100 * bad['fraction']:.3f}%){': ' + kinds if kinds else ''}"]
    for ex in bad["examples"][:3]:
        out.append(f"    {ex['file']} line {ex['line']}: {ex['why']}: {ex['text'][:80]!r}")
    tables = []
    for name, t in s["tables"].items():
        extra = ""
        if "oov_rows" in t:
            extra = f" oov {sum(t['oov_rows'].values()):,}"
        elif "distinct_ids_used" in t:
            extra = f" used {t['distinct_ids_used']:,}"
        tables.append(f"{name} {t['num_embeddings']:,}{extra}")
    out.append("  tables (num_embeddings): " + "; ".join(tables))
    engine = s.get("engine") or {}
    on = f", {engine['name']} engine on {engine['cpus']} CPUs" if engine.get("name") == "ray" else ""
    out.append(f"  wrote {s['out']} in {s['wall_time_s']:.1f}s ({s['lines_per_s']:,.0f} lines/s{on}); details in "
               f"convert_summary.json")
    out.append(f"  train it: rayemb train --config jobs/configs/synth_small.yaml --set data.path={s['out']}")
    return redact_text("\n".join(out))  # the summary holds redacted URIs; a caller's own dict may not


def convert_main(args: argparse.Namespace) -> int:
    """``rayemb convert FORMAT --input PATH... --out DIR``: converts, prints the summary; user errors propagate."""
    from rayemb.convert import convert

    summary = convert(args.format, options_from_args(args))
    print(format_summary(summary))
    return 0


__all__ = ["add_convert_arguments", "convert_main", "format_summary", "options_from_args"]
