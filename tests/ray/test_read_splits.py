"""How a job's splits reach Ray Data: a small split read by the driver as in-memory blocks, a large one (or one of
unknown size) by Ray Data's read tasks; either way the same rows, every column as the files have it."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayemb.constants import TRAIN_SPLIT, VALID_SPLIT
from rayemb.data.schema import parquet_files
from rayemb.train import outputs


def _rows(ds):
    return pa.concat_tables(list(ds.iter_batches(batch_size=None, batch_format="pyarrow"))).sort_by("C1")


@pytest.mark.parametrize("threshold", [10**9, 0], ids=["driver", "read-tasks"])
def test_both_ways_give_the_files_rows(ray_2_cpus, tiny_data, monkeypatch, threshold):
    from ray.data.dataset import MaterializedDataset

    monkeypatch.setattr(outputs, "SMALL_SPLIT_MAX_ROWS", threshold)
    train, valid = parquet_files(tiny_data, TRAIN_SPLIT), parquet_files(tiny_data, VALID_SPLIT)
    rows = {"train": 36_000, "valid": 4_000}
    out = outputs.read_splits(train, valid, rows=rows)
    in_memory = isinstance(out["train"], MaterializedDataset)
    assert in_memory == (threshold > 0)  # from_arrow: blocks already in the object store, no read task to run
    for name, files in (("train", train), ("valid", valid)):
        expected = pa.concat_tables([pq.read_table(f) for f in files]).sort_by("C1")
        got = _rows(out[name])
        assert got.num_rows == rows[name] == expected.num_rows
        assert got.select(expected.column_names).equals(expected)
    # unknown sizes: the read tasks
    assert not isinstance(outputs.read_splits(train, valid)["train"], MaterializedDataset)
