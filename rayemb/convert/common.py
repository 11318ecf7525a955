"""Pieces every converter shares: options, line reading, field parsing, bad-line accounting, progress.

Input files are read as *lines* with pyarrow's streaming CSV reader (one column per
line, ``block_size`` bytes at a time, ``.gz``/``.bz2`` decompressed by extension),
so memory does not grow with the file, every line keeps its physical line number
(for error messages and the seeded validation split), and splitting a line into
fields is one vectorized ``split_pattern``. A line with the wrong number of fields
is counted as bad instead of stopping the reader.

Example::

    >>> for lines, numbers, nbytes in LineReader("day_0", block_size=16 << 20):
    ...     fields, ok = split_fields(lines, "\\t", 40)   # (n_ok x 40) string columns, the rows that had 40
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayemb import storage
from rayemb.errors import ConfigError, DataError
from rayemb.logs import redact_uri

logger = logging.getLogger("rayemb.convert")

DEFAULT_ROWS_PER_FILE = 1_000_000
DEFAULT_BLOCK_SIZE = 16 * 2**20  # 16 MiB of input text parsed at a time
DEFAULT_MAX_BAD_FRACTION = 0.01
DEFAULT_VALID_FRACTION = 0.1
DEFAULT_PROGRESS_EVERY_S = 10.0
#: examples of bad lines kept per kind (for the error message and convert_summary.json)
BAD_EXAMPLES_PER_KIND = 3
#: ``auto`` picks ``ray`` for Criteo when a cluster address is given or the inputs hold at least
#: AUTO_RAY_MIN_BYTES (there a cluster's CPUs repay the seconds Ray takes to start), else ``local``
ENGINES = ("auto", "local", "ray")
AUTO_RAY_MIN_BYTES = 2**30
#: why a line holding the byte 0x01 is bad (the single-process reader cannot split it into a line)
UNREADABLE_WHY = "holds the byte 0x01"
_LINE_DELIMITER = "\x01"  # no field of these formats holds it; a line that does is counted as bad


@dataclass(frozen=True)
class ConvertOptions:
    """What ``rayemb convert`` was asked to do (validated here, before any input is read)."""

    inputs: Tuple[str, ...]
    out: str
    overwrite: bool = False
    hash_buckets: Optional[int] = None
    vocab_from_train: bool = False
    min_count: int = 1
    valid_fraction: Optional[float] = None
    valid_days: Tuple[int, ...] = ()
    valid_inputs: Tuple[str, ...] = ()
    seed: int = 0
    rows_per_file: int = DEFAULT_ROWS_PER_FILE
    max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION
    block_size: int = DEFAULT_BLOCK_SIZE
    rating_threshold: float = 4.0
    #: movielens: ``binary`` (label = rating >= rating_threshold) or ``rating`` (the rating itself, a regression task)
    label: str = "binary"
    history_length: int = 20
    #: movielens: declare ``history`` a sequence feature (target ``item``) instead of a pooled multi-hot bag
    history_as_sequence: bool = False
    progress_every_s: float = DEFAULT_PROGRESS_EVERY_S
    #: criteo: the categorical values themselves as int64 ids (``--ids raw``), no vocabulary, no hashing
    raw_ids: bool = False
    #: --ids raw: num_embeddings of every raw table (None: its distinct train ids + 1)
    capacity: Optional[int] = None
    #: ``local`` (one process), ``ray`` (Ray tasks on the cluster's CPUs, criteo) or ``auto`` (see ENGINES)
    engine: str = "auto"
    #: the Ray cluster of the ray engine (None: the running one, $RAY_ADDRESS, or a private local one)
    address: Optional[str] = None
    #: ray engine: bytes of an uncompressed input per task (None: enough chunks for every CPU)
    chunk_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "valid_inputs", tuple(self.valid_inputs))
        object.__setattr__(self, "valid_days", tuple(int(d) for d in self.valid_days))
        checks = [
            (bool(self.inputs), "--input: give at least one input file"),
            (bool(self.out), "--out: give an output directory"),
            (sum([self.hash_buckets is not None, self.vocab_from_train, self.raw_ids]) <= 1,
             "--hash-buckets, --vocab-from-train and --ids raw exclude each other: pick one way to make ids"),
            (self.capacity is None or (self.raw_ids and self.capacity >= 2),
             f"--capacity {self.capacity}: give it with --ids raw, at least 2 (a raw table keeps a row for ids it "
             "does not hold)"),
            (self.engine in ENGINES, f"--engine {self.engine!r}: use one of {list(ENGINES)}"),
            (self.chunk_bytes is None or self.chunk_bytes >= 4096,
             f"chunk size {self.chunk_bytes} bytes: use at least 4 KiB"),
            (self.hash_buckets is None or self.hash_buckets >= 1, f"--hash-buckets {self.hash_buckets}: must be >= 1"),
            (self.min_count >= 1, f"--min-count {self.min_count}: must be >= 1"),
            (sum([self.valid_fraction is not None, bool(self.valid_days), bool(self.valid_inputs)]) <= 1,
             "--valid-fraction, --valid-days and --valid-input exclude each other: pick one validation split"),
            (self.valid_fraction is None or 0 < self.valid_fraction < 1,
             f"--valid-fraction {self.valid_fraction}: must lie in (0, 1)"),
            (self.rows_per_file >= 1, f"--rows-per-file {self.rows_per_file}: must be >= 1"),
            (0 <= self.max_bad_fraction <= 1, f"--max-bad-fraction {self.max_bad_fraction}: must lie in [0, 1]"),
            (self.block_size >= 4096, f"block size {self.block_size} bytes: use at least 4 KiB"),
            (math.isfinite(self.rating_threshold), f"--rating-threshold {self.rating_threshold}: must be a number"),
            (self.history_length >= 1, f"--history-length {self.history_length}: must be >= 1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"Invalid rayemb convert option {msg}.", category="invalid_option")
        for p in (*self.inputs, *self.valid_inputs, self.out):
            storage.check_supported(p, "rayemb convert path")

    def fraction(self) -> float:
        """The row-hash validation fraction (the default when no split option was given)."""
        return DEFAULT_VALID_FRACTION if self.valid_fraction is None else self.valid_fraction


def check_inputs_exist(paths: Sequence[str]) -> None:
    """DataError naming every missing input, before any work starts."""
    missing = [redact_uri(p) for p in paths if not storage.isfile(p)]
    if missing:
        raise DataError(f"Input file(s) {missing} do not exist (or are not files). Check the --input / --valid-input "
                        "paths (a shell glob such as day_* must match files).", category="missing_input")


#: compressed inputs by file extension
_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}


def open_input(path: str) -> Any:
    """A pyarrow input stream of a local file or a URI (``s3://...``), decompressed by its extension."""
    if not storage.is_remote(path):
        return pa.input_stream(path, compression="detect")
    fs, p = storage.filesystem(path)
    codec = next((c for ext, c in _CODECS.items() if p.endswith(ext)), None)
    raw = fs.open_input_stream(p)  # its own compression= is not applied on S3 (pyarrow 25): wrap it here
    return pa.CompressedInputStream(raw, codec) if codec else raw


def base_name(path: str) -> str:
    """File name without directories and compression suffix: ``/d/day_23.gz`` -> ``day_23``."""
    name = storage.basename(path)
    for ext in _CODECS:
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


# ---- READING ---- #

class LineReader:
    """Iterates ``(lines, line_numbers, nbytes)`` per block of one text file: a string array, their 1-based
    physical line numbers and the bytes of text they held. Blank lines are kept (the caller counts them as
    bad records); lines the reader cannot take (they hold the byte 0x01) are in :attr:`skipped`."""

    def __init__(self, path: str, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.path, self.block_size = path, block_size
        self.skipped: List[Tuple[int, str]] = []  # (line number, text)

    def _on_invalid(self, row: Any) -> str:
        self.skipped.append((int(row.number) if row.number is not None else -1, str(row.text)[:160]))
        return "skip"

    def __iter__(self) -> Iterator[Tuple[pa.Array, np.ndarray, int]]:
        import pyarrow.csv as pcsv

        try:
            with open_input(self.path) as source:
                reader = pcsv.open_csv(
                    source,
                    read_options=pcsv.ReadOptions(column_names=["line"], block_size=self.block_size,
                                                  use_threads=False),
                    parse_options=pcsv.ParseOptions(delimiter=_LINE_DELIMITER, quote_char=False,
                                                    ignore_empty_lines=False, invalid_row_handler=self._on_invalid),
                    convert_options=pcsv.ConvertOptions(column_types={"line": pa.string()},
                                                        strings_can_be_null=False, quoted_strings_can_be_null=False),
                )
                good = 0
                for batch in reader:
                    lines = batch.column(0)
                    n = len(lines)
                    numbers = physical_numbers(good, n, [s[0] for s in self.skipped])
                    good += n
                    nbytes = int(pc.sum(pc.binary_length(lines)).as_py() or 0) + n
                    yield lines, numbers, nbytes
        except (pa.ArrowInvalid, OSError) as e:
            raise not_text(self.path, e) from None


def not_text(path: str, e: BaseException) -> DataError:
    """The error for an input the CSV reader cannot take as text (bad UTF-8, a broken .gz, ...)."""
    return DataError(f"Input {redact_uri(path)!r} cannot be read as text ({type(e).__name__}: {str(e).strip()[:200]}). "
                     "Check that it is an uncompressed or .gz/.bz2 text file of the right format.",
                     category="unreadable_input")


def physical_numbers(good_before: int, n: int, skipped: Sequence[int]) -> np.ndarray:
    """1-based line numbers of the next ``n`` lines a reader kept, after ``good_before`` kept ones, when the lines
    numbered ``skipped`` were taken out: a kept line's number is its ordinal plus the skipped lines before it."""
    ordinals = np.arange(good_before + 1, good_before + n + 1, dtype=np.int64)
    shift = np.sort(np.asarray(skipped, dtype=np.int64)) - np.arange(len(skipped), dtype=np.int64)
    return ordinals + np.searchsorted(shift, ordinals, side="right")


def head_lines(path: str, max_bytes: int = 65536) -> List[str]:
    """The first complete lines of a (possibly compressed) text file, for checks before the real pass."""
    try:
        with open_input(path) as f:
            raw = f.read(max_bytes)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"Input {redact_uri(path)!r} cannot be read ({type(e).__name__}: {str(e).strip()[:200]}).",
                        category="unreadable_input") from None
    text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if len(raw) == max_bytes and len(lines) > 1:
        lines = lines[:-1]  # the last one may be cut
    return [ln.rstrip("\r") for ln in lines if ln or len(lines) == 1]


def split_fields(lines: pa.Array, sep: str, expected: int) -> Tuple[List[pa.Array], np.ndarray]:
    """Splits lines on ``sep``: ``expected`` string columns for the lines that have exactly that many fields,
    and the boolean mask (over ``lines``) of those lines."""
    lists = pc.split_pattern(lines, sep)
    ok = (pc.list_value_length(lists).to_numpy(zero_copy_only=False) == expected)
    kept = lists.filter(pa.array(ok))
    flat = pc.list_flatten(kept)
    base = np.arange(len(kept), dtype=np.int64) * expected
    return [flat.take(pa.array(base + j)) for j in range(expected)], ok


def empty_mask(col: pa.Array) -> np.ndarray:
    return (pc.binary_length(col).to_numpy(zero_copy_only=False) == 0)


def matches(col: pa.Array, pattern: str) -> np.ndarray:
    return pc.match_substring_regex(col, pattern).to_numpy(zero_copy_only=False).astype(bool)


def int_column(col: pa.Array, empty: np.ndarray) -> pa.Array:
    """String column of checked integers -> int64 with nulls where empty."""
    return pc.cast(pc.if_else(pa.array(empty), pa.scalar(None, pa.string()), col), pa.int64())


def _bytes_view(col: pa.Array) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data bytes, start offset, length) of every value of a string array, without copying the data."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_large_string(col.type):
        col = col.cast(pa.string())
    bufs = col.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32)[col.offset: col.offset + len(col) + 1].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return data, offsets[:-1], np.diff(offsets)


