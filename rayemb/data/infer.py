"""A schema.yaml for a dataset of one's own parquet files: what ``rayemb schema infer`` writes.

The files' types decide each column's kind, and one pass over the values of both splits (train and valid)
decides each sparse table's ids and size:

- **label**: the ``--label`` columns (several: one task each), else the column named ``label``; it must be
  numeric or boolean.
- **dense**: float columns, and boolean ones (read as 0/1). Each gets a transform
  (:mod:`rayemb.data.transforms`) from its train values (nulls as 0), the reason in its report line:
  negatives -> ``standardize`` (``log1p`` would read them as 0); all in ``[0, 1]`` -> ``identity``;
  non-negative with ``max >= HEAVY_TAIL_RATIO x mean`` (counts, a heavy tail) -> ``log1p``, the default, which
  schema.yaml then leaves unsaid; other non-negative values -> ``standardize``. Never ``bucketize`` (the
  boundaries are a modelling choice): add it by hand to the schema written, which then reads as any schema does.
- **sparse**: integer and string columns, one id per row; lists of them are ``multi_hot: true``. Never a
  sequence (say ``sequence: true`` by hand where a list is a history in time order).
- an integer table is **encoded**, ``num_embeddings = max + 1``, when every id lies in ``[0, 2**31)`` and
  ``max + 1 <= ENCODED_SLACK x distinct`` (the table wastes at most 3 rows of 4), or the whole range is small
  (``max + 1 <= ENCODED_SMALL_RANGE`` rows cost little whatever share of them is used);
- every other table (negative ids, ids of 2**31 or more, ranges mostly unused, strings) is **raw**
  (``ids: raw``, ``eviction: lru``) with ``num_embeddings`` = its capacity: the next power of two at least
  twice the distinct ids, at least 2 (room for unseen ids before eviction starts).
- any other type (timestamps, structs, maps, dictionaries, decimals, lists of floats ...) is skipped, named in
  a note; so are columns without a single value.

Distinct ids are counted exactly (``pyarrow.compute.unique`` batch by batch, merged) up to
:data:`EXACT_DISTINCT_MAX` per column, then estimated by the statistics pass's HyperLogLog
(:class:`rayemb.data.sketches.HyperLogLog`, 0.8 % standard error), so a column's memory stays bounded. The
pass reads the files in this process, ``SCAN_BATCH_ROWS`` rows at a time; the label and dense values are
checked as the statistics pass checks them (:class:`rayemb.data.checks.ValueSummary`): bad ones become notes,
since training refuses them.

Example::

    >>> inferred = infer_schema("data/mine", labels=["click"], exclude=["request_id"])
    >>> print("\\n".join(inferred.report()))
    request_id  excluded --exclude
    click       label    --label
    city        sparse   raw: string ids; 40 distinct -> capacity 128 (next power of two >= 2 x distinct), ...
    slot        sparse   encoded: ids in [0, 600], 7 distinct; max+1 <= 65,536 (a small range) -> ...
    price       dense    float column; values in [-3.2, 41.5], negatives: log1p would read them as 0 -> standardize
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from rayemb import storage
from rayemb.constants import LABEL_COLUMN, SCHEMA_FILE, TRAIN_SPLIT, VALID_SPLIT
from rayemb.data.checks import ValueSummary
from rayemb.data.footers import corrupt_file_error, read_footer_schema, read_footers
from rayemb.data.schema import RAW, DatasetSchema, SparseFeature
from rayemb.data.sketches import HyperLogLog
from rayemb.data.transforms import DEFAULT_KIND, IDENTITY, STANDARDIZE, DenseTransform
from rayemb.errors import DataError
from rayemb.logs import redact_uri

#: an integer table is encoded when max + 1 <= ENCODED_SLACK x its distinct ids ...
ENCODED_SLACK = 4
#: ... or when max + 1 is at most this many rows (16 MiB of fp32 rows of dim 64)
ENCODED_SMALL_RANGE = 1 << 16
#: ids from here on are keys, not row numbers: a table of 2**31 rows (fp32, dim 16) would take 128 GiB
ENCODED_MAX_ROWS = 1 << 31
#: distinct values counted exactly per column; beyond, a HyperLogLog estimate (8 MiB of int64 ids at most)
EXACT_DISTINCT_MAX = 1 << 20
#: rows decoded at once per file
SCAN_BATCH_ROWS = 1 << 16
#: a non-negative dense column whose max is at least this many times its mean is heavy-tailed: log1p
HEAVY_TAIL_RATIO = 10.0
LABEL, DENSE, SPARSE, SKIPPED, EXCLUDED = "label", "dense", "sparse", "skipped", "excluded"


def raw_capacity(distinct: int) -> int:
    """A raw table's capacity: the next power of two at least ``2 x distinct``, at least 2."""
    return max(2, 1 << max(0, 2 * int(distinct) - 1).bit_length())


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _type_key(t: pa.DataType) -> str:
    """A column's type for comparing files: a list's item field name and nullability do not matter."""
    return f"{'large_' if pa.types.is_large_list(t) else ''}list<{t.value_type}>" if _is_list(t) else str(t)


