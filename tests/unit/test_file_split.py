"""An in-memory split that the driver does not hold: each rank reads the row groups holding its own rows, with the
same bounds as a held split (equal train shares, every valid row), and no Ray Dataset is made for it."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayemb.train.driver import outputs
from rayemb.train.held_splits import FileSplit, _bounds

SIZES = (1_000, 37, 2_500, 0, 811)  # rows per file, one file empty


def _files(tmp_path):
    paths, start = [], 0
    for i, n in enumerate(SIZES):
        t = pa.table({"row": np.arange(start, start + n, dtype=np.int64),
                      "x": np.random.default_rng(i).random(n).astype(np.float32)})
        path = str(tmp_path / f"part-{i:05d}.parquet")
        pq.write_table(t, path, row_group_size=300)  # several row groups per file
        paths.append(path)
        start += n
    return paths


@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("equal", [True, False])
def test_each_rank_reads_exactly_its_rows_in_order(tmp_path, world, equal):
    paths = _files(tmp_path)
    split = FileSplit.of(paths)
    whole = pa.concat_tables([pq.read_table(p) for p in paths])
    assert split.rows == sum(SIZES) == whole.num_rows
    got = []
    for rank in range(world):
        start, stop = split.bounds(rank, world, equal)
        table = split.shard(rank, world, equal).table
        assert table.equals(whole.slice(start, stop - start))
        got.append(table.num_rows)
    if equal:
        assert set(got) == {sum(SIZES) // world}
    else:
        assert sum(got) == sum(SIZES) and max(got) - min(got) <= 1
    with pytest.raises(ValueError, match=f"rank {world} is not one of {world} ranks"):
        split.shard(world, world, equal)


def test_bounds_are_the_held_splits_bounds():
    for rows in (0, 1, 10, 4_348):
        for world in (1, 2, 3, 7):
            assert [_bounds(rows, r, world, True) for r in range(world)] == \
                [(r * (rows // world), (r + 1) * (rows // world)) for r in range(world)]
            assert _bounds(rows, world - 1, world, False)[1] == rows


def test_read_splits_picks_the_path_by_size_and_memory(tmp_path, monkeypatch):
    paths = _files(tmp_path)
    monkeypatch.setattr(outputs, "SMALL_SPLIT_MAX_ROWS", 999)  # the held path (ray.put) has its Ray test
    out = outputs.read_splits(paths, paths[:1], rows={"train": sum(SIZES), "valid": 1_000}, in_memory=True)
    assert all(isinstance(s, FileSplit) for s in out.values())
    assert out["train"].file_rows == SIZES and out["valid"].rows == 1_000
