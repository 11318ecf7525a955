"""Arrow tables, in order, into ``part-NNNNN.parquet`` files of a bounded size: how a process that receives a
dataset's blocks one at a time (the driver gathering Ray Data's blocks from every node) writes them.

Example::

    >>> with PartWriter("/tmp/out/train") as parts:
    ...     for table in tables:
    ...         parts.write(table)
    >>> parts.files
    3
"""

from __future__ import annotations

import os
from typing import Any, Optional

#: rows a part file holds at most (the same size ``rayemb convert`` writes)
ROWS_PER_FILE = 1_000_000


class PartWriter:
    """Writes tables into ``folder/part-NNNNN.parquet``, each file at most ``rows_per_file`` rows; a table whose
    schema differs from the open file's (inputs that disagree on a column's type) starts a new file."""

    def __init__(self, folder: str, rows_per_file: int = ROWS_PER_FILE) -> None:
        self.folder, self.rows_per_file = folder, rows_per_file
        #: files started so far
        self.files = 0
        self._writer: Optional[Any] = None
        self._in_file = 0

    def write(self, table: Any) -> None:
        import pyarrow.parquet as pq

        while table.num_rows:
            if self._writer is None or self._in_file == self.rows_per_file or \
                    not table.schema.equals(self._writer.schema):
                self.close()
                self._writer = pq.ParquetWriter(os.path.join(self.folder, f"part-{self.files:05d}.parquet"),
                                                table.schema)
                self.files, self._in_file = self.files + 1, 0
            take = min(table.num_rows, self.rows_per_file - self._in_file)
            self._writer.write_table(table.slice(0, take))
            self._in_file, table = self._in_file + take, table.slice(take)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> "PartWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["PartWriter", "ROWS_PER_FILE"]
