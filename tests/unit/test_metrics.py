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
