import numpy as np
from sklearn.metrics import log_loss, roc_auc_score

from rayemb.train.metrics import auc, logloss


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    y = rng.random(2000) < 0.3
    s = np.round(rng.normal(size=2000) + y, 1)  # rounding creates many ties
    assert abs(auc(y, s) - roc_auc_score(y, s)) < 1e-12
    assert auc(np.array([1, 1]), np.array([0.1, 0.2])) != auc(np.array([1, 1]), np.array([0.1, 0.2]))  # NaN


def test_logloss_matches_sklearn():
    rng = np.random.default_rng(1)
    y = (rng.random(500) < 0.4).astype(float)
    z = rng.normal(scale=3, size=500)
    p = 1 / (1 + np.exp(-z))
    assert abs(logloss(y, z) - log_loss(y, p)) < 1e-9


def test_step_time_check_against_the_probe_and_the_model():
    from rayemb.train.metrics import step_time_check

    reports = [{"epoch": 0, "step_time_s": 0.5},  # each epoch's first window: warm-up, left out
               {"epoch": 0, "step_time_s": 0.040}, {"epoch": 0, "step_time_s": 0.050}, {"epoch": 0, "step_time_s": 0.042},
               {"epoch": 0, "epoch_end": 1, "step_time_s": 9.0}, {"epoch": 1, "step_time_s": 0.3}]
    out = step_time_check(reports, predicted=0.044, model_predicted=0.063)
    assert out["step_time_measured_s"] == 0.042
    assert abs(out["step_time_predicted_over_measured"] - 0.044 / 0.042) < 1e-12
    assert abs(out["step_time_model_predicted_over_measured"] - 1.5) < 1e-12
    assert "step_time_model_predicted_s" not in step_time_check(reports, predicted=0.044)
    assert step_time_check(reports, predicted=None) == {}
