"""Criteo lines parsed column-wise: the Ray engine's parser, with the single-process parser's checks.

pyarrow's CSV reader splits a buffer of whole lines on tabs straight into 40
string columns (lines with another field count go to its invalid-row handler),
then :mod:`rayemb.convert.fields` checks and converts each column in a few numpy
passes. The result is what :meth:`rayemb.convert.criteo.CriteoFormat.parse`
makes of the same lines: the same rows kept, the same keys and dense values, and
every malformed line counted under the same kind with the same example text.
Two cases need the raw bytes, as the single-process reader sees lines whole: a
blank line (which the CSV reader turns into a row of 40 empty fields, while the
line reader counts it as the wrong field count) and a line holding the byte
0x01 (``unreadable`` there, whatever else is wrong with it).

Example::

    >>> rec = parse_block(b"1\\t5\\t...\\n", first_line=1, path="day_0", bad=BadLines())
"""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from rayemb.convert.chunks import line_lengths
from rayemb.convert.common import UNREADABLE_WHY, BadLines, RowChecks, empty_mask, not_text, physical_numbers
from rayemb.convert.criteo import (CATEGORICAL, DENSE, LABEL_WHY, NUM_DENSE, NUM_FIELDS, WRONG_COUNT_WHY,
                                   categorical_why, dense_float32, dense_why)
from rayemb.convert.fields import hex_values, integer_ok
from rayemb.convert.stream import Records

NAMES = ["label", *DENSE, *CATEGORICAL]
#: what pyarrow parses at a time inside one buffer (past about a MiB its parsing slows: cache)
_CSV_BLOCK_BYTES = 1 << 20
_CONVERT = pcsv.ConvertOptions(column_types={n: pa.string() for n in NAMES}, strings_can_be_null=False,
                               quoted_strings_can_be_null=False)


class _JoinedLines:
    """The text of a parsed row (its fields joined by tabs), made only for the few rows an example quotes."""

    def __init__(self, fields: List[pa.Array]) -> None:
        self.fields = fields

    def __len__(self) -> int:
        return len(self.fields[0])

    def __getitem__(self, i: int) -> Any:
        return pa.scalar("\t".join(f[i].as_py() for f in self.fields))


def read_fields(buf: Any, path: str) -> Tuple[List[pa.Array], np.ndarray, List[Tuple[int, str]]]:
    """The 40 string columns of the lines of ``buf`` (of ``path``) that have 40 fields, their 1-based line numbers
    within ``buf``, and ``(number, text)`` of every other line."""
    skipped: List[Tuple[int, str]] = []

    def on_invalid(row: Any) -> str:
        skipped.append((int(row.number), str(row.text)))
        return "skip"

    def read(block_size: int) -> pa.Table:
        skipped.clear()
        return pcsv.read_csv(
            pa.BufferReader(pa.py_buffer(buf)),
            read_options=pcsv.ReadOptions(column_names=NAMES, block_size=block_size, use_threads=False),
            parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False, ignore_empty_lines=False,
                                            invalid_row_handler=on_invalid),
            convert_options=_CONVERT)

    try:
        try:
            table = read(_CSV_BLOCK_BYTES)
        except pa.ArrowInvalid as e:
            if "straddl" not in str(e):
                raise
            table = read(len(buf) + 1)  # a line longer than the reader's block: the whole buffer at once
    except (pa.ArrowInvalid, OSError) as e:
        raise not_text(path, e) from None
    fields = [table.column(i).combine_chunks() for i in range(NUM_FIELDS)]
    return fields, physical_numbers(0, table.num_rows, [n for n, _ in skipped]), skipped


def _add_lines(bad: BadLines, kind: str, path: str, lines: List[Tuple[int, str]], why: str) -> None:
    """Counts whole lines ``(number, text)`` as bad of ``kind``, the examples in line order."""
    lines = sorted(lines)
    bad.add(kind, path, np.ones(len(lines), dtype=bool), pa.array([t for _, t in lines], pa.string()),
            np.asarray([n for n, _ in lines], dtype=np.int64), why)


def parse_block(buf: Any, first_line: int, path: str, bad: BadLines) -> Records:
    """Records of the well-formed lines of ``buf`` (whole lines, the first numbered ``first_line`` in ``path``);
    the others are counted in ``bad``."""
    fields, numbers, skipped = read_fields(buf, path)
    bad.lines_read += len(numbers) + len(skipped)
    offset = first_line - 1
    label_ok = pc.is_in(fields[0], value_set=pa.array(["0", "1"])).to_numpy(zero_copy_only=False)
    empties = [empty_mask(f) for f in fields]
    oks = [label_ok]
    for j in range(1, 1 + NUM_DENSE):
        oks.append(empties[j] | integer_ok(fields[j]))
    keys = {}
    for j, name in enumerate(CATEGORICAL, start=1 + NUM_DENSE):
        keys[name], hex_ok = hex_values(fields[j])
        oks.append(empties[j] | hex_ok)
    good = np.logical_and.reduce(oks) if len(numbers) else np.ones(0, dtype=bool)
    wrong = [(n + offset, t) for n, t in skipped if "\x01" not in t]
    unreadable = [(n + offset, t) for n, t in skipped if "\x01" in t]
    if not good.all():
        lines = _JoinedLines(fields)
        taken = np.zeros(len(numbers), dtype=bool)
        for i in np.flatnonzero(~good):
            text = lines[int(i)].as_py()
            if "\x01" in text:
                unreadable.append((int(numbers[i]) + offset, text))
                taken[i] = True
            elif text == "\t" * (NUM_FIELDS - 1) and line_lengths(buf, numbers[i:i + 1])[0] == 0:
                wrong.append((int(numbers[i]) + offset, ""))  # a blank line
                taken[i] = True
        checks = RowChecks(bad, path, lines, numbers + offset)
        checks.failed = taken
        checks.require(label_ok, "label", LABEL_WHY)
        for j, name in enumerate(DENSE, start=1):
            checks.require(oks[j], "dense", dense_why(name))
        for j, name in enumerate(CATEGORICAL, start=1 + NUM_DENSE):
            checks.require(oks[j], "categorical", categorical_why(name))
        good = ~checks.failed
    _add_lines(bad, "wrong_field_count", path, wrong, WRONG_COUNT_WHY)
    _add_lines(bad, "unreadable", path, unreadable, UNREADABLE_WHY)
    if not good.all():
        mask = pa.array(good)
        fields = [f.filter(mask) for f in fields]
        keys = {name: k[good] for name, k in keys.items()}
        empties = [e[good] for e in empties]
    label = pc.equal(fields[0], "1").to_numpy(zero_copy_only=False).astype(np.float32)
    dense = {name: dense_float32(fields[j], empties[j]) for j, name in enumerate(DENSE, start=1)}
    sparse = {name: (keys[name], empties[j]) for j, name in enumerate(CATEGORICAL, start=1 + NUM_DENSE)}
    return Records(numbers=numbers[good] + offset, label=label, dense=dense, keys=sparse, direct={})
