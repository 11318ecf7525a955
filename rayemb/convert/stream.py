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

The Ray engine (:mod:`rayemb.convert.ray_engine`) runs the same checks
(:func:`prepare`), encoders (:func:`encoders_for`), split (:func:`valid_mask`),
tables (:func:`split_tables`) and writing (:class:`WriteState`), so that its
dataset is this one's.

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
import pyarrow.compute as pc

from rayemb.constants import LABEL_COLUMN, TRAIN_SPLIT, VALID_SPLIT
from rayemb.convert.common import (BadLines, ConvertOptions, LineReader, Progress, check_inputs_exist, head_lines,
                                   row_uniform)
from rayemb.convert.output import PartWriter, StagedOutput, arrow_schema, finish
from rayemb.convert.vocab import (RAW_CAPACITY_RULE, RAW_OVERFLOW_RULE, FrequencyCounter, HashEncoder, RawEncoder,
                                  Vocabulary, tallies)
from rayemb.data.schema import DatasetSchema, SparseFeature
from rayemb.errors import ConfigError, DataError
from rayemb.logs import redact_uri

Encoder = Union[HashEncoder, Vocabulary, RawEncoder]


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


def valid_mask(rec: Records, role: str, file_index: int, opts: ConvertOptions) -> np.ndarray:
    """Which of the block's rows are validation rows (the same whatever the engine or the block size)."""
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
            train = ~valid_mask(rec, role, index, opts)
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


def prepare(fmt: StreamFormat, opts: ConvertOptions) -> List[Tuple[str, str]]:
    """The checks before any work (ids option, split, inputs, their first lines); returns ``(path, role)``."""
    if opts.hash_buckets is None and not opts.vocab_from_train and not opts.raw_ids:
        raise ConfigError(f"rayemb convert {fmt.name} needs a way to make categorical ids: --hash-buckets N "
                          "(id = value mod N), --vocab-from-train [--min-count K] (ids by frequency) or --ids raw "
                          "(the values themselves).", category="invalid_option")
    roles = _roles(fmt, opts)
    check_inputs_exist([p for p, _ in roles])
    _check_heads(fmt, roles)
    return roles


def encoders_for(fmt: StreamFormat, opts: ConvertOptions,
                 vocabularies: Optional[Dict[str, Vocabulary]] = None) -> Dict[str, Encoder]:
    """The encoder of every key table: the counted vocabularies, ``--ids raw`` or hashing."""
    if vocabularies is not None:
        return {t: vocabularies.get(t, Vocabulary.empty()) for t in fmt.key_tables}
    if opts.raw_ids:
        return {t: RawEncoder(opts.capacity) for t in fmt.key_tables}
    return {t: HashEncoder(opts.hash_buckets) for t in fmt.key_tables}


class WriteState:
    """What a write pass adds up while the parts are written, whichever engine parsed the rows: rows, positives
    and per-table tallies per split, bad lines, and (``--ids raw`` without ``--capacity``) the distinct ids."""

    def __init__(self, fmt: StreamFormat, opts: ConvertOptions, encoders: Dict[str, Encoder], stage_dir: Any) -> None:
        self.fmt, self.opts, self.encoders = fmt, opts, encoders
        raw = [t for t, e in encoders.items() if isinstance(e, RawEncoder)]
        self.distinct: Dict[str, FrequencyCounter] = {t: FrequencyCounter() for t in raw if opts.capacity is None}
        sizes: Dict[str, int] = {t: encoders[t].num_embeddings or 2 for t in fmt.key_tables}  # raw: set at close
        sizes.update(fmt.direct_tables)
        self.tally = tallies(sizes, {t: encoders[t].oov_id for t in fmt.key_tables}, untracked=raw)
        self.pa_schema = arrow_schema(self.schema())
        self.writers = {s: PartWriter(stage_dir.split_dir(s), self.pa_schema, opts.rows_per_file)
                        for s in (TRAIN_SPLIT, VALID_SPLIT)}
        self.positives = {TRAIN_SPLIT: 0.0, VALID_SPLIT: 0.0}
        self.bad = BadLines()

    def schema(self) -> DatasetSchema:
        """The dataset's schema; raw tables' capacity is final once every row is written."""
        raw = {t for t, e in self.encoders.items() if isinstance(e, RawEncoder)}
        # a raw table's num_embeddings is its capacity (rayemb.data.schema)
        sparse = [SparseFeature(t, self.tally[t].num_embeddings, ids="raw") if t in raw else
                  SparseFeature(t, self.tally[t].num_embeddings) for t in self.fmt.key_tables]
        sparse += [SparseFeature(t, v) for t, v in self.fmt.direct_tables.items()]
        return DatasetSchema(label=LABEL_COLUMN, dense=tuple(self.fmt.dense), sparse=tuple(sparse))

    def write(self, split: str, table: pa.Table) -> None:
        """Appends one block's rows of ``split`` (in input order) and adds them up."""
        self.positives[split] += float(pc.sum(table.column(LABEL_COLUMN)).as_py() or 0.0)
        for t in self.tally:
            col = table.column(t)
            self.tally[t].add(split, col.drop_null().to_numpy(), col.null_count)
        self.writers[split].write(table)

    def add_distinct(self, table: str, ids: np.ndarray) -> None:
        self.distinct[table].add(ids)

    def close(self) -> Dict[str, int]:
        """Closes the parts and checks both splits have rows; sets raw tables' capacity; returns rows per split."""
        rows = {s: w.close() for s, w in self.writers.items()}
        self.bad.check(self.fmt.name, self.opts.max_bad_fraction, self.fmt.hint)
        for s, n in rows.items():
            if n == 0:
                raise DataError(f"The conversion left no {s} rows ({_split_description(self.fmt, self.opts)}). Choose "
                                "a split that leaves rows on both sides (e.g. a larger --valid-fraction, other "
                                "--valid-days).", category="empty_split")
        for t, counter in self.distinct.items():
            self.tally[t].num_embeddings = int(counter.result()[0].size) + 1
        return rows

    def summary(self, rows: Dict[str, int], elapsed: float, engine: Dict[str, Any]) -> Dict[str, Any]:
        fmt, opts, encoders = self.fmt, self.opts, self.encoders
        if opts.vocab_from_train:
            ids: Dict[str, Any] = {"mode": "vocab", "min_count": opts.min_count, "oov_id": "the last id of each table",
                                   "rare_values": {t: encoders[t].rare for t in fmt.key_tables}}
        elif opts.raw_ids:
            ids = {"mode": "raw", "capacity": opts.capacity, "capacity_rule": RAW_CAPACITY_RULE,
                   "overflow": RAW_OVERFLOW_RULE}
            if self.distinct:
                ids["distinct_train_ids"] = {t: self.tally[t].num_embeddings - 1 for t in self.distinct}
        else:
            ids = {"mode": "hash", "hash_buckets": opts.hash_buckets}
        return {
            "format": fmt.name, "engine": engine, "inputs": [redact_uri(p) for p in opts.inputs],
            "valid_inputs": [redact_uri(p) for p in opts.valid_inputs], "out": redact_uri(opts.out),
            "split": _split_description(fmt, opts), "ids": ids,
            "rows": rows, "label_mean": {s: self.positives[s] / rows[s] for s in rows},
            "lines_read": self.bad.lines_read, "bad_lines": self.bad.to_dict(), "dense": list(fmt.dense),
            "tables": {t: self.tally[t].to_dict() for t in self.tally}, "notes": fmt.notes(),
            "wall_time_s": round(elapsed, 3), "lines_per_s": round(self.bad.lines_read / max(elapsed, 1e-9), 1),
        }

    def finish(self, stage_path: str, rows: Dict[str, int], elapsed: float, engine: Dict[str, Any]) -> Dict[str, Any]:
        """Writes schema.yaml and the summary into the staging folder and checks the dataset; returns the summary."""
        summary = self.summary(rows, elapsed, engine)
        finish(stage_path, self.schema(), summary)
        return summary