def column_kind(t: pa.DataType) -> Tuple[str, str]:
    """(DENSE, SPARSE or SKIPPED, the reason in words) for a parquet column of type ``t`` that is no label."""
    if pa.types.is_floating(t):
        return DENSE, f"{t} column"
    if pa.types.is_boolean(t):
        return DENSE, "bool column, read as 0/1"
    scalar = t.value_type if _is_list(t) else t
    if pa.types.is_integer(scalar) or _is_string(scalar):
        return SPARSE, f"{t}{', multi_hot' if _is_list(t) else ''}"
    hint = ", cast it to string" if pa.types.is_dictionary(t) else ""
    return SKIPPED, (f"type {_type_key(t)} is not supported (dense: float or bool; sparse: integer, string, or a "
                     f"list of them{hint})")


class _Distinct:
    """Distinct values of one column: exact (pyarrow unique, merged) up to EXACT_DISTINCT_MAX, then HyperLogLog."""

    def __init__(self) -> None:
        self.seen: Optional[pa.Array] = None
        self.pending: List[pa.Array] = []
        self.pending_len = 0
        self.hll: Optional[HyperLogLog] = None

    def add(self, values: pa.Array) -> None:
        if self.hll is not None:
            self.hll.add(_int64_ids(values))
            return
        self.pending.append(pc.unique(values))
        self.pending_len += len(self.pending[-1])
        # merged once the pending uniques outgrow what is merged: each value takes part in O(log n) merges
        if self.pending_len > max(SCAN_BATCH_ROWS, 0 if self.seen is None else len(self.seen)):
            self._merge()

    def _merge(self) -> None:
        parts = ([self.seen] if self.seen is not None else []) + self.pending
        self.seen = pc.unique(pa.concat_arrays(parts)) if parts else None
        self.pending, self.pending_len = [], 0
        if self.seen is not None and len(self.seen) > EXACT_DISTINCT_MAX:
            self.hll = HyperLogLog()
            self.hll.add(_int64_ids(self.seen))
            self.seen = None

    def count(self) -> Tuple[int, bool]:
        """(distinct values, whether exact)."""
        if self.hll is None:
            self._merge()
        if self.hll is not None:
            return int(round(self.hll.estimate())), False
        return (0 if self.seen is None else len(self.seen)), True


def _int64_ids(values: pa.Array) -> np.ndarray:
    """Integer values as int64 (uint64 wrapped: still distinct), strings by the raw-id hash."""
    if _is_string(values.type):
        from rayemb.embedding.raw_ids import raw_ids_to_int64

        return raw_ids_to_int64(values)
    return values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


@dataclass
class _SparseScan:
    """What one pass learns of a sparse column: its id range, distinct ids, and nulls inside lists."""

    values: int = 0
    min: Any = None
    max: Any = None
    null_ids: int = 0
    distinct: _Distinct = field(default_factory=_Distinct)

    def add(self, col: pa.Array) -> None:
        if _is_list(col.type):
            col = pc.list_flatten(col)
            self.null_ids += col.null_count
        col = pc.drop_null(col) if col.null_count else col
        if not len(col):
            return
        self.values += len(col)
        self.distinct.add(col)
        if pa.types.is_integer(col.type):
            lo, hi = (v.as_py() for v in pc.min_max(col).values())
            self.min = lo if self.min is None else min(self.min, lo)
            self.max = hi if self.max is None else max(self.max, hi)


