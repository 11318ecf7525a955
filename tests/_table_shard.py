"""A rank's rows as a Ray Data shard, without Ray: what the dist tests hand to ``RankBatches``."""

from __future__ import annotations

import pyarrow as pa


class TableShard:
    """A rank's share of the rows, read the way Ray Data's ``DataIterator.iter_batches`` reads it: batches of
    ``batch_size`` rows, the last one short unless ``drop_last``."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def iter_batches(self, *, batch_size: int, batch_format: str, drop_last: bool, prefetch_batches: int):
        assert batch_format == "pyarrow"
        for lo in range(0, self.table.num_rows, batch_size):
            batch = self.table.slice(lo, batch_size)
            if drop_last and batch.num_rows < batch_size:
                return
            yield batch