_HEX = np.full(256, 0, dtype=np.uint64)
for _c in "0123456789":
    _HEX[ord(_c)] = ord(_c) - 48
for _c in "abcdef":
    _HEX[ord(_c)] = _HEX[ord(_c.upper())] = ord(_c) - 87


def hex_keys(col: pa.Array) -> np.ndarray:
    """``int(value, 16)`` of every (checked, <= 16 hex digits) value as uint64; empty values give 0."""
    data, start, length = _bytes_view(col)
    out = np.zeros(len(length), dtype=np.uint64)
    for j in range(int(length.max()) if len(length) else 0):
        rows = length > j
        out[rows] = (out[rows] << np.uint64(4)) | _HEX[data[start[rows] + j]]
    return out


_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def string_keys(col: pa.Array) -> np.ndarray:
    """64-bit FNV-1a of every value's UTF-8 bytes as uint64 (a stable hash: same value, same key, any run)."""
    data, start, length = _bytes_view(col)
    out = np.full(len(length), _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(length.max()) if len(length) else 0):
            rows = length > j
            out[rows] = (out[rows] ^ data[start[rows] + j].astype(np.uint64)) * _FNV_PRIME
    return out


def row_uniform(seed: int, file_index: int, line_numbers: np.ndarray) -> np.ndarray:
    """A uniform [0, 1) number per (seed, file, line): splitmix64 of the three, so the validation split
    is the same whatever the block size or the machine."""
    with np.errstate(over="ignore"):
        x = (line_numbers.astype(np.uint64) + (np.uint64(file_index) << np.uint64(40))
             + np.uint64(seed % 2**32) * np.uint64(0x9E3779B97F4A7C15))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


