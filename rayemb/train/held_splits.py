"""Small splits held in Ray's object store: the driver reads them, each rank slices its own rows.

A split of at most :data:`~rayemb.constants.SMALL_SPLIT_MAX_ROWS` rows is read by the driver in one go
(:func:`rayemb.train.outputs.read_splits`) and put into the object store as one Arrow table. Handing it to Ray
Train as a Ray Dataset would cost a split coordinator actor per split and a dataset manager per worker group
(each a process to start and import Ray Data in, seconds on a small machine, for every group a job starts or
restarts); a rank instead maps the table from the object store (no copy on its node) and takes its rows:

* the train split: ``rows // world`` consecutive rows per rank, as Ray Train's ``streaming_split(equal=True)``
  gives each rank equal counts (up to ``world - 1`` rows dropped);
* the valid split: every row, ranks' shares differing by at most one row (validation scores all rows,
  :mod:`rayemb.train.validation`).

A rank's rows come back in batches through :meth:`HeldShard.iter_batches`, the part of Ray Data's
``DataIterator`` that :class:`~rayemb.train.data_loader.RankBatches` uses. An elastic group restarted on
another world size slices the same table again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator


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
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not one of {world} ranks")
        if equal:
            n = self.rows // world
            return rank * n, (rank + 1) * n
        return rank * self.rows // world, (rank + 1) * self.rows // world

    def shard(self, rank: int, world: int, equal: bool) -> "HeldShard":
        import ray

        start, stop = self.bounds(rank, world, equal)
        return HeldShard(ray.get(self.ref).slice(start, stop - start))


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


__all__ = ["HeldSplit", "HeldShard"]
