"""NE, calibration and GAUC on one process against their textbook definitions, and the direction each validation
metric improves in (what early stopping and the best checkpoint compare)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from rayemb.train.worker.metrics import (calibration, gauc, group_auc_terms, metric_goal, metric_score, ne,
                                         primary_metric, validation_metrics)

BASE = {"name": "t", "data": {"path": "data/x"}}


def _rows(n: int = 3000, seed: int = 0):
    rng = np.random.default_rng(seed)
    z = np.round(rng.normal(size=n), 1)  # ties
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.float64)
    groups = rng.integers(-5, 40, size=n)  # negative ids: hashed string groups are any int64
    return y, z, groups


def test_ne_is_the_logloss_over_the_base_rate_entropy():
    y, z, _ = _rows()
    p = y.mean()
    want = log_loss(y, 1 / (1 + np.exp(-z))) / -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert abs(ne(y, z) - want) < 1e-9
    # predicting the base rate itself scores exactly 1
    base = np.full(y.size, math.log(p / (1 - p)))
    assert abs(ne(y, base) - 1.0) < 1e-12
    assert math.isnan(ne(np.ones(4), np.zeros(4)))


def test_calibration_is_predicted_over_observed_positives():
    y, z, _ = _rows()
    assert abs(calibration(y, z) - (1 / (1 + np.exp(-z))).sum() / y.sum()) < 1e-12
    assert abs(calibration(np.array([1.0, 0.0]), np.array([0.0, 0.0])) - 1.0) < 1e-12
    assert math.isnan(calibration(np.zeros(3), np.zeros(3)))
    assert np.isfinite(calibration(np.array([1.0]), np.array([-1000.0])))  # no overflow


def test_gauc_weights_each_group_auc_by_its_rows_and_skips_one_class_groups():
    y, z, g = _rows()
    total = weight = 0.0
    for value in np.unique(g):
        inside = g == value
        if 0 < y[inside].sum() < inside.sum():
            total += inside.sum() * roc_auc_score(y[inside], z[inside])
            weight += inside.sum()
    assert abs(gauc(y, z, g) - total / weight) < 1e-12
    terms = group_auc_terms(g, y, z)
    assert abs(terms[0] / terms[1] - total / weight) < 1e-12 and terms[1] == weight
    one_class = np.array([1, 1, 2, 2])
    assert abs(gauc(np.array([1, 1, 0, 1]), np.array([0.1, 0.2, 0.3, 0.9]), one_class) - 1.0) < 1e-12
    assert math.isnan(gauc(np.array([1, 1]), np.array([0.1, 0.2]), np.array([3, 3])))


def test_validation_metrics_name_every_task_and_the_primary_one():
    y, z, g = _rows()
    labels, logits = np.stack([y, 1 - y], axis=1), np.stack([z, z], axis=1)
    out = validation_metrics(labels, logits, ["click", "like"], "like", groups=g)
    for metric in ("auc", "logloss", "ne", "calibration", "gauc"):
        assert out[f"valid_{metric}"] == out[f"valid_{metric}.like"] != out[f"valid_{metric}.click"]
    assert "valid_gauc" not in validation_metrics(y, z)


@pytest.mark.parametrize("name,better,worse", [
    ("valid_auc", 0.8, 0.7), ("valid_gauc", 0.7, 0.6), ("valid_hit_rate_at_50", 0.3, 0.2),
    ("valid_logloss", 0.4, 0.5), ("valid_ne", 0.8, 0.9), ("valid_ne.click", 0.8, 0.9),
    ("valid_calibration", 0.98, 1.05), ("valid_calibration", 1.01, 0.98),
])
def test_metric_directions(name, better, worse):
    assert metric_score(name, better) > metric_score(name, worse)


def test_unknown_metric_has_no_direction_and_the_reported_best_names_the_primary():
    with pytest.raises(KeyError, match="valid_speed"):
        metric_goal("valid_speed")
    assert primary_metric({"valid_auc": 0.7, "valid_ne": 0.9, "best_valid_ne": 0.9, "best_epoch": 0}) == "valid_ne"
    assert primary_metric({"valid_auc": 0.7}) == "valid_auc"
    assert primary_metric({"valid_hit_rate_at_50": 0.2}) == "valid_hit_rate_at_50"


def test_a_bad_early_stopping_metric_is_refused_naming_the_allowed_ones():
    from rayemb.config import EARLY_STOPPING_METRICS, config_from_dict
    from rayemb.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train.early_stopping_metric: 'valid_accuracy'.*valid_gauc.*valid_ne"):
        config_from_dict({**BASE, "train": {"early_stopping_metric": "valid_accuracy"}})
    with pytest.raises(ConfigError, match="train.eval_every_n_steps"):
        config_from_dict({**BASE, "train": {"eval_every_n_steps": 0}})
    cfg = config_from_dict({**BASE, "train": {"early_stopping_metric": "valid_calibration",
                                              "eval_every_n_steps": 5}})
    assert (cfg.train.early_stopping_metric, cfg.train.eval_every_n_steps) == ("valid_calibration", 5)
    for name in EARLY_STOPPING_METRICS:  # every metric one may name has a direction
        assert metric_goal(name) in ("max", "min", "one")
