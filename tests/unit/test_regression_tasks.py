"""Regression tasks and row weights: schema.yaml ``task_types`` / ``weight``, the loss of each task type against
torch's own losses written out, weighted losses against a hand computation, and the metric math against numpy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from rayemb.config import CHOICES, TrainConfig
from rayemb.data.batching import BatchConverter
from rayemb.data.checks import ValueSummary, check_values
from rayemb.data.schema import DatasetSchema
from rayemb.errors import ConfigError, DataError
from rayemb.train.worker.losses import TaskLoss, job_loss, loss_target
from rayemb.train.worker.loop import early_stopping_metric
from rayemb.train.worker.metrics import metric_goal, secondary_metric, validation_metrics

SPARSE = [{"name": "C1", "num_embeddings": 4}]


def _schema(**extra):
    return DatasetSchema.from_dict({"label": ["click", "rating"], "dense": ["I1"], "sparse": SPARSE, **extra})


# -- schema ------------------------------------------------------------------------------------------------------


def test_task_types_parse_and_round_trip_with_binary_the_default():
    s = _schema(task_types={"rating": "regression"}, weight="w")
    assert s.task_kinds == ["binary", "regression"] and s.regression_labels == ["rating"] and s.weight == "w"
    assert DatasetSchema.from_dict(s.to_dict()) == s
    assert s.to_dict()["task_types"] == {"rating": "regression"} and s.to_dict()["weight"] == "w"
    # binary said outright is the default: the same schema, written as before
    plain = _schema(task_types={"click": "binary"})
    assert plain == _schema() and "task_types" not in plain.to_dict() and "weight" not in plain.to_dict()


@pytest.mark.parametrize("types, needle", [
    ({"rating": "ordinal"}, "'rating' the type 'ordinal'; allowed: binary, regression"),
    ({"views": "regression"}, "names ['views'], which are not label columns"),
    (["rating"], "task_types must map label columns"),
])
def test_bad_task_types_are_refused_naming_the_label_and_the_allowed_values(types, needle):
    with pytest.raises(DataError, match="task_types") as e:
        _schema(task_types=types)
    assert needle in str(e.value)


@pytest.mark.parametrize("weight", ["click", "I1", "C1"])
def test_a_weight_column_must_be_a_column_of_its_own(weight):
    with pytest.raises(DataError, match=f"weight '{weight}' must name a float column of its own"):
        _schema(weight=weight)


def test_regression_labels_pass_the_value_checks_binary_ones_still_do_not():
    table = pa.table({"click": [0.0, 1.0, 1.0], "rating": [3.5, -1.25, 4.0]})
    summary = ValueSummary.of_table(table, ["click", "rating"], [])
    assert summary.label_not_binary_by == {"rating": 3}
    assert ValueSummary.from_dict(summary.to_dict()).label_not_binary_by == {"rating": 3}
    check_values(summary, ["click", "rating"], "train", regression=["rating"])
    with pytest.raises(DataError, match="3 value\\(s\\) that are not 0 or 1"):
        check_values(summary, ["click", "rating"], "train")
    bad_click = ValueSummary.of_table(pa.table({"click": [0.5, 1.0], "rating": [2.0, 7.0]}), ["click", "rating"], [])
    with pytest.raises(DataError, match="1 value\\(s\\) that are not 0 or 1"):
        check_values(bad_click, ["click", "rating"], "train", regression=["rating"])
    infinite = ValueSummary.of_table(pa.table({"click": [0.0], "rating": [float("inf")]}), ["click", "rating"], [])
    with pytest.raises(DataError, match="NaN or infinite"):
        check_values(infinite, ["click", "rating"], "train", regression=["rating"])


def test_the_weight_column_reaches_the_batch_and_bad_weights_are_refused():
    schema = _schema(task_types={"rating": "regression"}, weight="w")
    convert = BatchConverter(schema)
    table = pa.table({"click": [0.0, 1.0], "rating": [2.5, 4.0], "I1": [1.0, 2.0], "C1": [0, 1],
                      "w": [0.5, 2.0]})
    batch = convert(table, pad_to=3)
    assert batch.weights.tolist() == [0.5, 2.0, 0.0] and batch.labels[:2, 1].tolist() == [2.5, 4.0]
    assert convert.padding(2).weights.tolist() == [0.0, 0.0]
    assert BatchConverter(_schema())(table.drop(["w"])).weights is None
    for bad in ([1.0, -0.5], [1.0, float("nan")], [1.0, None]):
        with pytest.raises(DataError, match="Weight column 'w'"):
            convert(table.set_column(4, "w", pa.array(bad, pa.float64())))


# -- config ------------------------------------------------------------------------------------------------------


def test_regression_loss_config_and_metric_directions():
    assert CHOICES["train.regression_loss"] == ("mse", "huber") and TrainConfig(regression_loss="huber")
    with pytest.raises(ConfigError, match="train.regression_loss"):
        TrainConfig(regression_loss="l1")
    assert metric_goal("valid_rmse") == metric_goal("valid_mae.rating") == "min"
    assert secondary_metric("valid_rmse") == "valid_mae"
    assert early_stopping_metric(None, retrieval=False, grouped=False, regression=True) == "valid_rmse"
    assert early_stopping_metric(None, retrieval=False, grouped=False) == "valid_auc"
    assert early_stopping_metric("valid_mae", retrieval=False, grouped=False, regression=True) == "valid_mae"
    with pytest.raises(ConfigError, match="'valid_auc' is not reported for the primary task, a regression one"):
        early_stopping_metric("valid_auc", retrieval=False, grouped=False, regression=True)
    with pytest.raises(ConfigError, match="'valid_rmse' is not reported for the primary task, a binary one"):
        early_stopping_metric("valid_rmse", retrieval=False, grouped=False)


# -- loss --------------------------------------------------------------------------------------------------------


def _outputs(rows: int = 9):
    g = torch.Generator().manual_seed(3)
    out = torch.randn(rows, 2, generator=g) * 2
    labels = torch.stack([(torch.rand(rows, generator=g) < 0.5).float(), torch.randn(rows, generator=g) * 3], 1)
    return out, labels


@pytest.mark.parametrize("kind", ["mse", "huber"])
def test_each_task_type_gets_its_own_loss(kind):
    out, labels = _outputs()
    loss = TaskLoss(["click", "rating"], {"rating": 0.25}, task_types=["binary", "regression"], regression_loss=kind)
    regression = (torch.nn.functional.mse_loss if kind == "mse" else torch.nn.functional.huber_loss)
    want = (torch.nn.functional.binary_cross_entropy_with_logits(out[:, 0], labels[:, 0])
            + 0.25 * regression(out[:, 1], labels[:, 1]))
    assert torch.allclose(loss(out, labels), want, atol=1e-6)
    # huber is linear past an error of 1: the two losses differ on these outputs
    huber = TaskLoss(["r"], task_types=["regression"], regression_loss="huber")
    assert not torch.allclose(huber(out[:, 1], labels[:, 1]),
                              TaskLoss(["r"], task_types=["regression"])(out[:, 1], labels[:, 1]))


def test_weighted_loss_equals_the_hand_computed_weighted_mean():
    out = torch.tensor([[0.0, 1.0], [2.0, -1.0], [-1.0, 3.0]])
    labels = torch.tensor([[1.0, 2.0], [0.0, -1.0], [1.0, 0.0]])
    weights = torch.tensor([1.0, 3.0, 0.0])
    bce = [np.log(2.0), 2.0 + np.log1p(np.exp(-2.0)), 1.0 + np.log1p(np.exp(-1.0))]  # log(1 + e^-z) or z + ...
    squared = [1.0, 0.0, 9.0]
    want = (1 * bce[0] + 3 * bce[1]) / 4 + 0.5 * (1 * squared[0] + 3 * squared[1]) / 4
    batch = type("B", (), {"labels": labels, "weights": weights})()
    loss = job_loss(_schema(task_types={"rating": "regression"}, weight="w"), {"rating": 0.5})
    assert abs(float(loss(out, loss_target(batch))) - want) < 1e-6
    # one task: the same weighted mean of its column
    single = TaskLoss(["click"])(out[:, 0], torch.stack([labels[:, 0], weights], 1))
    assert abs(float(single) - (bce[0] + 3 * bce[1]) / 4) < 1e-6
    # unit weights give the unweighted loss
    unit = type("B", (), {"labels": labels, "weights": torch.ones(3)})()
    plain = TaskLoss(["click", "rating"], task_types=["binary", "regression"])
    assert torch.allclose(plain(out, loss_target(unit)), plain(out, labels), atol=1e-7)


def test_a_wrong_output_width_is_still_named_with_weights():
    out, labels = _outputs()
    target = torch.cat([labels, torch.ones(len(labels), 1)], 1)
    with pytest.raises(ConfigError, match="shape \\(9,\\) for labels of shape \\(9, 2\\)"):
        TaskLoss(["click", "rating"], task_types=["binary", "regression"])(out[:, 0], target)


# -- metrics -----------------------------------------------------------------------------------------------------


def test_regression_metrics_equal_numpy_and_skip_the_binary_ones():
    rng = np.random.default_rng(2)
    y, z = rng.normal(size=(50, 2)), rng.normal(size=(50, 2))
    y[:, 0] = rng.random(50) < 0.4
    got = validation_metrics(y, z, ["click", "rating"], "rating", task_types=["binary", "regression"])
    err = z[:, 1] - y[:, 1]
    assert abs(got["valid_rmse.rating"] - np.sqrt(np.mean(err ** 2))) < 1e-12
    assert abs(got["valid_mae.rating"] - np.mean(np.abs(err))) < 1e-12
    assert got["valid_rmse"] == got["valid_rmse.rating"] and "valid_auc.rating" not in got
    assert "valid_auc.click" in got and "valid_rmse.click" not in got


def _pairwise_auc(y: np.ndarray, z: np.ndarray, w: np.ndarray) -> float:
    """Every (positive, negative) pair written out, weighted ``w_pos * w_neg``, ties half."""
    pos, neg = y == 1, y == 0
    wins = (z[pos][:, None] > z[neg][None, :]) + 0.5 * (z[pos][:, None] == z[neg][None, :])
    pair_w = w[pos][:, None] * w[neg][None, :]
    return float(np.sum(wins * pair_w) / np.sum(pair_w))


def test_weighted_metrics_equal_numpy():
    rng = np.random.default_rng(4)
    n = 80
    z = np.round(rng.normal(size=(n, 2)), 1)  # ties
    y = np.stack([(rng.random(n) < 0.3).astype(float), rng.normal(size=n)], 1)
    w = rng.random(n) * 3
    w[:5] = 0.0
    got = validation_metrics(y, z, ["click", "rating"], task_types=["binary", "regression"], weights=w)
    p = 1 / (1 + np.exp(-z[:, 0]))
    loss = np.sum(w * -(y[:, 0] * np.log(p) + (1 - y[:, 0]) * np.log(1 - p))) / w.sum()
    rate = np.sum(w * y[:, 0]) / w.sum()
    err = z[:, 1] - y[:, 1]
    entropy = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    want = {"valid_logloss.click": loss, "valid_ne.click": loss / entropy,
            "valid_calibration.click": np.sum(w * p) / np.sum(w * y[:, 0]),
            "valid_rmse.rating": np.sqrt(np.sum(w * err ** 2) / w.sum()),
            "valid_mae.rating": np.sum(w * np.abs(err)) / w.sum(),
            "valid_auc.click": _pairwise_auc(y[:, 0], z[:, 0], w)}
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-9, (key, got[key], value)
    assert abs(got["valid_auc.click"] - _pairwise_auc(y[:, 0], z[:, 0], np.ones(n))) > 1e-3  # the weights matter
    # unit weights: the unweighted metrics
    unit = validation_metrics(y, z, ["click", "rating"], task_types=["binary", "regression"], weights=np.ones(n))
    plain = validation_metrics(y, z, ["click", "rating"], task_types=["binary", "regression"])
    assert unit.keys() == plain.keys() and all(abs(unit[k] - plain[k]) < 1e-12 for k in plain)
