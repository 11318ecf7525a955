"""MovieLens ratings (``u.data``, ``ratings.dat``, ``ratings.csv``) -> a click-style rayemb dataset.

The three layouts, told apart by the first line's separator:

- ``u.data`` (ML-100K): ``user \\t item \\t rating \\t timestamp``, no header;
- ``ratings.dat`` (ML-1M, ML-10M): ``UserID::MovieID::Rating::Timestamp``, no header;
- ``ratings.csv`` (ML-20M, ML-25M, latest): ``userId,movieId,rating,timestamp`` with that header.

Each rating becomes a row: ``label = rating >= --rating-threshold`` (default 4),
or with ``--label rating`` the rating itself, as given, in a float ``rating``
column that ``schema.yaml`` declares a regression task (``task_types: {rating:
regression}``: MSE on the model's raw output, ``valid_rmse``/``valid_mae``),
``user`` and ``item`` ids (a vocabulary over the training rows by descending
frequency; unseen -> one OOV id), ``history`` — the user's previous
``--history-length`` (default 20) items before this rating in time order (oldest
first), a multi-hot ``list<int64>`` of item ids, empty for a user's first rating —
and the dense ``history_length`` (the list's length; rayemb applies ``log1p`` at
batch time; its DLRM needs a dense feature).

Validation is leave-last-out: each user's last rating (by timestamp, ties in file
order) is in ``valid/`` when the user has at least 2 ratings; the rest is
``train/``, rows shuffled with ``--seed``. MovieLens fits in memory (the 25M
release too), so this converter reads the whole file and sorts it, unlike
the streaming Criteo/Avazu ones; history lists are built a quarter million rows
at a time.

Example::

    >>> convert_movielens(ConvertOptions(inputs=("ml-1m/ratings.dat",), out="data/ml1m"))
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayemb.constants import LABEL_COLUMN, TRAIN_SPLIT, VALID_SPLIT
from rayemb.convert.common import (BadLines, ConvertOptions, LineReader, Progress, RowChecks, check_inputs_exist,
                                   head_lines, int_column, matches, split_fields)
from rayemb.convert.output import PartWriter, StagedOutput, arrow_schema, finish
from rayemb.convert.vocab import FrequencyCounter, Vocabulary, tallies
from rayemb.data.schema import DatasetSchema, SparseFeature
from rayemb.errors import ConfigError, DataError
from rayemb.logs import redact_uri

LAYOUTS = {"::": "ratings.dat", "\t": "u.data", ",": "ratings.csv"}
_ID = r"^[0-9]{1,18}$"
_RATING = r"^[0-9]{1,6}(\.[0-9]{1,6})?$"
_WRITE_ROWS = 1 << 18  # rows whose history lists are built at once (a row group of the current part)
#: --label: a 0/1 label from --rating-threshold, or the rating kept as a regression label
LABELS = ("binary", "rating")
RATING_COLUMN = "rating"


def detect_layout(path: str, head: List[str]) -> str:
    """The field separator of a MovieLens ratings file, from its first line."""
    first = head[0] if head else ""
    for sep in LAYOUTS:
        if sep in first:
            return sep
    raise DataError(f"Input {redact_uri(path)!r} is not a MovieLens ratings file: its first line {first[:120]!r} has "
                    "none of the separators of u.data (tab), ratings.dat (::) or ratings.csv (,).",
                    category="wrong_format")


def _read(path: str, sep: str, opts: ConvertOptions, bad: BadLines, progress: Progress) -> Tuple[np.ndarray, ...]:
    """(user, item, rating, timestamp) of the well-formed lines of one file."""
    parts: List[Tuple[np.ndarray, ...]] = []
    reader = LineReader(path, opts.block_size)
    seen = 0
    for lines, numbers, nbytes in reader:
        seen += nbytes
        if sep == "," and numbers[0] == 1 and not lines[0].as_py().split(",")[0].strip().isdigit():
            lines, numbers = lines.slice(1), numbers[1:]  # the ratings.csv header
        bad.lines_read += len(lines)
        fields, ok = split_fields(lines, sep, 4)
        bad.add("wrong_field_count", path, ~ok, lines, numbers, f"not 4 fields separated by {sep!r}")
        checks = RowChecks(bad, path, lines.filter(pa.array(ok)), numbers[ok])
        for j, name in ((0, "user"), (1, "item"), (3, "timestamp")):
            checks.require(matches(fields[j], _ID), "id", f"{name} is not a non-negative integer")
        checks.require(matches(fields[2], _RATING), "rating", "rating is not a number")
        mask = pa.array(~checks.failed)
        none = np.zeros(int((~checks.failed).sum()), dtype=bool)
        ints = [int_column(fields[j].filter(mask), none).to_numpy(zero_copy_only=False) for j in (0, 1, 3)]
        rating = pc.cast(fields[2].filter(mask), pa.float32()).to_numpy(zero_copy_only=False)
        parts.append((ints[0], ints[1], rating, ints[2]))
        progress.update("reading", path, len(lines), seen)
    bad.add_skipped(path, reader.skipped)
    if not parts:
        return tuple(np.empty(0, dt) for dt in (np.int64, np.int64, np.float32, np.int64))
    return tuple(np.concatenate(col) for col in zip(*parts))


def _vocab(keys: np.ndarray, min_count: int) -> Vocabulary:
    counter = FrequencyCounter()
    counter.add(keys.astype(np.uint64))
    return Vocabulary.from_counter(counter, min_count)


def _history(rows: np.ndarray, hist_len: np.ndarray, item_ids: np.ndarray) -> pa.Array:
    """The ``history`` lists of ``rows`` (positions in user/time order): the ``hist_len`` items before each."""
    lengths = hist_len[rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    values = item_ids[np.repeat(rows - lengths, lengths) + within]
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, pa.int64()))


def _check_options(opts: ConvertOptions) -> None:
    if opts.label not in LABELS:
        raise ConfigError(f"--label {opts.label!r}: use binary (label = rating >= --rating-threshold) or rating (the "
                          "rating as a regression label).", category="invalid_option")
    if opts.hash_buckets is not None:
        raise ConfigError("rayemb convert movielens makes contiguous user and item ids from a vocabulary; drop "
                          "--hash-buckets.", category="invalid_option")
    if opts.valid_fraction is not None or opts.valid_days or opts.valid_inputs:
        raise ConfigError("rayemb convert movielens splits leave-last-out (each user's last rating is validation); "
                          "drop --valid-fraction / --valid-days / --valid-input.", category="invalid_option")


def convert_movielens(opts: ConvertOptions) -> Dict[str, Any]:
    """MovieLens ratings -> parquet + schema.yaml at ``opts.out``; returns the conversion summary."""
    _check_options(opts)
    check_inputs_exist(opts.inputs)
    layouts = {}
    for path in opts.inputs:
        head = head_lines(path)
        layouts[path] = detect_layout(path, head)
    progress = Progress("movielens", opts.progress_every_s)
    with StagedOutput(opts.out, opts.overwrite) as stage:
        bad = BadLines()
        cols = [_read(p, layouts[p], opts, bad, progress) for p in opts.inputs]
        user, item, rating, ts = (np.concatenate(c) if len(c) > 1 else c[0] for c in zip(*cols))
        del cols
        bad.check("movielens", opts.max_bad_fraction, "MovieLens lines are user, item, rating, timestamp.")
        order = np.lexsort((ts, user))  # by user, then time; lexsort is stable, so ties keep file order
        del ts
        user, item, rating = user[order], item[order], rating[order]
        del order
        first = np.r_[True, user[1:] != user[:-1]] if len(user) else np.zeros(0, bool)
        group_start = np.maximum.accumulate(np.where(first, np.arange(len(user)), 0))
        pos = np.arange(len(user)) - group_start
        last = np.r_[first[1:], True] if len(user) else np.zeros(0, bool)
        valid = last & (pos >= 1)
        users, items = _vocab(user[~valid], opts.min_count), _vocab(item[~valid], opts.min_count)
        user_ids, item_ids = users.encode(user.astype(np.uint64)), items.encode(item.astype(np.uint64))
        hist_len = np.minimum(pos, opts.history_length)
        regression = opts.label == "rating"
        label_column = RATING_COLUMN if regression else LABEL_COLUMN
        label = rating.astype(np.float32) if regression else (rating >= opts.rating_threshold).astype(np.float32)
        tasks = {"task_types": ((RATING_COLUMN, "regression"),)} if regression else {}
        pooled = (SparseFeature("user", users.num_embeddings), SparseFeature("item", items.num_embeddings))
        if opts.history_as_sequence:  # the recent items, in time order, for a user-history tower against ``item``
            schema = DatasetSchema(label=label_column, dense=("history_length",), sparse=pooled, sequence=(
                SparseFeature("history", items.num_embeddings, sequence=True, max_length=opts.history_length,
                              target="item"),), **tasks)
        else:
            schema = DatasetSchema(label=label_column, dense=("history_length",), sparse=pooled + (
                SparseFeature("history", items.num_embeddings, multi_hot=True),), **tasks)
        tally = tallies({f.name: f.num_embeddings for f in (*schema.sparse, *schema.sequence)},
                        {"user": users.oov_id, "item": items.oov_id, "history": items.oov_id})
        pa_schema = arrow_schema(schema)
        rng = np.random.default_rng(opts.seed)
        rows = {TRAIN_SPLIT: rng.permutation(np.flatnonzero(~valid)), VALID_SPLIT: np.flatnonzero(valid)}
        for split, idx in rows.items():
            if len(idx) == 0:
                raise DataError(f"The MovieLens inputs {[redact_uri(p) for p in opts.inputs]} leave no {split} rows "
                                "(leave-last-out needs users with at least 2 ratings).", category="empty_split")
            writer = PartWriter(stage.split_dir(split), pa_schema, opts.rows_per_file)
            step = min(opts.rows_per_file, _WRITE_ROWS)
            for start in range(0, len(idx), step):
                chunk = idx[start: start + step]
                history = _history(chunk, hist_len, item_ids)
                tally["user"].add(split, user_ids[chunk], 0)
                tally["item"].add(split, item_ids[chunk], 0)
                tally["history"].add(split, pc.list_flatten(history).to_numpy(), int((hist_len[chunk] == 0).sum()))
                writer.write(pa.table({label_column: label[chunk], "history_length": hist_len[chunk].astype(np.float32),
                                       "user": user_ids[chunk], "item": item_ids[chunk], "history": history}))
            writer.close()
        elapsed = progress.elapsed_s()
        summary = {
            "format": "movielens", "inputs": [redact_uri(p) for p in opts.inputs],
            "layouts": {redact_uri(p): LAYOUTS[s] for p, s in layouts.items()}, "out": redact_uri(opts.out),
            "split": "leave-last-out: each user's last rating by timestamp (ties: file order) is validation, for "
                     "users with at least 2 ratings; train rows shuffled with seed %d" % opts.seed,
            "ids": {"mode": "vocab", "min_count": opts.min_count, "oov_id": "the last id of each table",
                    "rare_values": {"user": users.rare, "item": items.rare}},
            "label": ("rating (regression)" if regression else f"rating >= {opts.rating_threshold}"),
            "history_length": opts.history_length,
            "rows": {s: int(len(i)) for s, i in rows.items()},
            "label_mean": {s: float(label[i].mean()) for s, i in rows.items()},
            "users": int(first.sum()), "items": int(len(np.unique(item))),
            "lines_read": bad.lines_read, "bad_lines": bad.to_dict(), "dense": ["history_length"],
            "tables": {t: tt.to_dict() for t, tt in tally.items()},
            "notes": {"dense": "history_length: the history list's length; rayemb applies log1p at batch time"},
            "wall_time_s": round(elapsed, 3), "lines_per_s": round(bad.lines_read / max(elapsed, 1e-9), 1),
        }
        finish(stage.path, schema, summary)
        stage.commit()
    return summary
