"""Avazu click logs (Kaggle ``train``, CSV with a header) -> a rayemb dataset.

The header names the columns: ``id,click,hour,C1,banner_pos,site_id,...,C21``.
``click`` is the label (0/1); ``id`` is dropped (unique per row); ``hour`` is
``YYMMDDHH`` and becomes two small categorical tables, ``hour_of_day`` (24 ids)
and ``day_of_week`` (7 ids, Monday = 0), plus the dense column
``hour_of_day_num`` (the hour as a number): rayemb's DLRM feeds its bottom MLP
with at least one dense feature, and Avazu has none of its own. Every other
column is categorical: its string value gets a stable 64-bit FNV-1a key, then an
id by ``--hash-buckets N`` (``key % N``) or ``--vocab-from-train`` (frequency
rank); an empty value is an empty bag.

``--valid-days D ...`` sends the rows dated on day-of-month ``D`` to validation
(Avazu's ``train`` spans 2014-10-21 .. 2014-10-30, so ``--valid-days 30`` keeps the
last day out), else ``--valid-fraction`` or ``--valid-input`` as for Criteo.

Example::

    >>> convert_avazu(ConvertOptions(inputs=("train.gz",), out="data/avazu", vocab_from_train=True, min_count=5,
    ...                              valid_days=(30,)))
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayemb.convert.common import (BadLines, ConvertOptions, RowChecks, empty_mask, matches, split_fields,
                                   string_keys)
from rayemb.convert.stream import Records, StreamFormat, convert_stream
from rayemb.errors import DataError
from rayemb.logs import redact_uri

LABEL, HOUR, ID = "click", "hour", "id"
DERIVED = {"hour_of_day": 24, "day_of_week": 7}
DENSE_HOUR = "hour_of_day_num"


class AvazuFormat(StreamFormat):
    name = "avazu"
    has_header = True
    days_by_row = True
    dense = [DENSE_HOUR]
    direct_tables = dict(DERIVED)
    hint = ("Avazu lines are comma-separated with the header's field count: a 0/1 click and an 8-digit hour "
            "YYMMDDHH.")

    def __init__(self) -> None:
        self.columns: Optional[List[str]] = None
        self.key_tables: List[str] = []

    def inspect(self, path: str, head: List[str]) -> None:
        columns = [c.strip() for c in head[0].split(",")]
        if self.columns is not None and columns != self.columns:
            raise DataError(f"Input {redact_uri(path)!r} has the header {columns}, unlike the first input's "
                            f"{self.columns}; convert files with the same columns together.", category="wrong_format")
        missing = [c for c in (LABEL, HOUR) if c not in columns]
        if missing:
            test_file = " (Avazu's test file has no click column: it cannot be trained on)" if LABEL in missing else ""
            raise DataError(f"Input {redact_uri(path)!r} does not look like Avazu data: its header "
                            f"{head[0][:160]!r} lacks {missing}{test_file}. The first line must be the CSV header "
                            "id,click,hour,C1,...",
                            category="wrong_format")
        clash = [c for c in columns if c in DERIVED or c == DENSE_HOUR]
        if clash:
            raise DataError(f"Input {redact_uri(path)!r} has column(s) {clash}, names this converter derives from "
                            "'hour'; rename them in the header.", category="wrong_format")
        self.columns = columns
        self.key_tables = [c for c in columns if c not in (LABEL, HOUR, ID)]
        if len(head) > 1:
            scratch = BadLines()
            rec = self.parse(pa.array(head[1:], pa.string()), np.arange(2, len(head) + 1), path, scratch)
            if len(rec.label) * 2 < len(head) - 1:
                raise DataError(f"Input {redact_uri(path)!r} does not look like Avazu data: {scratch.total} of the "
                                f"first {len(head) - 1} rows are malformed ({dict(scratch.counts)}); line 2 is "
                                f"{head[1][:120]!r}. {self.hint}", category="wrong_format")

    def notes(self) -> Dict[str, Any]:
        return {"hour": "YYMMDDHH -> hour_of_day (0-23) and day_of_week (Monday = 0) tables, and the dense "
                        f"{DENSE_HOUR} (rayemb applies log1p at batch time)",
                "categorical": "FNV-1a 64 of the string value, then % hash_buckets or vocabulary rank; empty -> null",
                "dropped": [ID]}

    def parse(self, lines: pa.Array, numbers: np.ndarray, path: str, bad: BadLines) -> Records:
        cols = self.columns or []
        fields, ok = split_fields(lines, ",", len(cols))
        bad.add("wrong_field_count", path, ~ok, lines, numbers, f"not {len(cols)} comma-separated fields")
        at = {c: fields[i] for i, c in enumerate(cols)}
        checks = RowChecks(bad, path, lines.filter(pa.array(ok)), numbers[ok])
        checks.require(pc.is_in(at[LABEL], pa.array(["0", "1"])).to_numpy(zero_copy_only=False), "label",
                       "click is not 0 or 1")
        hour_ok, hour, weekday, day = _parse_hours(at[HOUR])
        checks.require(hour_ok, "hour", "hour is not a valid YYMMDDHH")
        good = ~checks.failed
        mask = pa.array(good)
        label = pc.equal(at[LABEL].filter(mask), "1").to_numpy(zero_copy_only=False).astype(np.float32)
        keys: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
        for c in self.key_tables:
            values = at[c].filter(mask)
            keys[c] = (string_keys(values), empty_mask(values))
        return Records(numbers=checks.numbers[good], label=label,
                       dense={DENSE_HOUR: pa.array(hour[good].astype(np.float32))}, keys=keys,
                       direct={"hour_of_day": hour[good], "day_of_week": weekday[good]}, day=day[good])


def _parse_hours(col: pa.Array) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ok, hour of day, day of week, day of month) of ``YYMMDDHH`` strings; strptime alone would accept
    ``14023100`` as March 3rd, so the parsed date must give back the digits it came from."""
    ok = matches(col, r"^[0-9]{8}$")
    text = pc.if_else(pa.array(ok), col, "70010100")
    ts = pc.strptime(text, format="%y%m%d%H", unit="s", error_is_null=True)
    digits = [pc.cast(pc.utf8_slice_codeunits(text, i, i + 2), pa.int64()).to_numpy(zero_copy_only=False)
              for i in (2, 4, 6)]
    parsed = [pc.fill_null(f(ts), -1).to_numpy(zero_copy_only=False) for f in (pc.month, pc.day, pc.hour)]
    for want, got in zip(digits, parsed):
        ok &= want == got
    weekday = pc.fill_null(pc.day_of_week(ts), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    hour = np.where(ok, parsed[2], 0).astype(np.int64)
    return ok, hour, np.where(ok, weekday, 0), np.where(ok, parsed[1], 0).astype(np.int64)


def convert_avazu(opts: ConvertOptions) -> Dict[str, Any]:
    """Avazu CSV inputs -> parquet + schema.yaml at ``opts.out``; returns the conversion summary."""
    return convert_stream(AvazuFormat(), opts)
