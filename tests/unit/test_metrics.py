import numpy as np
from sklearn.metrics import log_loss, roc_auc_score

from rayemb.train.worker.metrics import auc, logloss


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


def test_step_time_check_against_the_model_and_the_probe():
    from rayemb.train.driver.results import step_time_check, step_time_line

    reports = [{"epoch": 0, "step_time_s": 0.5},  # each epoch's first window: warm-up, left out
               {"epoch": 0, "step_time_s": 0.040}, {"epoch": 0, "step_time_s": 0.050}, {"epoch": 0, "step_time_s": 0.042},
               {"epoch": 0, "epoch_end": 1, "step_time_s": 9.0}, {"epoch": 1, "step_time_s": 0.3}]
    out = step_time_check(reports, predicted=0.063, probed=0.044)
    assert out["step_time_measured_s"] == 0.042
    # the model's prediction and the probe's step are logged under their own names, each against the measured step
    assert out["step_time_predicted_s"] == 0.063 and abs(out["step_time_predicted_over_measured"] - 1.5) < 1e-12
    assert out["step_time_probed_s"] == 0.044
    assert abs(out["step_time_probed_over_measured"] - 0.044 / 0.042) < 1e-12
    assert "step_time_model_predicted_s" not in out and "step_time_model_predicted_over_measured" not in out
    line = step_time_line(out)
    assert "42.0 ms measured" in line and "63.0 ms predicted (1.50x)" in line and "44.0 ms probed (1.05x)" in line
    no_probe = step_time_check(reports, predicted=0.063)
    assert "step_time_probed_s" not in no_probe and no_probe["step_time_predicted_s"] == 0.063
    assert "probed" not in step_time_line(no_probe)
    assert step_time_check(reports, predicted=None) == {}
    assert step_time_check([{"epoch": 0, "step_time_s": 0.5}], predicted=0.063) == {}  # warm-up only
