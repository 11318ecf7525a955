"""rayemb.train.calibration.plan_probe.TableSample: synthetic ids drawn as the job's statistics counted them."""

import numpy as np

from rayemb.train.calibration.plan_probe import TableSample


def test_bags_have_the_pooling_on_average_and_hot_ids_their_counted_frequencies():
    hot = np.array([7, 3, 11])
    probs = np.array([0.4, 0.2, 0.1])  # 70 % of lookups hit a hot id
    sample = TableSample(rows=1000, pooling=1.5, hot_ids=hot, hot_probs=probs)
    lengths, ids = sample.draw(20_000, np.random.default_rng(0))
    assert lengths.dtype == np.int32 and set(np.unique(lengths)) == {1, 2}
    assert abs(lengths.mean() - 1.5) < 0.02 and ids.size == lengths.sum()
    assert ids.min() >= 0 and ids.max() < 1000
    share = {i: float(np.mean(ids == i)) for i in hot}
    # each hot id as often as counted, plus its uniform share (1/1000 of the other 30 %)
    for i, p in zip(hot, probs):
        assert abs(share[i] - (p + 0.3 / 1000)) < 0.01, share


def test_a_table_without_heavy_hitters_draws_uniformly_one_id_per_bag():
    sample = TableSample(rows=50, pooling=1.0, hot_ids=np.zeros(0, np.int64), hot_probs=np.zeros(0))
    lengths, ids = sample.draw(5_000, np.random.default_rng(1))
    assert (lengths == 1).all() and ids.size == 5_000
    counts = np.bincount(ids, minlength=50)
    assert counts.min() > 50 and counts.max() < 160  # uniform: 100 each