def decide_ids(name: str, t: pa.DataType, scan: _SparseScan) -> Tuple[SparseFeature, str]:
    """The feature of a sparse column from its scan, and the rule that decided it, in words."""
    multi_hot = _is_list(t)
    distinct, exact = scan.distinct.count()
    counted = f"{distinct:,} distinct{'' if exact else ' (HyperLogLog estimate)'}"
    if pa.types.is_integer(t.value_type if multi_hot else t):
        rows = scan.max + 1
        span = f"ids in [{scan.min:,}, {scan.max:,}]"
        if scan.min < 0:
            why = f"raw: negative ids ({span})"
        elif rows > ENCODED_MAX_ROWS:
            why = f"raw: {span}, not below 2**31"
        elif rows <= ENCODED_SLACK * distinct:
            return (SparseFeature(name, rows, multi_hot),
                    f"encoded: {span}, {counted}; max+1 <= {ENCODED_SLACK} x distinct -> num_embeddings = max+1")
        elif rows <= ENCODED_SMALL_RANGE:
            return (SparseFeature(name, rows, multi_hot),
                    f"encoded: {span}, {counted}; max+1 <= {ENCODED_SMALL_RANGE:,} (a small range) -> "
                    "num_embeddings = max+1")
        else:
            why = f"raw: {span}; max+1 > {ENCODED_SLACK} x distinct and > {ENCODED_SMALL_RANGE:,}"
    else:
        why = "raw: string ids"
    capacity = raw_capacity(distinct)
    return (SparseFeature(name, capacity, multi_hot, ids=RAW, eviction="lru"),
            f"{why}; {counted} -> capacity {capacity:,} (next power of two >= 2 x distinct), eviction lru")


def propose_transform(name: str, moments: Any) -> Tuple[DenseTransform, str]:
    """The transform of dense column ``name`` from its train values' :class:`~rayemb.data.checks.DenseMoments`
    (None or empty: no values), and why, in words (the rules of the module docstring)."""
    if moments is None or not moments.count:
        return DenseTransform(name, DEFAULT_KIND), f"no finite values -> {DEFAULT_KIND} (the default)"
    span = f"values in [{moments.min:.6g}, {moments.max:.6g}]"
    if moments.min < 0:
        return DenseTransform(name, STANDARDIZE), f"{span}, negatives: log1p would read them as 0 -> standardize"
    if moments.max <= 1:
        return DenseTransform(name, IDENTITY), f"{span} -> identity"
    if moments.max >= HEAVY_TAIL_RATIO * moments.mean:
        return (DenseTransform(name, DEFAULT_KIND),
                f"{span}, mean {moments.mean:.4g}: max >= {HEAVY_TAIL_RATIO:g} x mean (heavy tail) -> log1p")
    return (DenseTransform(name, STANDARDIZE),
            f"{span}, mean {moments.mean:.4g}: no heavy tail (max < {HEAVY_TAIL_RATIO:g} x mean) -> standardize")


@dataclass(frozen=True)
class ColumnDecision:
    name: str
    #: LABEL, DENSE, SPARSE, SKIPPED or EXCLUDED
    kind: str
    #: why, in words
    rule: str


@dataclass
class InferredSchema:
    schema: DatasetSchema
    #: every column of the files, in their order
    columns: List[ColumnDecision]
    #: rows per split scanned
    rows: Dict[str, int]
    #: things to look at before training (skipped columns, values training refuses, a missing split)
    notes: List[str]

    def report(self) -> List[str]:
        """One line per column: name, kind, the rule that decided it."""
        width = max(len(c.name) for c in self.columns)
        return [f"{c.name:<{width}}  {c.kind:<8} {c.rule}" for c in self.columns]

    def yaml_text(self) -> str:
        """schema.yaml's text: the rules as comments above the schema."""
        head = ["# written by `rayemb schema infer` from "
                + ", ".join(f"{n:,} {s} rows" for s, n in self.rows.items()) + "; per column:"]
        head += [f"#   {line}" for line in self.report()]
        # one line per sparse feature (flow style for the innermost mappings), as the docs write schema.yaml
        body = yaml.safe_dump(self.schema.to_dict(), sort_keys=False, default_flow_style=None, width=120)
        return "\n".join(head) + "\n" + body


def _split_files(data_dir: str) -> Dict[str, List[str]]:
    shown = redact_uri(data_dir)
    if not storage.isdir(data_dir):
        raise DataError(f"Data path {shown!r} does not exist or is not a directory; point `rayemb schema infer` "
                        f"at a directory holding {TRAIN_SPLIT}/ and {VALID_SPLIT}/ parquet files.")
    if not storage.isdir(storage.join(data_dir, TRAIN_SPLIT)):
        raise DataError(f"Data path {shown!r} has no {TRAIN_SPLIT}/ split (it holds "
                        f"{sorted(storage.listdir(data_dir))[:8]}); put the training parquet files in "
                        f"{shown}/{TRAIN_SPLIT}/ and the validation ones in {shown}/{VALID_SPLIT}/.")
    files = {s: storage.list_files(storage.join(data_dir, s), ".parquet") for s in (TRAIN_SPLIT, VALID_SPLIT)}
    if not files[TRAIN_SPLIT]:
        raise DataError(f"{shown}/{TRAIN_SPLIT}/ holds no .parquet files; write the training rows there as "
                        "parquet (e.g. pyarrow.parquet.write_table or DataFrame.to_parquet).")
    return files


