"""The HugeCTR frequent-category rule against hand computations."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rayemb.data.stats_types import DatasetStats, TableStats
from rayemb.errors import PlanError
from rayemb.planner.split import HugeCTRSplitRule, SplitRule


def table(counts, values, error_bound=0, num_embeddings=1000):
    ids = [100 + i for i in range(len(counts))]
    return TableStats(
        num_embeddings=num_embeddings,
        values=values,
        heavy_hitters=[[i, c] for i, c in zip(ids, counts)],
        error_bound=error_bound,
    )


# 10_000 samples = 10 global batches of B = 1000.
STATS = DatasetStats(
    rows=10_000,
    tables={
        "C1": table([500, 300, 120, 60, 41, 40, 39, 20, 10, 5], values=10_000),
        "C2": table([90, 45, 30], values=10_000),
        "C3": table([39, 38], values=10_000),
        "C4": table([800, 400, 45, 30], values=80_000),  # multi-hot, pooling 8: counts are id occurrences
    },
)


def rule(**kw):
    args = dict(world_size=4, global_batch_size=1000, num_nodes=2, bw_all_to_all=2.0, bw_all_reduce=1.0,
                efficiency=0.5)
    args.update(kw)
    return HugeCTRSplitRule(**args)


def test_multi_node_rule_by_hand():
    r = rule()
    assert isinstance(r, SplitRule)
    # T = N * (BW_a2a / BW_ar) * eff * N / (N - 1) = 2 * 2 * 0.5 * 2 / 1 = 4 per global batch,
    # i.e. count >= 4 * rows / B = 40 over the data.
    assert r.threshold() == pytest.approx(4.0)
    s = r.split(STATS)

    # C1: counts >= 40 -> 500, 300, 120, 60, 41, 40 (n = 6) -> rounded up to 8 = 2 W: adds 39 and 20.
    c1 = s.tables["C1"]
    assert c1.num_hot == 8 and c1.limited_by == "threshold" and c1.complete
    assert c1.hot_ids.tolist() == [100, 101, 102, 103, 104, 105, 106, 107]
    assert c1.hot_share == pytest.approx((500 + 300 + 120 + 60 + 41 + 40 + 39 + 20) / 10_000)  # 0.112
    # C2: 90, 45 >= 40 (n = 2) -> 4 > 3 known categories -> HugeCTR rounds down instead: 0.
    assert s.tables["C2"].num_hot == 0 and s.tables["C2"].limited_by == "candidates"
    assert s.tables["C2"].hot_share == 0.0
    # C3: nothing reaches 40.
    assert s.tables["C3"].num_hot == 0 and s.tables["C3"].limited_by == "threshold"
    # C4: 800, 400, 45 >= 40 (n = 3) -> 4: all four, h = 1275 / 80000.
    c4 = s.tables["C4"]
    assert c4.hot_ids.tolist() == [100, 101, 102, 103]
    assert c4.hot_share == pytest.approx(1275 / 80_000)
    assert all(t.num_hot % 4 == 0 for t in s.tables.values())
    assert "C1" in s.summary_table() and s.to_dict()["tables"]["C4"]["num_hot"] == 4


def test_memory_budget_keeps_globally_most_frequent_rows():
    # dim 4 x 4 bytes = 16 bytes per row; 128 bytes = 8 rows per rank for all tables together.
    s = rule(memory_budget_bytes=128, embedding_dim=4, bytes_per_element=4).split(STATS)
    # Wanted: C1 8 rows + C4 4 rows. By count: C4 800, C1 500, C4 400, C1 300, C1 120, C1 60, C4 45, C1 41
    # fit (8 rows): C1 5, C4 3 -> each rounded down to a multiple of W = 4: C1 4, C4 0.
    assert s.tables["C1"].num_hot == 4 and s.tables["C1"].limited_by == "memory"
    assert s.tables["C4"].num_hot == 0 and s.tables["C4"].limited_by == "memory"
    assert s.hot_bytes_per_rank(embedding_dim=4) <= 128


def test_single_node_and_single_rank_rules():
    # N = 1, W = 4: M = B / W = 250, T = B sqrt(2 p / (M (M - 1))) = 1000 sqrt(0.02 / 62250) = 0.56682
    r = rule(num_nodes=1)
    assert r.threshold() == pytest.approx(1000 * math.sqrt(0.02 / (250 * 249)))
    assert r.threshold() == pytest.approx(0.566820, rel=1e-5)
    # count >= 0.5668 * 10 = 5.67: C1 has 9 such ids (all but 5) -> rounded up to 12 > 10 known -> 8
    assert r.split(STATS).tables["C1"].num_hot == 8
    # W = 1: no communication, nothing is hot
    one = HugeCTRSplitRule(world_size=1, global_batch_size=1000)
    assert math.isinf(one.threshold())
    assert all(t.num_hot == 0 for t in one.split(STATS).tables.values())


def test_incomplete_when_error_bound_reaches_threshold_count():
    stats = DatasetStats(rows=10_000, tables={"C1": table([500, 300, 120, 60], values=10_000, error_bound=40)})
    t = rule().split(stats).tables["C1"]
    assert not t.complete  # an id with true count 40 may be absent from the summary
    stats.tables["C1"] = dataclasses.replace(stats.tables["C1"], error_bound=39)
    assert rule().split(stats).tables["C1"].complete


def test_hot_ids_ordered_by_count_even_if_input_is_not():
    stats = DatasetStats(rows=1000, tables={"C1": TableStats(num_embeddings=50, values=1000, error_bound=0,
                                                             heavy_hitters=[[7, 10], [3, 200], [9, 200], [1, 90]])})
    t = HugeCTRSplitRule(world_size=2, global_batch_size=1000, num_nodes=2).split(stats).tables["C1"]
    # T = 2 * 1 * 1 * 2 = 4 per batch = 4 counts over one batch: 200, 200, 90, 10 all hot (n = 4).
    assert t.hot_ids.tolist() == [3, 9, 1, 7]
    assert t.hot_ids.dtype == np.int64


def test_invalid_inputs_raise_plan_error():
    with pytest.raises(PlanError):
        HugeCTRSplitRule(world_size=0, global_batch_size=10)
    with pytest.raises(PlanError):
        HugeCTRSplitRule(world_size=4, global_batch_size=100, num_nodes=8)
