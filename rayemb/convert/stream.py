"""The streaming conversion both line formats share (Criteo, Avazu): plan, optional count pass, write pass.

A format (:class:`StreamFormat`) says how to read one block of lines into
:class:`Records` — label, dense columns, categorical *keys* and ready-made ids —
counting its malformed lines. :func:`convert_stream` does the rest:

1. checks options, inputs and the head of every input before any work (wrong
   format, missing files, an existing ``--out``);
2. with ``--vocab-from-train``, one pass over the training rows counts every
   categorical value (:mod:`rayemb.convert.vocab`); with ``--hash-buckets`` none;
3. one pass parses, splits, encodes and writes parquet parts into a staging
   folder, with progress lines;
4. fails if more than ``--max-bad-fraction`` of the lines were malformed, else
   writes ``schema.yaml`` and ``convert_summary.json``, checks the result like
   ``rayemb train`` does, and renames the folder to ``--out``.

Validation rows: ``--valid-input`` files, or ``--valid-days`` (a format picks
whole files by name or rows by date), or else a seeded ``--valid-fraction`` of
rows chosen by a hash of (seed, file, line number), independent of block sizes.

Example::

    >>> summary = convert_stream(CriteoFormat(), ConvertOptions(inputs=("train.txt",), out="data/kaggle",
    ...                                                         hash_buckets=1_000_000))
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import pyarrow as pa

from rayemb.constants import LABEL_COLUMN, TRAIN_SPLIT, VALID_SPLIT
from rayemb.convert.common import (BadLines, ConvertOptions, LineReader, Progress, check_inputs_exist, head_lines,
                                   row_uniform)
from rayemb.convert.output import PartWriter, StagedOutput, arrow_schema, finish
from rayemb.convert.vocab import FrequencyCounter, HashEncoder, Vocabulary, tallies
from rayemb.data.schema import DatasetSchema, SparseFeature
from rayemb.errors import ConfigError, DataError
from rayemb.logs import redact_uri

Encoder = Union[HashEncoder, Vocabulary]


@dataclass
class Records:
    """The good rows of one block of lines."""

    numbers: np.ndarray  # physical line numbers (for the seeded split)
    label: np.ndarray  # float32 0/1
    dense: Dict[str, pa.Array]  # float32, null where the field was empty
    keys: Dict[str, Tuple[np.ndarray, np.ndarray]]  # table -> (uint64 keys, empty mask)
    direct: Dict[str, np.ndarray]  # table -> int64 ids that need no encoding
    day: Optional[np.ndarray] = None  # day of month per row, for formats that split --valid-days by row


class StreamFormat(ABC):
    """One line-based input format: its columns, its checks and its parser."""

    name: str = ""
    has_header: bool = False
    #: --valid-days picks rows by their date (True) or whole input files by name (False)
    days_by_row: bool = False
    dense: List[str]
    key_tables: List[str]
    direct_tables: Dict[str, int]
    #: what a user should check when many lines are malformed
    hint: str = ""

    @abstractmethod
    def inspect(self, path: str, head: List[str]) -> None:
        """Raises DataError when the first lines of ``path`` are not this format (before any work)."""

    @abstractmethod
    def parse(self, lines: pa.Array, numbers: np.ndarray, path: str, bad: BadLines) -> Records:
        """Records of the well-formed lines; the others are counted in ``bad``."""

    def file_is_valid(self, path: str, days: Tuple[int, ...]) -> bool:
        raise NotImplementedError

    def notes(self) -> Dict[str, Any]:
        return {}


def _roles(fmt: StreamFormat, opts: ConvertOptions) -> List[Tuple[str, str]]:
    """(path, role) per input: role ``train``, ``valid`` or ``rows`` (split row by row)."""
    if opts.valid_inputs:
        return [(p, "train") for p in opts.inputs] + [(p, "valid") for p in opts.valid_inputs]
    if opts.valid_days and not fmt.days_by_row:
        roles = [(p, "valid" if fmt.file_is_valid(p, opts.valid_days) else "train") for p in opts.inputs]
        if not any(r == "valid" for _, r in roles) or not any(r == "train" for _, r in roles):
            which = "none" if not any(r == "valid" for _, r in roles) else "all"
            raise ConfigError(
                f"--valid-days {list(opts.valid_days)} picks inputs whose file name ends with day_N, and {which} of "
                f"the inputs {[redact_uri(p) for p, _ in roles]} do. Pass the day files themselves (e.g. --input "
                "day_0 ... day_23 --valid-days 23), or use --valid-fraction / --valid-input.",
                category="invalid_option")
        return roles
    return [(p, "rows") for p in opts.inputs]


def _split_description(fmt: StreamFormat, opts: ConvertOptions) -> str:
    if opts.valid_inputs:
        return f"--valid-input: every row of {[redact_uri(p) for p in opts.valid_inputs]}"
    if opts.valid_days:
        what = "rows dated on day(s) of month" if fmt.days_by_row else "input files named day_N for N in"
        return f"--valid-days: {what} {list(opts.valid_days)}"
    return (f"--valid-fraction {opts.fraction()}: rows whose splitmix64 hash of (seed {opts.seed}, input index, "
            "line number) falls below the fraction")


def _valid_mask(rec: Records, role: str, file_index: int, opts: ConvertOptions) -> np.ndarray:
    n = len(rec.label)
    if role != "rows":
        return np.full(n, role == "valid")
    if opts.valid_days:
        return np.isin(rec.day, np.asarray(opts.valid_days))
    return row_uniform(opts.seed, file_index, rec.numbers) < opts.fraction()


def _blocks(fmt: StreamFormat, path: str, opts: ConvertOptions, bad: BadLines, progress: Progress, stage: str):
    """Records per block of ``path`` (the header line dropped), with progress lines."""
    reader = LineReader(path, opts.block_size)
    seen = 0
    for lines, numbers, nbytes in reader:
        seen += nbytes
        if fmt.has_header and numbers[0] == 1:
            lines, numbers = lines.slice(1), numbers[1:]
        bad.lines_read += len(lines)
        rec = fmt.parse(lines, numbers, path, bad)
        progress.update(stage, path, len(lines), seen)
        yield rec
    bad.add_skipped(path, reader.skipped)


def _count_pass(fmt: StreamFormat, roles: List[Tuple[str, str]], opts: ConvertOptions,
                progress: Progress) -> Dict[str, Vocabulary]:
    counters = {t: FrequencyCounter() for t in fmt.key_tables}
    scratch = BadLines()  # the write pass counts bad lines; this pass only skips them
    for index, (path, role) in enumerate(roles):
        if role == "valid":
            continue
        for rec in _blocks(fmt, path, opts, scratch, progress, "pass 1/2 (counting values of train rows)"):
            train = ~_valid_mask(rec, role, index, opts)
            for t in fmt.key_tables:
                keys, empty = rec.keys[t]
                counters[t].add(keys[train & ~empty])
    return {t: Vocabulary.from_counter(c, opts.min_count) for t, c in counters.items()}


def _check_heads(fmt: StreamFormat, roles: List[Tuple[str, str]]) -> None:
    for path, _ in roles:
        head = head_lines(path)
        if not head or head == [""]:
            raise DataError(f"Input {redact_uri(path)!r} is empty; remove it from --input.", category="malformed_input")
        fmt.inspect(path, head)


def convert_stream(fmt: StreamFormat, opts: ConvertOptions) -> Dict[str, Any]:
    """Converts ``opts.inputs`` of ``fmt`` into a dataset at ``opts.out``; returns the summary it also writes."""
    if opts.hash_buckets is None and not opts.vocab_from_train:
        raise ConfigError(f"rayemb convert {fmt.name} needs a way to make categorical ids: --hash-buckets N "
                          "(id = value mod N) or --vocab-from-train [--min-count K] (ids by frequency).",
                          category="invalid_option")
    roles = _roles(fmt, opts)
    check_inputs_exist([p for p, _ in roles])
    _check_heads(fmt, roles)
    t0 = time.monotonic()
    progress = Progress(fmt.name, opts.progress_every_s)
    with StagedOutput(opts.out, opts.overwrite) as stage:
        if opts.vocab_from_train:
            encoders: Dict[str, Encoder] = dict(_count_pass(fmt, roles, opts, progress))
            progress = Progress(fmt.name, opts.progress_every_s)
        else:
            encoders = {t: HashEncoder(opts.hash_buckets) for t in fmt.key_tables}
        sizes = {t: encoders[t].num_embeddings for t in fmt.key_tables}
        sizes.update(fmt.direct_tables)
        schema = DatasetSchema(label=LABEL_COLUMN, dense=tuple(fmt.dense),
                               sparse=tuple(SparseFeature(t, v) for t, v in sizes.items()))
        tally = tallies(sizes, {t: encoders[t].oov_id for t in fmt.key_tables})
        pa_schema = arrow_schema(schema)
        writers = {s: PartWriter(stage.split_dir(s), pa_schema, opts.rows_per_file) for s in (TRAIN_SPLIT, VALID_SPLIT)}
        positives = {TRAIN_SPLIT: 0.0, VALID_SPLIT: 0.0}
        bad = BadLines()
        stage_name = "pass 2/2 (writing)" if opts.vocab_from_train else "writing"
        for index, (path, role) in enumerate(roles):
            for rec in _blocks(fmt, path, opts, bad, progress, stage_name):
                ids = {t: encoders[t].encode(rec.keys[t][0]) for t in fmt.key_tables}
                valid = _valid_mask(rec, role, index, opts)
                for split, m in ((TRAIN_SPLIT, ~valid), (VALID_SPLIT, valid)):
                    if m.any():
                        positives[split] += float(rec.label[m].sum())
                        writers[split].write(_table(rec, ids, m, schema, tally, split))
        rows = {s: w.close() for s, w in writers.items()}
        bad.check(fmt.name, opts.max_bad_fraction, fmt.hint)
        for s, n in rows.items():
            if n == 0:
                raise DataError(f"The conversion left no {s} rows ({_split_description(fmt, opts)}). Choose a split "
                                "that leaves rows on both sides (e.g. a larger --valid-fraction, other --valid-days).",
                                category="empty_split")
        elapsed = time.monotonic() - t0
        summary = {
            "format": fmt.name, "inputs": [redact_uri(p) for p in opts.inputs],
            "valid_inputs": [redact_uri(p) for p in opts.valid_inputs], "out": redact_uri(opts.out),
            "split": _split_description(fmt, opts),
            "ids": ({"mode": "hash", "hash_buckets": opts.hash_buckets} if not opts.vocab_from_train else
                    {"mode": "vocab", "min_count": opts.min_count, "oov_id": "the last id of each table",
                     "rare_values": {t: encoders[t].rare for t in fmt.key_tables}}),
            "rows": rows, "label_mean": {s: positives[s] / rows[s] for s in rows},
            "lines_read": bad.lines_read, "bad_lines": bad.to_dict(), "dense": list(fmt.dense),
            "tables": {t: tally[t].to_dict() for t in sizes}, "notes": fmt.notes(),
            "wall_time_s": round(elapsed, 3), "lines_per_s": round(bad.lines_read / max(elapsed, 1e-9), 1),
        }
        finish(stage.path, schema, summary)
        stage.commit()
    return summary


def _table(rec: Records, ids: Dict[str, np.ndarray], m: np.ndarray, schema: DatasetSchema, tally: Dict[str, Any],
           split: str) -> pa.Table:
    mask = pa.array(m)
    cols: Dict[str, Any] = {schema.label: pa.array(rec.label[m], pa.float32())}
    for c in schema.dense:
        cols[c] = rec.dense[c].filter(mask)
    for t, table_ids in ids.items():
        empty = rec.keys[t][1][m]
        kept = table_ids[m]
        tally[t].add(split, kept[~empty], int(empty.sum()))
        cols[t] = pa.array(kept, pa.int64(), mask=empty)
    for t, direct in rec.direct.items():
        tally[t].add(split, direct[m], 0)
        cols[t] = pa.array(direct[m], pa.int64())
    return pa.table(cols)
