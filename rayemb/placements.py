"""The names of where a table's rows live, shared by the planner that picks them and the modules that hold them.

Below both :mod:`rayemb.planner` (which imports the embedding modules to size
them) and :mod:`rayemb.embedding` (whose hybrid module shards its cold half with
one of :data:`HYBRID_COLD_PLACEMENTS`), and free of torch, so each names a
placement the same way without importing the other::

    >>> Placement("row_wise").is_pooled_model_parallel, Placement.HYBRID.is_pooled_model_parallel
    (True, False)
"""

from __future__ import annotations

import enum
from typing import Tuple


class Placement(str, enum.Enum):
    """Where a table's rows live. The pooled model-parallel kinds are TorchRec's sharding types."""

    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    COLUMN_WISE = "column_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"
    HYBRID = "hybrid"  # hot rows data-parallel, cold rows sharded with per-id exchange

    @property
    def is_pooled_model_parallel(self) -> bool:
        return self not in (Placement.DATA_PARALLEL, Placement.HYBRID)


#: shardings of a hybrid table's cold half (TorchRec ``EmbeddingCollection`` shardings on CPU and GPU)
HYBRID_COLD_PLACEMENTS: Tuple[Placement, ...] = (Placement.ROW_WISE, Placement.TABLE_WISE, Placement.COLUMN_WISE)


__all__ = ["HYBRID_COLD_PLACEMENTS", "Placement"]