# ---- BAD LINES ---- #

@dataclass
class BadLines:
    """Malformed lines, counted per kind, with a few examples (file, line number, text)."""

    counts: Dict[str, int] = field(default_factory=dict)
    examples: List[Dict[str, Any]] = field(default_factory=list)
    lines_read: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, kind: str, path: str, mask: np.ndarray, lines: pa.Array, numbers: np.ndarray, why: str) -> None:
        """Counts the lines where ``mask`` is set as bad of ``kind``; ``why`` says what is wrong in words."""
        n = int(mask.sum())
        if not n:
            return
        self.counts[kind] = self.counts.get(kind, 0) + n
        have = sum(1 for e in self.examples if e["kind"] == kind)
        for i in np.flatnonzero(mask)[: max(0, BAD_EXAMPLES_PER_KIND - have)]:
            self.examples.append({"kind": kind, "file": redact_uri(path), "line": int(numbers[i]), "why": why,
                                  "text": str(lines[int(i)].as_py())[:160]})

    def add_skipped(self, path: str, skipped: List[Tuple[int, str]]) -> None:
        """Lines the reader could not take at all (:attr:`LineReader.skipped`), counted as ``unreadable``."""
        if skipped:
            self.lines_read += len(skipped)
            texts = pa.array([t for _, t in skipped], pa.string())
            self.add("unreadable", path, np.ones(len(skipped), dtype=bool), texts,
                     np.asarray([n for n, _ in skipped], dtype=np.int64), UNREADABLE_WHY)

    def merge(self, other: "BadLines") -> None:
        """Adds the counts of ``other``, the bad lines of later input, and its examples while a kind has room."""
        self.lines_read += other.lines_read
        for kind, n in other.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        for e in other.examples:
            if sum(1 for x in self.examples if x["kind"] == e["kind"]) < BAD_EXAMPLES_PER_KIND:
                self.examples.append(e)

    def fraction(self) -> float:
        return self.total / self.lines_read if self.lines_read else 0.0

    def to_dict(self) -> Dict[str, Any]:
        return {"total": self.total, "fraction": self.fraction(), "by_kind": dict(sorted(self.counts.items())),
                "examples": self.examples}

    def check(self, fmt: str, max_fraction: float, hint: str) -> None:
        """DataError when more than ``max_fraction`` of the lines read were malformed."""
        if self.lines_read == 0 or self.fraction() <= max_fraction:
            return
        kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(self.counts.items()))
        ex = "; ".join(f"{os.path.basename(e['file'])} line {e['line']} ({e['kind']}: {e['why']}): {e['text']!r}"
                       for e in self.examples[:4])
        raise DataError(
            f"{fmt} input: {self.total:,} of {self.lines_read:,} lines ({100 * self.fraction():.2f}%) are malformed, "
            f"above --max-bad-fraction {max_fraction} ({kinds}). E.g. {ex}. {hint} If these lines are expected, "
            f"raise --max-bad-fraction to drop them; nothing was written.", category="malformed_input")


