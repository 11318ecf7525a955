"""Datasets of "one's own" parquet files: converted ones with their columns renamed and no schema.yaml."""

from __future__ import annotations

import os
from typing import Dict

import pyarrow.parquet as pq

from tests._convert_engines import sample_lines, write_text

#: Criteo's columns under other names: what a user's own export of the same data could call them
CRITEO_RENAMES = {**{f"I{i}": f"num_{i}" for i in range(1, 14)}, **{f"C{i}": f"cat_{i}" for i in range(1, 27)}}
#: the same for the MovieLens conversion's columns
MOVIELENS_RENAMES = {"label": "liked", "user": "user_id", "item": "movie_id", "history": "recent_movies",
                     "history_length": "n_recent"}


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


def write_ratings(path, users=40, items=30, per_user=12, seed=0) -> str:
    """A MovieLens ``ratings.dat`` (``user::item::rating::timestamp``) of ``users`` x ``per_user`` ratings."""
    import numpy as np

    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for u in range(1, users + 1):
            for k, m in enumerate(rng.choice(items, size=per_user, replace=False)):
                f.write(f"{u}::{m + 1}::{int(rng.integers(1, 6))}::{1_000_000 + 100 * u + k}\n")
    return str(path)


def converted_movielens(main, tmp_path, **ratings) -> str:
    """:func:`write_ratings` through ``rayemb convert movielens --history-length 5``; the dataset's path."""
    out = str(tmp_path / "ml")
    assert main(["convert", "movielens", "--input", write_ratings(tmp_path / "ratings.dat", **ratings), "--out", out,
                 "--history-length", "5"]) == 0
    return out
