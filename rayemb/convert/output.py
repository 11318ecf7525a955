"""Writing a converted dataset atomically: a staging folder, published at the end.

:class:`StagedOutput` refuses an existing ``--out`` (unless ``overwrite``)
before any work starts, builds the dataset in ``<out>.partial-XXXX`` next to it
(a local temp folder for a URI), and only :meth:`StagedOutput.commit` makes it
the dataset at ``<out>`` (:func:`rayemb.publish.publish_dir`: one rename
locally; in a bucket a new version under ``<out>/_v/`` made visible by its
``_PUBLISHED.json`` marker, the old dataset readable until then); on any error
the staging folder is removed, so a failed conversion leaves nothing behind.
:class:`PartWriter` streams one split into ``part-00000.parquet, ...`` of at
most ``rows_per_file`` rows, one row group per chunk it is given, so memory
holds a chunk, not a part. :class:`PartPlan` cuts a split's rows into the same
parts for writers elsewhere (the Ray engine's tasks), which write each part
with :func:`write_part`.

Example::

    >>> with StagedOutput("data/criteo", overwrite=False) as stage:
    ...     w = PartWriter(stage.split_dir("train"), arrow_schema, rows_per_file=1_000_000)
    ...     w.write(table); w.close()
    ...     finish(stage.path, schema, summary)   # schema.yaml, convert_summary.json, load_checked
    ...     stage.commit()
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Dict, Generic, List, Optional, Sequence, Tuple, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from rayemb import storage
from rayemb.data.schema import DatasetSchema, load_checked
from rayemb.errors import ConfigError
from rayemb.logs import redact_uri
from rayemb.publish import has_output, publish_dir

SUMMARY_FILE = "convert_summary.json"
Source = TypeVar("Source")


def arrow_schema(schema: DatasetSchema) -> pa.Schema:
    """The parquet column types rayemb trains on: label and dense float32, sparse int64 or list<int64>, sequences list<int64>."""
    fields = [pa.field(schema.label, pa.float32()), *(pa.field(c, pa.float32()) for c in schema.dense)]
    fields += [pa.field(f.name, pa.list_(pa.int64()) if f.multi_hot else pa.int64()) for f in schema.sparse]
    fields += [pa.field(f.name, pa.list_(pa.int64())) for f in schema.sequence]
    return pa.schema(fields)


class StagedOutput:
    """A dataset folder that appears complete or not at all.

    Built in a staging folder next to ``out`` and renamed into place; for a URI (``s3://...``) built in a
    local temp folder and published as a new version (:mod:`rayemb.publish`); with ``overwrite`` the old
    dataset stays readable until the new one is, and is deleted after.
    """

    def __init__(self, out: str, overwrite: bool = False) -> None:
        self.remote = storage.is_remote(out)
        self.out = storage.abspath(out)
        self.overwrite = overwrite
        self.path: Optional[str] = None
        shown = redact_uri(out)
        if storage.isfile(self.out):
            raise ConfigError(f"--out {shown!r} is a file; give a directory path for the dataset.",
                              category="out_exists")
        if has_output(self.out) and not overwrite:
            raise ConfigError(f"--out {shown!r} already exists and is not empty; pass --overwrite to replace it, or "
                              "choose another directory.", category="out_exists")

    def __enter__(self) -> "StagedOutput":
        if self.remote:
            self.path = tempfile.mkdtemp(prefix="rayemb-convert-")
            return self
        parent = os.path.dirname(self.out)
        os.makedirs(parent, exist_ok=True)
        self.path = tempfile.mkdtemp(prefix=os.path.basename(self.out) + ".partial-", dir=parent)
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(self.path, 0o777 & ~umask)  # mkdtemp makes it private; the dataset is an ordinary folder
        return self

    def split_dir(self, split: str) -> str:
        d = os.path.join(self.path, split)
        os.makedirs(d, exist_ok=True)
        return d

    def commit(self) -> None:
        """Publishes the staging folder as ``out`` (replacing an old dataset only now, when overwrite was asked)."""
        publish_dir(self.path, self.out, overwrite=self.overwrite)
        self.path = None

    def __exit__(self, *exc: Any) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


class PartWriter:
    """``part-NNNNN.parquet`` files of at most ``rows_per_file`` rows, written chunk by chunk."""

    def __init__(self, directory: str, schema: pa.Schema, rows_per_file: int) -> None:
        self.directory, self.schema, self.rows_per_file = directory, schema, rows_per_file
        self.rows = 0
        self.files: List[str] = []
        self._writer: Optional[pq.ParquetWriter] = None
        self._in_part = 0

    def write(self, table: pa.Table) -> None:
        table = _as_schema(table, self.schema)
        start = 0
        while start < table.num_rows:
            if self._writer is None:
                path = os.path.join(self.directory, part_name(len(self.files)))
                self._writer = pq.ParquetWriter(path, self.schema)
                self.files.append(path)
                self._in_part = 0
            n = min(table.num_rows - start, self.rows_per_file - self._in_part)
            self._writer.write_table(table.slice(start, n))
            start += n
            self._in_part += n
            self.rows += n
            if self._in_part >= self.rows_per_file:
                self._close_part()

    def _close_part(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> int:
        self._close_part()
        return self.rows


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def _as_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    return table.select(schema.names).cast(schema)


class PartPlan(Generic[Source]):
    """The part files of one split, cut as :class:`PartWriter` cuts them (``rows_per_file`` rows each, rows in
    the order they are added), for rows written elsewhere. :meth:`add` takes the next ``rows`` rows, held by
    ``source``, and returns the parts they complete; :meth:`close` the last, shorter one. A part is
    ``(index, [(source, start, stop), ...])``: the rows ``[start, stop)`` of each source, in order."""

    def __init__(self, rows_per_file: int) -> None:
        self.rows_per_file = rows_per_file
        self.rows = 0
        self._index = 0
        self._pieces: List[Tuple[Source, int, int]] = []
        self._in_part = 0

    def add(self, source: Source, rows: int) -> List[Tuple[int, List[Tuple[Source, int, int]]]]:
        done = []
        start = 0
        while start < rows:
            n = min(rows - start, self.rows_per_file - self._in_part)
            self._pieces.append((source, start, start + n))
            start += n
            self._in_part += n
            self.rows += n
            if self._in_part >= self.rows_per_file:
                done.append(self._cut())
        return done

    def _cut(self) -> Tuple[int, List[Tuple[Source, int, int]]]:
        part = (self._index, self._pieces)
        self._index, self._pieces, self._in_part = self._index + 1, [], 0
        return part

    def close(self) -> List[Tuple[int, List[Tuple[Source, int, int]]]]:
        return [self._cut()] if self._pieces else []


def write_part(path: str, schema: pa.Schema, tables: Sequence[pa.Table]) -> int:
    """One part file of ``tables``' rows, in order, one row group per table (as :class:`PartWriter` writes a
    chunk); returns its rows."""
    with pq.ParquetWriter(path, schema) as writer:
        for table in tables:
            writer.write_table(_as_schema(table, schema))
    return sum(t.num_rows for t in tables)


def finish(path: str, schema: DatasetSchema, summary: Dict[str, Any]) -> None:
    """Writes ``schema.yaml`` and ``convert_summary.json`` into the staging folder and checks the dataset
    the way ``rayemb train`` will (:func:`rayemb.data.schema.load_checked`)."""
    schema.save(path)
    with open(os.path.join(path, SUMMARY_FILE), "w") as f:
        json.dump(summary, f, indent=1, default=_jsonable)
    load_checked(path)


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)