class RowChecks:
    """Counts each malformed row once, under the first check it fails."""

    def __init__(self, bad: BadLines, path: str, lines: pa.Array, numbers: np.ndarray) -> None:
        self.bad, self.path, self.lines, self.numbers = bad, path, lines, numbers
        self.failed = np.zeros(len(lines), dtype=bool)

    def require(self, ok: np.ndarray, kind: str, why: str) -> None:
        new = ~ok & ~self.failed
        self.bad.add(kind, self.path, new, self.lines, self.numbers, why)
        self.failed |= new


# ---- PROGRESS ---- #

class Progress:
    """Progress lines on the ``rayemb.convert`` logger: lines read, lines/s, the file and how far into it."""

    def __init__(self, fmt: str, every_s: float = DEFAULT_PROGRESS_EVERY_S) -> None:
        self.fmt, self.every_s = fmt, every_s
        self.t0 = time.monotonic()
        self._last = self.t0
        self.lines = 0

    def update(self, stage: str, path: str, lines: int, file_bytes: int) -> None:
        self.lines += lines
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        size = storage.size_and_mtime_ns(path)[0]
        where = f" ({100 * min(file_bytes / size, 1):.0f}% of it)" if size and base_name(path) == storage.basename(
            path) else ""
        logger.info("convert %s: %s: %s lines, %s lines/s, at %s%s", self.fmt, stage, f"{self.lines:,}",
                    f"{self.lines / max(now - self.t0, 1e-9):,.0f}", storage.basename(path), where)

    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0