def convert_stream(fmt: StreamFormat, opts: ConvertOptions) -> Dict[str, Any]:
    """Converts ``opts.inputs`` of ``fmt`` into a dataset at ``opts.out``; returns the summary it also writes."""
    roles = prepare(fmt, opts)
    t0 = time.monotonic()
    progress = Progress(fmt.name, opts.progress_every_s)
    with StagedOutput(opts.out, opts.overwrite) as stage:
        vocabularies = _count_pass(fmt, roles, opts, progress) if opts.vocab_from_train else None
        if vocabularies is not None:
            progress = Progress(fmt.name, opts.progress_every_s)
        encoders = encoders_for(fmt, opts, vocabularies)
        state = WriteState(fmt, opts, encoders, stage)
        stage_name = "pass 2/2 (writing)" if opts.vocab_from_train else "writing"
        for index, (path, role) in enumerate(roles):
            for rec in _blocks(fmt, path, opts, state.bad, progress, stage_name):
                ids = {t: encoders[t].encode(rec.keys[t][0]) for t in fmt.key_tables}
                tables = split_tables(rec, ids, valid_mask(rec, role, index, opts), state.pa_schema)
                for split, table in tables.items():
                    if table is not None:
                        if split == TRAIN_SPLIT:
                            for t in state.distinct:
                                state.add_distinct(t, table.column(t).drop_null().to_numpy())
                        state.write(split, table)
        rows = state.close()
        summary = state.finish(stage.path, rows, time.monotonic() - t0, {"name": "local", "cpus": 1})
        stage.commit()
    return summary


def split_tables(rec: Records, ids: Dict[str, np.ndarray], valid: np.ndarray,
                 schema: pa.Schema) -> Dict[str, Optional[pa.Table]]:
    """The block's train and valid rows (None for none) as the dataset's columns (empty categories as nulls):
    built once for the whole block, then filtered by Arrow, one pass per split instead of a copy per column."""
    n_valid = int(np.count_nonzero(valid))
    if not len(valid):
        return {TRAIN_SPLIT: None, VALID_SPLIT: None}
    cols: Dict[str, Any] = {LABEL_COLUMN: pa.array(rec.label, pa.float32()), **rec.dense}
    for t, table_ids in ids.items():
        cols[t] = pa.array(table_ids, pa.int64(), mask=rec.keys[t][1])
    for t, direct in rec.direct.items():
        cols[t] = pa.array(direct, pa.int64())
    table = pa.table(cols).select(schema.names)
    if n_valid in (0, len(valid)):
        return {TRAIN_SPLIT: None if n_valid else table, VALID_SPLIT: table if n_valid else None}
    return {TRAIN_SPLIT: table.filter(pa.array(~valid)), VALID_SPLIT: table.filter(pa.array(valid))}
