"""Mergeable summaries (rayemb.data.sketches) against exact numpy oracles, checks and stats.json files (no Ray)."""

from __future__ import annotations

import json
import os
import pickle
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayemb.data.checks import check_ids
from rayemb.data.schema import DatasetSchema, SparseFeature
from rayemb.data.sketches import HyperLogLog, TableSummary, _mg_reduce
from rayemb.data.stats import _column_values, compute_stats
from rayemb.data.stats_io import load_stats_json, write_stats_json
from rayemb.data.stats_report import format_stats_table, plot_frequencies
from rayemb.data.stats_types import DatasetStats, TableStats
from rayemb.errors import DataError


def zipf_blocks(num_rows: int, alpha: float, n_blocks: int, size: int, seed: int = 0):
    """Zipf(alpha) ids over [0, num_rows), scrambled by an affine bijection, cut into blocks."""
    rng = np.random.default_rng(seed)
    w = np.arange(1, num_rows + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(w) / w.sum()
    ranks = np.minimum(np.searchsorted(cdf, rng.random(n_blocks * size)), num_rows - 1)
    ids = (ranks * 7919 + 13) % num_rows
    return [ids[i * size:(i + 1) * size].astype(np.int64) for i in range(n_blocks)]


def summarize(blocks, num_rows, capacity):
    return [TableSummary.from_values("C1", num_rows, b, rows=b.size, capacity=capacity) for b in blocks]


def fold(parts, order):
    if order == "left":
        out = parts[0]
        for p in parts[1:]:
            out = out.merge(p)
        return out
    if order == "right":
        out = parts[-1]
        for p in reversed(parts[:-1]):
            out = p.merge(out)
        return out
    if order == "tree":
        level = list(parts)
        while len(level) > 1:
            level = [level[i].merge(level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
        return level[0]
    rnd = random.Random(order)  # random pairwise merges
    pool = list(parts)
    while len(pool) > 1:
        i, j = sorted(rnd.sample(range(len(pool)), 2))
        merged = pool[i].merge(pool[j])
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [merged]
    return pool[0]


# ---- MISRA-GRIES ---- #


@pytest.mark.parametrize("order", ["left", "right", "tree", 1, 2])
def test_heavy_hitters_within_stated_bound_for_any_merge_order(order):
    V, k = 50_000, 64
    blocks = zipf_blocks(V, 1.05, n_blocks=24, size=5_000, seed=3)
    u, c = np.unique(np.concatenate(blocks), return_counts=True)
    truth = dict(zip(u.tolist(), c.tolist()))
    n = int(c.sum())
    s = fold(summarize(blocks, V, k), order)

    e = s.error_bound
    assert 0 < e <= (n - int(s.counts.sum())) / (k + 1) <= n / (k + 1)
    assert s.ids.size <= k
    reported = dict(zip(s.ids.tolist(), s.counts.tolist()))
    for i, cnt in reported.items():
        assert truth[i] - e <= cnt <= truth[i]
    must = u[c > e]
    assert must.size > 0  # the test must exercise the guarantee
    assert set(must.tolist()) <= set(reported)


def test_mg_reduce_arithmetic():
    ids = np.array([1, 2, 3, 4, 5])
    counts = np.array([10, 7, 3, 3, 1])
    # k = 2: third largest is 3 -> subtract 3, drop counters <= 3
    out_ids, out_counts, sub = _mg_reduce(ids, counts, 2)
    assert sub == 3
    assert out_ids.tolist() == [1, 2] and out_counts.tolist() == [7, 4]
    same = _mg_reduce(ids, counts, 5)
    assert same[2] == 0 and same[1].tolist() == counts.tolist()


def test_exact_mode_equals_numpy_and_merges_are_associative():
    V = 3_000
    blocks = zipf_blocks(V, 1.2, n_blocks=9, size=2_000, seed=5)
    u, c = np.unique(np.concatenate(blocks), return_counts=True)
    results = [fold(summarize(blocks, V, None), o) for o in ("left", "right", "tree", 7)]
    for s in results:
        assert s.error_bound == 0
        np.testing.assert_array_equal(s.ids, u)
        np.testing.assert_array_equal(s.counts, c)
        d = s.to_stats()
        assert d.distinct == u.size and d.distinct_exact
        assert d.values == d.rows == 18_000
        hh = d.heavy_hitters
        order = np.lexsort((u, -c))
        np.testing.assert_array_equal(hh[:, 0], u[order])
        np.testing.assert_array_equal(hh[:, 1], c[order])


def test_sparse_and_dense_counting_paths_agree():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5_000_000, size=10_000)  # V >> n: np.unique path
    s = TableSummary.from_values("C1", 5_000_000, ids, rows=ids.size, capacity=None)
    u, c = np.unique(ids, return_counts=True)
    np.testing.assert_array_equal(s.ids, u)
    np.testing.assert_array_equal(s.counts, c)
    small = ids % 1000  # V small: bincount path
    s2 = TableSummary.from_values("C1", 1000, small, rows=small.size, capacity=None)
    u2, c2 = np.unique(small, return_counts=True)
    np.testing.assert_array_equal(s2.ids, u2)
    np.testing.assert_array_equal(s2.counts, c2)


def test_distinct_is_exact_by_bitmap_even_when_heavy_hitters_truncate():
    V = 20_000
    blocks = zipf_blocks(V, 1.0, n_blocks=6, size=4_000, seed=11)
    s = fold(summarize(blocks, V, 16), "tree")
    assert s.error_bound > 0
    distinct, exact = s.distinct()
    assert exact and distinct == np.unique(np.concatenate(blocks)).size


# ---- HYPERLOGLOG ---- #


@pytest.mark.parametrize("n", [500, 30_000, 400_000])
def test_hll_within_stated_relative_error(n):
    rng = np.random.default_rng(n)
    ids = rng.choice(2**40, size=n, replace=False)
    h = HyperLogLog()
    h.add(np.concatenate([ids, ids[: n // 3]]))  # duplicates must not count
    rel = abs(h.estimate() - n) / n
    assert rel <= 3 * h.relative_std_error  # 3 sigma = 2.4 % for p = 14


def test_hll_merge_equals_sketch_of_union():
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 10**12, 50_000), rng.integers(0, 10**12, 70_000)
    ha, hb, hu = HyperLogLog(), HyperLogLog(), HyperLogLog()
    ha.add(a)
    hb.add(b)
    hu.add(np.concatenate([a, b]))
    np.testing.assert_array_equal(ha.merge(hb).registers, hu.registers)
    assert HyperLogLog().estimate() == 0.0


def test_large_table_uses_hll_distinct():
    V = 4_000_000  # above DISTINCT_EXACT_MAX_ROWS: HLL
    rng = np.random.default_rng(2)
    blocks = [rng.integers(0, V, 40_000) for _ in range(5)]
    s = fold(summarize(blocks, V, 32), "tree")
    distinct, exact = s.distinct()
    true = np.unique(np.concatenate(blocks)).size
    assert not exact and abs(distinct - true) / true <= 3 * 1.04 / np.sqrt(2**14)


# ---- BLOCK EXTRACTION ---- #


def test_invalid_ids_counted_with_examples_and_excluded():
    v = np.array([3, -1, 7, 10, 12, 3, 3, -5], dtype=np.int64)
    s = TableSummary.from_values("C9", 10, v, rows=8, capacity=None)
    assert s.invalid == 4 and s.invalid_examples == (-5, -1, 10, 12)
    assert (s.min_id, s.max_id) == (-5, 12)
    assert dict(zip(s.ids.tolist(), s.counts.tolist())) == {3: 3, 7: 1}


def test_multi_hot_column_with_null_and_empty_bags_and_slices():
    arr = pa.array([[1, 2, 2], [], None, [5, None], [7, 7, 7, 7]], type=pa.list_(pa.int64()))
    col = pa.chunked_array([arr.slice(1), arr.slice(0, 1)])  # sliced chunks, in another order
    values, nulls, max_bag = _column_values(col, multi_hot=True)
    assert sorted(values.tolist()) == [1, 2, 2, 5, 7, 7, 7, 7]
    assert nulls == 2 and max_bag == 4  # one null bag, one null id
    s = TableSummary.from_values("C1", 10, values, rows=5, nulls=nulls, max_bag=max_bag, capacity=None)
    d = s.to_stats()
    assert (d.pooling_mean, d.pooling_max) == (8 / 5, 4)
    assert d.heavy_hitters.tolist() == [[7, 4], [2, 2], [1, 1], [5, 1]]


def test_one_hot_column_with_nulls():
    col = pa.chunked_array([pa.array([4, None, 4, 1], pa.int64()), pa.array([None], pa.int64())])
    values, nulls, max_bag = _column_values(col, multi_hot=False)
    assert values.tolist() == [4, 4, 1] and nulls == 2 and max_bag == 1


# ---- CHECKS AND FILES ---- #


def _stats_with(invalid: int):
    return DatasetStats(
        rows=100,
        tables={
            "C1": TableStats(values=100, invalid=0, invalid_examples=(), min_id=0, max_id=9),
            "C2": TableStats(values=100, invalid=invalid, invalid_examples=(-3, 50), min_id=-3, max_id=50),
        },
    )


def test_check_ids_error_names_column_count_and_examples():
    schema = DatasetSchema("label", (), (SparseFeature("C1", 10), SparseFeature("C2", 20)))
    with pytest.raises(DataError) as ei:
        check_ids(_stats_with(7), schema, "error")
    msg = str(ei.value)
    assert ei.value.category == "invalid_ids"
    assert "'C2'" in msg and "7 of 100" in msg and "[-3, 50]" in msg and "'C1'" not in msg
    check_ids(_stats_with(7), schema, "hash")
    check_ids(_stats_with(7), schema, "clip")
    check_ids(_stats_with(0), schema, "error")


def _write_dataset(root, table: pa.Table, sparse):
    os.makedirs(os.path.join(root, "train"))
    pq.write_table(table, os.path.join(root, "train", "part-00000.parquet"))
    DatasetSchema("label", (), tuple(sparse)).save(str(root))
    return str(root)


def test_missing_column_error_names_it(tmp_path):
    t = pa.table({"label": pa.array([0.0, 1.0]), "C1": pa.array([1, 2], pa.int64())})
    d = _write_dataset(tmp_path, t, [SparseFeature("C1", 5), SparseFeature("C2", 5)])
    with pytest.raises(DataError) as ei:
        compute_stats(d)
    assert "C2" in str(ei.value) and "missing" in str(ei.value)


def test_wrong_dtype_error_names_it(tmp_path):
    t = pa.table({"label": pa.array([0.0, 1.0]), "C1": pa.array(["a", "b"])})
    d = _write_dataset(tmp_path, t, [SparseFeature("C1", 5)])
    with pytest.raises(DataError) as ei:
        compute_stats(d)
    assert "'C1'" in str(ei.value) and "int64" in str(ei.value)


def test_stats_json_roundtrip_and_plot(tmp_path):
    V = 1000
    blocks = zipf_blocks(V, 1.1, n_blocks=3, size=3000)
    s = fold(summarize(blocks, V, 100), "tree")
    stats = DatasetStats(rows=9000, fingerprint="x", tables={"C1": s.to_stats(), "C2": s.to_stats()})
    path = write_stats_json(stats, str(tmp_path / "out" / "stats.json"))
    assert load_stats_json(path).to_dict() == stats.to_dict()
    png = plot_frequencies(stats, str(tmp_path / "freq.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "bad.json").write_text('{"schema_version": 99}')
    with pytest.raises(DataError):
        load_stats_json(str(tmp_path / "bad.json"))
    with pytest.raises(DataError):
        load_stats_json(str(tmp_path / "none.json"))


# ---- STATS.JSON FORMAT ---- #

# A stats.json that rayemb wrote before statistics were typed (compute_stats over 2 small files, k = 4;
# data_dir shortened): a multi-hot table with nulls and invalid ids, a one-hot one, and a HyperLogLog table.
OLD_STATS_JSON = (
    '{"schema_version": 1, "rows": 80, "fingerprint": "sha256:c496f7c21f9295981a6ae0f6c3f27333", '
    '"data_dir": "/data/synth", "split": "train", "exact": false, "num_heavy_hitters": 4, "elapsed_s": 4.641, '
    '"values": {"rows": 80, "label": {"nulls": 0, "non_finite": 0, "not_binary": 1, "positives": 28, '
    '"examples": [0.5]}, "dense_non_finite": {"I1": 1}}, "tables": {'
    '"C1": {"num_embeddings": 250, "rows": 80, "values": 122, "distinct": 30, "distinct_exact": true, '
    '"invalid": 4, "invalid_examples": [299], "nulls": 14, "min_id": 0, "max_id": 299, '
    '"pooling_factor": {"mean": 1.525, "max": 4}, "heavy_hitters": [[0, 46], [1, 17], [2, 4], [3, 2]], '
    '"error_bound": 4}, '
    '"C2": {"num_embeddings": 50, "rows": 80, "values": 70, "distinct": 31, "distinct_exact": true, '
    '"invalid": 9, "invalid_examples": [50, 51, 52, 53], "nulls": 10, "min_id": 0, "max_id": 53, '
    '"pooling_factor": {"mean": 0.875, "max": 1}, "heavy_hitters": [[32, 1], [44, 1]], "error_bound": 5}, '
    '"C3": {"num_embeddings": 5000000, "rows": 80, "values": 80, "distinct": 79, "distinct_exact": false, '
    '"invalid": 0, "invalid_examples": [], "nulls": 0, "min_id": 11257, "max_id": 4800354, '
    '"pooling_factor": {"mean": 1.0, "max": 1}, "heavy_hitters": [], "error_bound": 2}}}'
)


def test_stats_json_written_before_typed_stats_round_trips_byte_for_byte(tmp_path):
    old = json.loads(OLD_STATS_JSON)
    old_text = json.dumps(old, indent=1)  # what write_stats_json wrote
    (tmp_path / "old.json").write_text(old_text)
    stats = load_stats_json(str(tmp_path / "old.json"))
    assert stats.rows == 80 and stats.num_heavy_hitters == 4 and stats.split == "train" and not stats.exact
    assert stats.values.label_not_binary == 1 and stats.values.dense_non_finite == {"I1": 1}
    c1, c3 = stats.tables["C1"], stats.tables["C3"]
    assert c1.heavy_hitters.dtype == np.int64 and c1.heavy_hitters[:, 1].tolist() == [46, 17, 4, 2]
    assert (c1.pooling_mean, c1.pooling_max, c1.invalid_examples) == (1.525, 4, (299,))
    assert c3.heavy_hitters.shape == (0, 2) and not c3.distinct_exact and c3.error_bound == 2
    assert stats.to_dict() == old
    write_stats_json(stats, str(tmp_path / "new.json"))
    assert (tmp_path / "new.json").read_text() == old_text
    assert pickle.loads(pickle.dumps(stats)).to_dict() == old  # a Ray task receives it pickled


def test_older_stats_json_without_values_and_exact_mode_round_trip():
    old = json.loads(OLD_STATS_JSON)
    del old["values"]  # written before the value checks: a job recomputes it
    old.update(exact=True, num_heavy_hitters=None)
    stats = DatasetStats.from_dict(old)
    assert stats.values is None and stats.num_heavy_hitters is None
    assert stats.to_dict() == old and list(stats.to_dict()) == list(old)


def test_format_stats_table_unchanged():
    assert format_stats_table(DatasetStats.from_dict(json.loads(OLD_STATS_JSON))) == (
        "table             V   distinct   pool  top-1 %  invalid     err\n"
        "---------------------------------------------------------------\n"
        "C1              250         30   1.52    37.70        4       4\n"
        "C2               50         31   0.88     1.43        9       5\n"
        "C3        5,000,000        ~79   1.00     0.00        0       2"
    )
