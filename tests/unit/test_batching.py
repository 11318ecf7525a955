import numpy as np
import pyarrow as pa
import pytest
import torch

from rayemb.data.batching import BatchConverter
from rayemb.data.schema import DatasetSchema, SparseFeature
from rayemb.errors import DataError


def _schema(multi_hot=False):
    return DatasetSchema(
        label="label", dense=("I1", "I2"),
        sparse=(SparseFeature("C1", 10, multi_hot), SparseFeature("C2", 5, multi_hot)),
    )


def test_one_hot_to_kjt_key_major_with_null_as_empty_bag():
    t = pa.table({
        "label": pa.array([1.0, 0.0, 1.0], pa.float32()),
        "I1": pa.array([0.0, None, 3.0], pa.float32()),
        "I2": pa.array([1.0, 2.0, -5.0], pa.float32()),
        "C1": pa.array([4, 9, 0], pa.int64()),
        "C2": pa.array([1, None, 3], pa.int64()),
    })
    b = BatchConverter(_schema())(t)
    assert b.sparse.keys() == ["C1", "C2"]
    assert b.sparse.lengths().tolist() == [1, 1, 1, 1, 0, 1]
    assert b.sparse.values().tolist() == [4, 9, 0, 1, 3]
    assert b.labels.tolist() == [1.0, 0.0, 1.0]
    expect = np.log1p(np.array([[0, 1], [0, 2], [3, 0]], dtype=np.float32))  # nulls -> 0, negatives -> 0
    assert torch.allclose(b.dense, torch.from_numpy(expect))


def test_multi_hot_with_empty_and_null_bags_and_a_slice():
    c1 = pa.array([[1, 2, 2], [], None, [7]], pa.list_(pa.int64()))
    c2 = pa.array([[0], [4, 4], [3], []], pa.list_(pa.int64()))
    t = pa.table({
        "label": pa.array([0, 1, 0, 1], pa.float32()), "I1": pa.array([1, 1, 1, 1], pa.float32()),
        "I2": pa.array([1, 1, 1, 1], pa.float32()), "C1": c1, "C2": c2,
    })
    b = BatchConverter(_schema(True))(t)
    assert b.sparse.lengths().tolist() == [3, 0, 0, 1, 1, 2, 1, 0]
    assert b.sparse.values().tolist() == [1, 2, 2, 7, 0, 4, 4, 3]
    # a sliced batch (what Ray hands over) keeps only its rows
    s = BatchConverter(_schema(True))(t.slice(1, 2))
    assert s.sparse.lengths().tolist() == [0, 0, 2, 1]
    assert s.sparse.values().tolist() == [4, 4, 3]
    jt = s.sparse["C2"]
    assert jt.to_dense()[0].tolist() == [4, 4]


def _ids_table(ids):
    n = len(ids)
    return pa.table({
        "label": pa.array([0.0] * n, pa.float32()), "I1": pa.array([0.0] * n, pa.float32()),
        "I2": pa.array([0.0] * n, pa.float32()), "C1": pa.array(ids, pa.int64()), "C2": pa.array([0] * n, pa.int64()),
    })


def test_id_policy():
    t = _ids_table([3, 12, -1, 25])
    with pytest.raises(DataError) as e:
        BatchConverter(_schema(), "error")(t)
    msg = str(e.value)
    assert "'C1'" in msg and "3 id(s)" in msg and "-1" in msg and "id_policy" in msg
    assert BatchConverter(_schema(), "hash")(t).sparse["C1"].values().tolist() == [3, 2, 9, 5]
    assert BatchConverter(_schema(), "clip")(t).sparse["C1"].values().tolist() == [3, 9, 0, 9]


def test_nan_dense_is_rejected_with_the_column_name():
    t = _ids_table([1, 2]).set_column(1, "I1", pa.array([np.nan, 1.0], pa.float32()))
    with pytest.raises(DataError, match="I1"):
        BatchConverter(_schema())(t)
