"""The pure parts of jobs/bench/stats.py (like-for-like ratios, sharding, merging) and jobs/bench/hybrid_auc.py
(statistics over seeds, paired differences). No Ray."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests._bench import load_bench as _load


st = _load("stats")
ha = _load("hybrid_auc")


# ---- stats: like-for-like ratios ---- #


def _rows():
    r = st._result
    return [
        r("rayemb", 1000, 26, 1.0, 1, "all"),
        r("rayemb_cold", 1000, 26, 2.0, 1, "all"),
        r("rayemb", 1000, 26, 0.5, 2, "all"),            # same work, other core count
        r("rayemb_subset", 100, 2, 0.1, 1, "subset"),
        r("ray_groupby", 100, 2, 10.0, 1, "subset"),
        r("numpy", 1000, 26, 0.25, 1, "all"),
        r("numpy", 1000, 26, 0.2, 2, "all"),
        r("pandas", 1000, 26, 1.0, 4, "all"),           # no rayemb row on 4 cores
    ]


def test_ratios_only_between_rows_of_equal_cores_and_work():
    out = st.compare_like_for_like(_rows())
    by = {(r["method"], r["cores"]): r for r in out}
    for r in out:
        if r["compared_with"] is None:
            continue
        ref = next(x for x in out if x["method"] == r["compared_with"] and x["cores"] == r["cores"]
                   and x["rows"] == r["rows"] and x["tables"] == r["tables"])
        assert ref["work"] == r["work"]
        assert r["rayemb_is"] == pytest.approx(ref["values_per_s"] / r["values_per_s"])
    assert by[("rayemb", 1)]["rayemb_is"] == pytest.approx(1.0)
    assert by[("rayemb_cold", 1)]["rayemb_is"] == pytest.approx(2.0)
    assert by[("numpy", 1)]["rayemb_is"] == pytest.approx(0.25)      # vs rayemb on 1 core, not on 2
    assert by[("numpy", 2)]["rayemb_is"] == pytest.approx(0.2 / 0.5)  # vs rayemb on 2 cores
    # the groupby subset is compared with rayemb on the same subset, never with the full pass
    assert by[("ray_groupby", 1)]["compared_with"] == "rayemb_subset"
    assert by[("ray_groupby", 1)]["rayemb_is"] == pytest.approx(100.0)
    assert by[("pandas", 4)]["rayemb_is"] is None and by[("pandas", 4)]["compared_with"] is None


def test_speedups_leave_out_references_and_unmatched_rows():
    only_one_core = [r for r in _rows() if r["cores"] == 1]
    sp = st.speedups(st.compare_like_for_like(only_one_core))
    assert set(sp) == {"rayemb_cold", "ray_groupby", "numpy"}
    assert "pandas" not in st.speedups(st.compare_like_for_like(_rows()))


def test_result_records_cores_work_and_io():
    r = st._result("numpy_io", 10, 3, 2.0, 4, "all")
    assert (r["cores"], r["work"], r["values"], r["values_per_s"], r["reads_parquet"]) == (4, "all", 30, 15.0, True)
    assert st._result("numpy", 10, 3, 2.0, 4, "all")["reads_parquet"] is False
    assert st._result("ray_groupby", 10, 3, 2.0, 4, "subset")["reads_parquet"] is False


def test_shard_files_is_disjoint_complete_and_balanced():
    files = [(f"f{i}", rows) for i, rows in enumerate([250, 250, 250, 250, 100, 50])]
    shards = st.shard_files(files, 2)
    flat = sorted(f for s in shards for f in s)
    assert flat == sorted(f for f, _ in files)
    rows = dict(files)
    loads = [sum(rows[f] for f in s) for s in shards]
    assert max(loads) - min(loads) <= 100
    assert st.shard_files(files, 1) == [sorted(f for f, _ in files)]
    assert sum(1 for s in st.shard_files(files[:1], 3) if s) == 1  # more workers than files: some idle


def test_merge_counts_gives_the_histogram_of_all_the_data():
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 50, size=n) for n in (1000, 700, 3)]
    whole = np.concatenate(parts)
    want_ids, want_counts = np.unique(whole, return_counts=True)

    got = st.merge_counts("numpy", [{"C1": np.unique(p, return_counts=True)} for p in parts])["C1"]
    np.testing.assert_array_equal(got[0], want_ids)
    np.testing.assert_array_equal(got[1], want_counts)
    assert st.total_count("numpy", got) == len(whole)

    got = st.merge_counts("numpy_bincount", [{"C1": np.bincount(p, minlength=50)} for p in parts])["C1"]
    np.testing.assert_array_equal(got, np.bincount(whole, minlength=50))
    assert st.total_count("numpy_bincount", got) == len(whole)

    pd = pytest.importorskip("pandas")
    got = st.merge_counts("pandas", [{"C1": pd.Series(p).value_counts()} for p in parts])["C1"]
    assert dict(got) == dict(zip(want_ids.tolist(), want_counts.tolist()))
    assert st.total_count("pandas", got) == len(whole)

    one = {"C1": np.unique(parts[0], return_counts=True)}
    assert st.merge_counts("numpy", [one]) is one  # one worker: nothing to merge


# ---- hybrid_auc: statistics over seeds ---- #


def _runs():
    auc = {(0, True): 0.80, (0, False): 0.81, (1, True): 0.83, (1, False): 0.82, (2, True): 0.79, (2, False): 0.80}
    return [{"seed": s, "hybrid": h, "valid_auc": a, "valid_logloss": 1.0 - a} for (s, h), a in auc.items()]


def test_describe_mean_min_max_and_sample_std():
    d = ha.describe([1.0, 2.0, 3.0, 4.0])
    assert d["n"] == 4 and d["mean"] == pytest.approx(2.5) and (d["min"], d["max"]) == (1.0, 4.0)
    assert d["std"] == pytest.approx(np.std([1, 2, 3, 4], ddof=1))
    assert ha.describe([0.7])["std"] is None and ha.describe([0.7])["mean"] == 0.7
    assert ha.describe([])["n"] == 0 and ha.describe([])["mean"] is None


def test_paired_differences_match_seeds_and_skip_unpaired():
    runs = _runs() + [{"seed": 9, "hybrid": True, "valid_auc": 0.5, "valid_logloss": 0.5}]  # seed 9: no partner
    seeds, diffs = ha.paired_differences(runs, "valid_auc")
    assert seeds == [0, 1, 2]
    assert diffs == pytest.approx([-0.01, 0.01, -0.01])


def test_aggregate_per_setting_and_paired():
    agg = ha.aggregate(_runs())
    h, n = agg["summary"]["hybrid"]["valid_auc"], agg["summary"]["no_hybrid"]["valid_auc"]
    assert h["n"] == n["n"] == 3
    assert h["mean"] == pytest.approx((0.80 + 0.83 + 0.79) / 3)
    assert (h["min"], h["max"]) == (0.79, 0.83)
    assert n["std"] == pytest.approx(np.std([0.81, 0.82, 0.80], ddof=1))
    p = agg["paired"]
    assert p["seeds"] == [0, 1, 2]
    assert p["valid_auc_stats"]["mean"] == pytest.approx(-0.01 / 3)
    assert p["valid_auc_stats"]["std"] == pytest.approx(np.std([-0.01, 0.01, -0.01], ddof=1))
    assert p["valid_logloss"] == pytest.approx([0.01, -0.01, 0.01])
    # the mean paired difference equals the difference of the means when every seed is paired
    assert p["valid_auc_stats"]["mean"] == pytest.approx(h["mean"] - n["mean"])
    rows = ha.summary_rows(agg)
    assert [r["setting"] for r in rows] == ["planner.hybrid=true", "planner.hybrid=false", "paired diff (true-false)"]
    assert all(not isinstance(v, float) or math.isfinite(v) for r in rows for v in r.values())


def test_run_order_interleaves_and_alternates():
    assert ha.run_order([0, 1, 2]) == [(0, True), (0, False), (1, False), (1, True), (2, True), (2, False)]
    assert ha.run_order([7]) == [(7, True), (7, False)]


def test_plan_warnings_flag_hybrid_runs_without_hybrid_tables_and_plans_varying_by_seed():
    same = [{"seed": s, "hybrid": h, "placements": {"hybrid": 6, "data_parallel": 20} if h else
             {"table_wise": 6, "data_parallel": 20}} for s in (0, 1) for h in (True, False)]
    assert ha.plan_warnings(same) == []
    odd = [dict(r) for r in same]
    odd[0]["placements"] = {"column_wise": 26}  # seed 0, hybrid=true: no hybrid table, and a plan of its own
    w = ha.plan_warnings(odd)
    assert len(w) == 2
    assert w[0].startswith("seed 0: planner.hybrid=true placed no table hybrid")
    assert w[1].startswith("planner.hybrid=true: the plan differs between seeds")


def test_hot_tables_and_setting_overrides():
    split = {"tables": {"C10": {"num_hot": 278, "num_embeddings": 29276}, "C2": {"num_hot": 36, "num_embeddings": 37},
                        "C12": {"num_hot": 346, "num_embeddings": 346},  # all hot: left to the planner
                        "C1": {"num_hot": 266, "num_embeddings": 45834}, "C3": {"num_hot": 0, "num_embeddings": 9}}}
    assert ha.hot_tables(split) == ["C1", "C2", "C10"]
    assert ha.setting_overrides(False, ["C1"]) == ["planner.hybrid=false"]
    assert ha.setting_overrides(True, None) == ["planner.hybrid=true"]
    assert ha.setting_overrides(True, ["C1", "C2"]) == [
        "planner.hybrid=true", "planner.tables.C1.hybrid=true", "planner.tables.C2.hybrid=true"]
