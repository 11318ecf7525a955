"""A generated dataset made to need dense transforms: columns shifted below 0, transforms declared in schema.yaml."""

from __future__ import annotations

import glob
import os
from typing import Any, Dict


def declare_transforms(data: str, transforms: Dict[str, Any], shift: Dict[str, float]) -> str:
    """Adds ``shift[c]`` to dense column ``c`` in every parquet file of ``data`` (a generated dataset, whose counts
    are >= 0) and writes ``transforms`` as schema.yaml's ``dense_transforms``; returns ``data``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import yaml

    for path in glob.glob(os.path.join(data, "*", "*.parquet")):
        table = pq.read_table(path)
        for c, by in shift.items():
            i = table.column_names.index(c)
            table = table.set_column(i, c, pc.add(table.column(c), pa.scalar(by, pa.float32())))
        pq.write_table(table, path)
    path = os.path.join(data, "schema.yaml")
    with open(path) as f:
        d = yaml.safe_load(f)
    d["dense_transforms"] = transforms
    with open(path, "w") as f:
        yaml.safe_dump(d, f, sort_keys=False)
    return data
