"""Small splits held in Ray's object store: the driver reads them, each rank slices its own rows.

A split of at most :data:`~rayemb.constants.SMALL_SPLIT_MAX_ROWS` rows is read by the driver in one go
(:func:`rayemb.train.driver.outputs.read_splits`) and put into the object store as one Arrow table. Handing it to Ray
Train as a Ray Dataset would cost a split coordinator actor per split and a dataset manager per worker group
(each a process to start and import Ray Data in, seconds on a small machine, for every group a job starts or
restarts); a rank instead maps the table from the object store (no copy on its node) and takes its rows:

* the train split: ``rows // world`` consecutive rows per rank, as Ray Train's ``streaming_split(equal=True)``
  gives each rank equal counts (up to ``world - 1`` rows dropped);
* the valid split: every row, ranks' shares differing by at most one row (validation scores all rows,
  :mod:`rayemb.train.worker.validation`).

A rank's rows come back in batches through :meth:`HeldShard.iter_batches`, the part of Ray Data's
``DataIterator`` that :class:`~rayemb.train.worker.data_loader.RankBatches` uses. An elastic group restarted on
another world size slices the same table again.

A split too large for the driver to hold whose rank shards still fit in the ranks' memory (``data.in_memory``)
is a :class:`FileSplit`: the driver reads only the files' footers (rows per file), and each rank reads the row
groups holding its own rows straight from storage, with the same bounds. Ray Data's read tasks, split
coordinator and per-worker dataset manager are then not started at all; they pay off for streamed data, whose
shard is read as it trains, not for a shard read once and kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Tuple


@dataclass(frozen=True)
class HeldSplit:
    """One split as an object-store reference to its Arrow table (one chunk per column) and its row count."""

    ref: Any
    rows: int

    @classmethod
    def put(cls, table: Any) -> "HeldSplit":
        import ray

        table = table.combine_chunks()  # a rank's slice is then one contiguous chunk per column
        return cls(ray.put(table), table.num_rows)

    def bounds(self, rank: int, world: int, equal: bool) -> tuple:
        """The [start, stop) rows of ``rank`` of ``world``: equal counts, or every row (module docstring)."""
        return _bounds(self.rows, rank, world, equal)

    def shard(self, rank: int, world: int, equal: bool) -> "HeldShard":
        import ray

        start, stop = self.bounds(rank, world, equal)
        return HeldShard(ray.get(self.ref).slice(start, stop - start))


@dataclass(frozen=True)
class FileSplit:
    """One split as parquet files and their row counts; each rank reads its own rows (module docstring).

    ``fs``: the files' pyarrow filesystem (None: local paths), as Ray Data's read tasks would receive it.
    """

    paths: Tuple[str, ...]
    file_rows: Tuple[int, ...]
    fs: Any = None

    @classmethod
    def of(cls, paths: Any, fs: Any = None) -> "FileSplit":
        import pyarrow.parquet as pq

        return cls(tuple(paths), tuple(pq.read_metadata(p, filesystem=fs).num_rows for p in paths), fs)

    @property
    def rows(self) -> int:
        return sum(self.file_rows)

    def bounds(self, rank: int, world: int, equal: bool) -> tuple:
        return _bounds(self.rows, rank, world, equal)

    def shard(self, rank: int, world: int, equal: bool) -> "HeldShard":
        """The rank's rows: only the row groups that hold them are read."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        start, stop = self.bounds(rank, world, equal)
        pieces, first = [], 0  # ``first``: the split's row number of the current row group's first row
        for path, n in zip(self.paths, self.file_rows):
            if first + n <= start or first >= stop:
                first += n
                continue
            f = pq.ParquetFile(path, filesystem=self.fs)
            for g in range(f.num_row_groups):
                g_rows = f.metadata.row_group(g).num_rows
                lo, hi = max(start, first), min(stop, first + g_rows)
                if lo < hi:
                    pieces.append(f.read_row_group(g).slice(lo - first, hi - lo))
                first += g_rows
        if not pieces:  # a rank with no rows still gets the columns
            return HeldShard(pq.read_schema(self.paths[0], filesystem=self.fs).empty_table())
        return HeldShard(pa.concat_tables(pieces).combine_chunks())


def _bounds(rows: int, rank: int, world: int, equal: bool) -> tuple:
    """The [start, stop) rows of ``rank`` of ``world`` in a split of ``rows``: equal counts, or every row."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of {world} ranks")
    if equal:
        n = rows // world
        return rank * n, (rank + 1) * n
    return rank * rows // world, (rank + 1) * rows // world


class HeldShard:
    """A rank's rows of a :class:`HeldSplit`, read in batches like a Ray Data shard."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def iter_batches(self, *, batch_size: int, batch_format: str = "pyarrow", drop_last: bool = False,
                     **_: Any) -> Iterator[Any]:
        if batch_format != "pyarrow":
            raise ValueError(f"a held split gives pyarrow batches, not {batch_format!r}")
        n = self.table.num_rows
        for start in range(0, n, batch_size):
            if drop_last and start + batch_size > n:
                return
            yield self.table.slice(start, min(batch_size, n - start))


__all__ = ["HeldSplit", "FileSplit", "HeldShard"]