def _file_columns(files: Sequence[str]) -> Dict[str, pa.DataType]:
    """Every file's columns, which must agree; those of the first file."""
    schemas = read_footers(list(files), read_footer_schema)
    first = {f.name: f.type for f in schemas[0]}
    for path, s in zip(files[1:], schemas[1:]):
        cols = {f.name: f.type for f in s}
        missing, extra = [c for c in first if c not in cols], [c for c in cols if c not in first]
        retyped = [f"{c} ({_type_key(first[c])} vs {_type_key(cols[c])})" for c in first
                   if c in cols and _type_key(first[c]) != _type_key(cols[c])]
        if missing or extra or retyped:
            diff = "; ".join(f"{what} {cs}" for what, cs in (("missing", missing), ("extra", extra),
                                                              ("other types:", retyped)) if cs)
            raise DataError(f"Parquet file {redact_uri(path)!r} has other columns than {redact_uri(files[0])!r}: "
                            f"{diff}. Every file of both splits must have the same columns and types; rewrite "
                            "the odd files (or move them out of the dataset).", category="invalid_schema")
    return first


def _pick_labels(columns: Dict[str, pa.DataType], labels: Optional[Sequence[str]], exclude: Sequence[str]) -> List[str]:
    seen = list(columns)
    unknown = [c for c in exclude if c not in columns]
    if unknown:
        raise DataError(f"--exclude names {unknown}, which the parquet files do not have; their columns: {seen}.")
    picked = list(labels) if labels else [LABEL_COLUMN]
    missing = [c for c in picked if c not in columns]
    if missing:
        what = (f"column(s) {missing}, which --label names" if labels
                else f"column named {LABEL_COLUMN!r} (the label unless --label names another)")
        raise DataError(f"The parquet files have no {what}; their columns: {seen}. Name the label column with "
                        "--label COL (repeat it for several tasks).", category="missing_label")
    for c in picked:
        if c in exclude:
            raise DataError(f"Column {c!r} is both a label and excluded (--exclude); drop one of the two.")
        t = columns[c]
        if not (pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_boolean(t)):
            raise DataError(f"Label column {c!r} has type {t}; a label must be numeric or boolean (0/1). Pick "
                            "another column with --label, or rewrite this one as 0/1.", category="invalid_schema")
    if len(set(picked)) != len(picked):
        raise DataError(f"--label names a column more than once: {picked}.")
    return picked


def _scan(files: Sequence[str], sparse: Dict[str, _SparseScan], labels: List[str], dense: List[str]) -> Tuple[
        int, ValueSummary]:
    """One pass over ``files``: the sparse scans fed, the label and dense values checked; returns the rows."""
    columns = [*labels, *dense, *sparse]
    rows, values = 0, ValueSummary()
    for path in files:
        where, fs = storage.parquet_source(path)
        try:
            for batch in pq.ParquetFile(where, filesystem=fs).iter_batches(
                    batch_size=SCAN_BATCH_ROWS, columns=columns, use_threads=False):
                rows += batch.num_rows
                for name, scan in sparse.items():
                    scan.add(batch.column(name))
                values = values + ValueSummary.of_table(pa.Table.from_batches([batch]), labels, dense)
        except (pa.ArrowException, OSError) as e:
            raise corrupt_file_error(path, e) from None
    return rows, values


def _value_notes(split: str, v: ValueSummary) -> List[str]:
    notes = []
    bad_labels = v.label_nulls + v.label_non_finite + v.label_not_binary
    if bad_labels:
        notes.append(f"{split}: {bad_labels:,} label value(s) are null, NaN or not 0/1 (e.g. {v.label_examples}); "
                     "training refuses them: fix or drop those rows")
    for name, n in sorted(v.dense_non_finite.items()):
        notes.append(f"{split}: dense column {name!r} holds {n:,} NaN or infinite value(s); training refuses them: "
                     "fill them (e.g. with 0)")
    return notes


