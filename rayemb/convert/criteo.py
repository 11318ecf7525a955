"""Criteo click logs (Kaggle ``train.txt``, the 1TB ``day_0`` .. ``day_23``) -> a rayemb dataset.

Each line: ``label \\t I1 .. I13 \\t C1 .. C26`` — 40 tab-separated fields, no
header; the label is 0/1, ``I*`` are integer counts (may be empty or negative),
``C*`` are 32-bit categories written as 8 hex digits (may be empty).

- dense ``I*`` are written as they are (float32, empty -> null). rayemb's
  :class:`~rayemb.data.batching.BatchConverter` applies ``log1p(max(x, 0))`` (nulls
  read as 0) when it builds a batch, the DLRM reference's transform, so the files
  keep the raw counts and the log is applied exactly once;
- ``C*`` become ids: ``int(hex, 16) % N`` (``--hash-buckets N``),
  frequency-ranked vocabulary ids (``--vocab-from-train``) or ``int(hex, 16)``
  itself (``--ids raw``), empty -> null (an empty bag);
- ``--valid-days 23`` makes the inputs named ``day_23`` (``.gz`` allowed) the
  validation split, the 1TB convention.

A line is malformed (dropped, counted by kind) when it does not have 40 fields,
its label is not 0/1, a dense field is not an integer, or a categorical field is
not hex.

This module is the single-process engine's parser (a regex per column);
:mod:`rayemb.convert.criteo_columns` parses the same lines column-wise for the
Ray engine (:mod:`rayemb.convert.ray_engine`), with the same checks.

Example::

    >>> convert_criteo(ConvertOptions(inputs=("day_0", "day_1", "day_23"), out="data/criteo1tb",
    ...                               hash_buckets=40_000_000, valid_days=(23,)))
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayemb.convert.common import (BadLines, ConvertOptions, RowChecks, base_name, empty_mask, hex_keys, int_column,
                                   matches, split_fields)
from rayemb.convert.stream import Records, StreamFormat, convert_stream
from rayemb.errors import DataError
from rayemb.logs import redact_uri

NUM_DENSE, NUM_CATEGORICAL = 13, 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_CATEGORICAL
DENSE = [f"I{i + 1}" for i in range(NUM_DENSE)]
CATEGORICAL = [f"C{i + 1}" for i in range(NUM_CATEGORICAL)]
#: why a line is malformed, in the words of the summary's examples (both engines)
WRONG_COUNT_WHY = f"not {NUM_FIELDS} tab-separated fields"
LABEL_WHY = "the label is not 0 or 1"
_INT = r"^-?[0-9]{1,18}$"
_HEX = r"^[0-9a-fA-F]{1,16}$"


class CriteoFormat(StreamFormat):
    name = "criteo"
    has_header = False
    days_by_row = False
    dense = DENSE
    key_tables = CATEGORICAL
    direct_tables: Dict[str, int] = {}
    hint = ("Criteo lines are 40 tab-separated fields with no header: a 0/1 label, 13 integers, 26 hex "
            "categories (empty fields allowed).")

    def inspect(self, path: str, head: List[str]) -> None:
        scratch = BadLines()
        lines = pa.array(head, pa.string())
        rec = self.parse(lines, np.arange(1, len(head) + 1), path, scratch)
        if len(rec.label) * 2 >= len(head):
            return
        first = head[0]
        extra = ""
        if "," in first and "\t" not in first:
            extra = (" It looks comma-separated with a header line (like the 200-row sample): write it tab-separated "
                     "without the header first.")
        elif sum(line.count("\t") == NUM_FIELDS - 2 for line in head) * 2 >= len(head):
            extra = " Its lines have 39 fields: Kaggle's test.txt has no label column and cannot be trained on."
        raise DataError(f"Input {redact_uri(path)!r} does not look like Criteo data: {scratch.total} of the first "
                        f"{len(head)} lines are malformed ({dict(scratch.counts)}); line 1 is {first[:120]!r}. "
                        f"{self.hint}{extra}", category="wrong_format")

    def file_is_valid(self, path: str, days: Tuple[int, ...]) -> bool:
        return any(base_name(path).endswith(f"day_{d}") for d in days)

    def notes(self) -> Dict[str, Any]:
        return {"dense": "raw integer counts as float32, empty -> null; rayemb applies log1p(max(x, 0)) at batch "
                         "time (nulls read as 0)",
                "categorical": "int(hex, 16) % hash_buckets, vocabulary rank by train frequency, or int(hex, 16) "
                               "itself (--ids raw); empty -> null"}

    def parse(self, lines: pa.Array, numbers: np.ndarray, path: str, bad: BadLines) -> Records:
        fields, ok = split_fields(lines, "\t", NUM_FIELDS)
        bad.add("wrong_field_count", path, ~ok, lines, numbers, WRONG_COUNT_WHY)
        keep = pa.array(ok)
        checks = RowChecks(bad, path, lines.filter(keep), numbers[ok])
        checks.require(pc.is_in(fields[0], pa.array(["0", "1"])).to_numpy(zero_copy_only=False), "label",
                       LABEL_WHY)
        empties = [empty_mask(f) for f in fields]
        for j, name in enumerate(DENSE, start=1):
            checks.require(empties[j] | matches(fields[j], _INT), "dense", dense_why(name))
        for j, name in enumerate(CATEGORICAL, start=1 + NUM_DENSE):
            checks.require(empties[j] | matches(fields[j], _HEX), "categorical", categorical_why(name))
        good = ~checks.failed
        mask = pa.array(good)
        label = (pc.equal(fields[0].filter(mask), "1").to_numpy(zero_copy_only=False)).astype(np.float32)
        dense = {name: dense_float32(fields[j].filter(mask), empties[j][good]) for j, name in enumerate(DENSE, start=1)}
        keys = {name: (hex_keys(fields[j].filter(mask)), empties[j][good])
                for j, name in enumerate(CATEGORICAL, start=1 + NUM_DENSE)}
        return Records(numbers=checks.numbers[good], label=label, dense=dense, keys=keys, direct={})


def dense_why(name: str) -> str:
    return f"{name} is not an integer"


def categorical_why(name: str) -> str:
    return f"{name} is not hexadecimal"


def dense_float32(col: pa.Array, empty: np.ndarray) -> pa.Array:
    """Checked integer strings -> float32, null where empty. Counts above 2**24 (some of Kaggle's I5) round to the
    nearest float32, as any float32 column would hold them, instead of failing the cast."""
    return pc.cast(int_column(col, empty), pa.float32(), safe=False)


def convert_criteo(opts: ConvertOptions) -> Dict[str, Any]:
    """Criteo TSV inputs -> parquet + schema.yaml at ``opts.out``; returns the conversion summary."""
    return convert_stream(CriteoFormat(), opts)
