"""Datasets of "one's own" parquet files: converted ones with their columns renamed and no schema.yaml."""

from __future__ import annotations

import os
from typing import Dict

import pyarrow.parquet as pq

from tests._convert_engines import sample_lines, write_text

#: Criteo's columns under other names: what a user's own export of the same data could call them
CRITEO_RENAMES = {**{f"I{i}": f"num_{i}" for i in range(1, 14)}, **{f"C{i}": f"cat_{i}" for i in range(1, 27)}}


def renamed_copy(src: str, dst: str, renames: Dict[str, str]) -> str:
    """``src``'s train/ and valid/ parquet files under ``dst`` with columns renamed; no schema.yaml."""
    for split in ("train", "valid"):
        os.makedirs(os.path.join(dst, split))
        for name in sorted(os.listdir(os.path.join(src, split))):
            table = pq.read_table(os.path.join(src, split, name))
            table = table.rename_columns([renames.get(c, c) for c in table.column_names])
            pq.write_table(table, os.path.join(dst, split, name))
    return dst


def converted_criteo(main, tmp_path, *options) -> str:
    """The real 200-row Criteo sample through ``rayemb convert criteo`` with ``options``; the dataset's path."""
    src = write_text(tmp_path / "day.txt", sample_lines())
    out = str(tmp_path / "criteo")
    assert main(["convert", "criteo", "--input", src, "--out", out, "--engine", "local", "--valid-fraction", "0.25",
                 *map(str, options)]) == 0
    return out
