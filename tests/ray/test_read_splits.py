"""How a job's splits reach the ranks: a small split read by the driver into the object store and sliced by each
rank, a large one (or one of unknown size) read by Ray Data's read tasks; either way the files' rows, every column
as the files have it: the train split in equal shares per rank, the valid split whole."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayemb.constants import TRAIN_SPLIT, VALID_SPLIT
from rayemb.data.schema import parquet_files
from rayemb.train.driver import outputs
from rayemb.train.held_splits import HeldSplit

ROWS = {"train": 36_000, "valid": 4_000}


def _expected(files):
    return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("C1")


def _batches(shard, batch_size=None, drop_last=False):
    return list(shard.iter_batches(batch_size=batch_size, batch_format="pyarrow", drop_last=drop_last))


def test_a_large_or_unsized_split_is_read_by_ray_data(ray_2_cpus, tiny_data, monkeypatch):
    from ray.data import Dataset

    monkeypatch.setattr(outputs, "SMALL_SPLIT_MAX_ROWS", 0)
    train, valid = parquet_files(tiny_data, TRAIN_SPLIT), parquet_files(tiny_data, VALID_SPLIT)
    out = outputs.read_splits(train, valid, rows=ROWS)
    for name, files in (("train", train), ("valid", valid)):
        assert isinstance(out[name], Dataset)
        expected = _expected(files)
        got = pa.concat_tables(_batches(out[name].iterator())).sort_by("C1")
        assert got.num_rows == ROWS[name] == expected.num_rows
        assert got.select(expected.column_names).equals(expected)
    assert all(isinstance(d, Dataset) for d in outputs.read_splits(train, valid).values())  # sizes unknown


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_a_small_split_is_held_and_sliced_per_rank(ray_2_cpus, tiny_data, world):
    train, valid = parquet_files(tiny_data, TRAIN_SPLIT), parquet_files(tiny_data, VALID_SPLIT)
    out = outputs.read_splits(train, valid, rows=ROWS)
    assert all(isinstance(s, HeldSplit) for s in out.values())
    batch = 512
    # train: equal shares (36,000 // world rows each), full batches only, no row on two ranks
    shares = [out["train"].shard(r, world, equal=True) for r in range(world)]
    per_rank = [_batches(s, batch, drop_last=True) for s in shares]
    assert {s.table.num_rows for s in shares} == {ROWS["train"] // world}
    assert all(len(b) == ROWS["train"] // world // batch and all(x.num_rows == batch for x in b) for b in per_rank)
    whole = pa.concat_tables([s.table for s in shares]).sort_by("C1")
    expected = _expected(train)
    assert whole.num_rows == ROWS["train"] // world * world
    assert whole.select(expected.column_names).equals(
        pa.concat_tables([pq.read_table(f) for f in train])[: whole.num_rows].sort_by("C1"))
    # valid: every row once, shares within one row of each other, the last batch partial
    shares = [out["valid"].shard(r, world, equal=False) for r in range(world)]
    sizes = [s.table.num_rows for s in shares]
    assert sum(sizes) == ROWS["valid"] and max(sizes) - min(sizes) <= 1
    got = pa.concat_tables([b for s in shares for b in _batches(s, batch)]).sort_by("C1")
    expected = _expected(valid)
    assert got.select(expected.column_names).equals(expected)
    with pytest.raises(ValueError, match="rank 3 is not one of 3 ranks"):
        out["valid"].shard(3, 3, equal=False)
