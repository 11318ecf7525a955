"""The group column's way to validation (schema.yaml ``group`` -> ``Batch.groups``), and early stopping and the
best checkpoint following a metric in its own direction."""

from __future__ import annotations

import types

import numpy as np
import pyarrow as pa
import pytest

from rayemb.data.batching import BatchConverter
from rayemb.data.schema import DatasetSchema
from rayemb.errors import ConfigError, DataError
from rayemb.train.worker.loop import EarlyStopping, early_stopping_metric


def _schema(group="user_id"):
    return DatasetSchema.from_dict({"label": "label", "dense": ["I1"], "group": group,
                                    "sparse": [{"name": "C1", "num_embeddings": 10, "multi_hot": False}]})


def _table(users):
    n = len(users)
    return pa.table({"label": pa.array([1.0, 0.0, 1.0][:n], pa.float32()), "I1": pa.array([1.0] * n, pa.float32()),
                     "C1": pa.array([1, 2, 3][:n], pa.int64()), "user_id": users})


def test_the_group_column_round_trips_and_reaches_valid_batches_only():
    schema = _schema()
    assert DatasetSchema.from_dict(schema.to_dict()).group == "user_id"
    assert "group" not in _schema(None).to_dict()
    with pytest.raises(DataError, match="group 'label'"):
        _schema("label")
    ints = pa.array([7, -3, 7], pa.int64())
    assert BatchConverter(schema)(_table(ints)).groups is None  # the train split does not read it
    valid = BatchConverter(schema, keep_groups=True)
    b = valid(_table(ints), pad_to=5)
    assert b.groups.tolist() == [7, -3, 7, -1, -1] and b.mask.tolist() == [True] * 3 + [False] * 2
    assert valid.padding(4).groups.tolist() == [-1] * 4
    hashed = valid(_table(pa.array(["ann", "bob", "ann"]))).groups.tolist()
    assert hashed[0] == hashed[2] != hashed[1]
    with pytest.raises(DataError, match="Group column 'user_id' has 1 null"):
        valid(_table(pa.array([1, None, 2], pa.int64())))


def test_early_stopping_follows_the_metric_in_its_direction():
    ne = EarlyStopping(patience=2, metric="valid_ne")
    assert not ne.update(0, 0.90) and not ne.update(1, 0.85)
    assert not ne.update(2, 0.95)
    assert ne.update(3, 0.86)  # two epochs above the best 0.85
    assert ne.metrics() == {"best_valid_ne": 0.85, "best_epoch": 1.0}
    cal = EarlyStopping(patience=None, metric="valid_calibration")
    for epoch, value in enumerate([1.2, 0.95, 1.03, 0.7]):
        cal.update(epoch, value)
    assert (cal.best, cal.best_epoch) == (1.03, 2)
    resumed = EarlyStopping(patience=1, resumed=ne.state(), metric="valid_ne")
    assert (resumed.best, resumed.bad_epochs) == (0.85, 2)
    other = EarlyStopping(patience=1, resumed={"best_valid_auc": 0.8, "best_epoch": 3}, metric="valid_ne")
    assert (other.best, other.best_epoch) == (float("inf"), -1)  # a job that followed another metric


def test_the_metric_must_be_one_the_model_and_schema_report():
    assert early_stopping_metric(None, retrieval=False, grouped=False) == "valid_auc"
    assert early_stopping_metric(None, retrieval=True, grouped=False) == "valid_hit_rate_at_50"
    assert early_stopping_metric("valid_gauc", retrieval=False, grouped=True) == "valid_gauc"
    with pytest.raises(ConfigError, match="valid_gauc.*group: user_id"):
        early_stopping_metric("valid_gauc", retrieval=False, grouped=False)
    with pytest.raises(ConfigError, match="ranking model reports no hit rate"):
        early_stopping_metric("valid_hit_rate_at_10", retrieval=False, grouped=False)
    with pytest.raises(ConfigError, match="retrieval model reports hit rates only"):
        early_stopping_metric("valid_ne", retrieval=True, grouped=False)


def test_the_best_checkpoint_follows_the_metric_early_stopping_followed():
    from rayemb.train.driver.results import best_and_last_checkpoint

    def ckpt(path):
        return types.SimpleNamespace(path=path)

    kept = [(ckpt("e0"), {"valid_auc": 0.70, "valid_calibration": 1.30, "best_valid_calibration": 1.30}),
            (ckpt("e1"), {"valid_auc": 0.75, "valid_calibration": 0.97, "best_valid_calibration": 0.97}),
            (ckpt("e2"), {"valid_auc": 0.78, "valid_calibration": 0.90, "best_valid_calibration": 0.97})]
    result = types.SimpleNamespace(checkpoint=ckpt("e2"), best_checkpoints=kept)
    assert best_and_last_checkpoint(result) == ("e1", "e2")
    ne = [(ckpt(f"e{i}"), {"valid_ne": v, "best_valid_ne": min(v, 0.9)}) for i, v in enumerate([0.9, 0.8, 0.85])]
    assert best_and_last_checkpoint(types.SimpleNamespace(checkpoint=ckpt("e2"), best_checkpoints=ne))[0] == "e1"
    auc = [(ckpt(f"e{i}"), {"valid_auc": v}) for i, v in enumerate([0.7, 0.8, np.nan])]
    assert best_and_last_checkpoint(types.SimpleNamespace(checkpoint=ckpt("e2"), best_checkpoints=auc))[0] == "e1"