def infer_schema(data_dir: str, labels: Optional[Sequence[str]] = None, exclude: Sequence[str] = ()) -> InferredSchema:
    """Infers the schema of ``data_dir`` (a path or a URI) by the rules of the module docstring.

    Raises :class:`DataError` for a missing train split or parquet files, a missing or non-numeric label,
    files whose columns differ, and a dataset without a single usable sparse column.
    """
    storage.check_supported(data_dir, "Data path")
    files = _split_files(data_dir)
    columns = _file_columns(files[TRAIN_SPLIT] + files[VALID_SPLIT])
    picked = _pick_labels(columns, labels, exclude)
    decisions: Dict[str, ColumnDecision] = {}
    for name, t in columns.items():
        if name in picked:
            decisions[name] = ColumnDecision(name, LABEL, "--label" if labels else f"the column named {LABEL_COLUMN!r}")
        elif name in exclude:
            decisions[name] = ColumnDecision(name, EXCLUDED, "--exclude")
        else:
            decisions[name] = ColumnDecision(name, *column_kind(t))
    dense = [c for c, d in decisions.items() if d.kind == DENSE]
    scans = {c: _SparseScan() for c, d in decisions.items() if d.kind == SPARSE}
    if not scans:
        raise DataError(f"The parquet files of {redact_uri(data_dir)!r} have no column that can be a sparse feature "
                        f"(integer, string, or a list of them): {[(c, str(t)) for c, t in columns.items()]}. An "
                        "embedding model needs at least one.", category="invalid_schema")
    notes: List[str] = []
    rows: Dict[str, int] = {}
    train_values = ValueSummary()
    for split in (TRAIN_SPLIT, VALID_SPLIT):
        if not files[split]:
            notes.append(f"no {VALID_SPLIT}/ parquet files: the schema is inferred from {TRAIN_SPLIT}/ alone, and "
                         f"training needs a {VALID_SPLIT}/ split too")
            continue
        rows[split], values = _scan(files[split], scans, picked, dense)
        notes += _value_notes(split, values)
        if split == TRAIN_SPLIT:
            train_values = values
    transforms = []
    for name in dense:
        transform, why = propose_transform(name, train_values.dense_moments.get(name))
        decisions[name] = ColumnDecision(name, DENSE, f"{decisions[name].rule}; {why}")
        if transform.kind != DEFAULT_KIND:
            transforms.append(transform)
    features = []
    for name, scan in scans.items():
        if not scan.values:
            decisions[name] = ColumnDecision(name, SKIPPED, "no values in any row (every one is null or empty)")
            continue
        feature, rule = decide_ids(name, columns[name], scan)
        decisions[name] = ColumnDecision(name, SPARSE, rule)
        features.append(feature)
        if scan.null_ids:
            notes.append(f"sparse column {name!r} holds {scan.null_ids:,} null id(s) inside its lists; training "
                         "refuses them: drop them from the lists")
    notes = [f"column {c.name!r} skipped: {c.rule}" for c in decisions.values() if c.kind == SKIPPED] + notes
    if not features:
        raise DataError(f"Every sparse candidate column of {redact_uri(data_dir)!r} is empty ({list(scans)}); an "
                        "embedding model needs at least one sparse feature with values.", category="invalid_schema")
    schema = DatasetSchema(label=picked[0], extra_labels=tuple(picked[1:]), dense=tuple(dense),
                           sparse=tuple(features), dense_transforms=tuple(transforms))
    return InferredSchema(schema, list(decisions.values()), rows, notes)


def default_output(data_dir: str) -> str:
    return storage.join(data_dir, SCHEMA_FILE)


def check_output(path: str, force: bool) -> None:
    """Refuses an existing ``path`` unless ``force`` (checked before the pass, so a refusal costs nothing)."""
    if not force and storage.exists(path):
        raise DataError(f"{redact_uri(path)} already exists; pass --force to replace it, or --out PATH to write the "
                        "inferred schema elsewhere.", category="output_exists")


def write_inferred(inferred: InferredSchema, path: str) -> str:
    """Writes schema.yaml whole or not at all (a temp file renamed, or one upload); returns where it is. In a
    published dataset it goes into a new version (:func:`rayemb.publish.write_file`): writing into the version
    its marker lists would make every reader refuse the dataset as damaged."""
    from rayemb.publish import write_file

    return write_file(path, inferred.yaml_text().encode("utf-8"))


__all__ = ["infer_schema", "InferredSchema", "ColumnDecision", "raw_capacity", "column_kind", "decide_ids",
           "check_output", "write_inferred", "default_output", "ENCODED_SLACK", "ENCODED_SMALL_RANGE",
           "EXACT_DISTINCT_MAX", "HEAVY_TAIL_RATIO", "propose_transform"]
