"""The pure parts of jobs/bench/multinode.py: the hybrid row's pins and the acceptance verdicts (no cluster)."""

from __future__ import annotations

import pytest

from tests._bench import load_bench as _load

mn = _load("multinode")


def test_hybrid_rows_pin_their_tables_hybrid_and_the_rest_where_the_pooled_plan_put_them():
    pooled = {"C1": "table_wise", "C2": "data_parallel", "C3": "column_wise", "C4": "table_wise", "C5": "data_parallel"}
    hot = ["C1", "C2", "C3", "C5"]  # C4 has no hot set
    infrequent = ["C1", "C2", "C3"]  # C5's cold remainder is only rounding: all its rows are frequent
    # hybrid (HugeCTR's rule): every table with infrequent rows, data-parallel ones included
    assert mn.hybrid_tables("hybrid", pooled, hot, infrequent) == ["C1", "C2", "C3"]
    # hybrid_mp: only the pooled plan's model-parallel tables with a hot set
    assert mn.hybrid_tables("hybrid_mp", pooled, hot, infrequent) == ["C1", "C3"]
    pins = mn.hybrid_pins(pooled, mn.hybrid_tables("hybrid_mp", pooled, hot, infrequent))
    assert pins == ["planner.tables.C1.hybrid=true", "planner.tables.C2.sharding=data_parallel",
                    "planner.tables.C3.hybrid=true", "planner.tables.C4.sharding=table_wise",
                    "planner.tables.C5.sharding=data_parallel"]
    pins = mn.hybrid_pins(pooled, mn.hybrid_tables("hybrid", pooled, hot, infrequent))
    assert pins[1] == "planner.tables.C2.hybrid=true" and pins[4] == "planner.tables.C5.sharding=data_parallel"


def test_split_tables_reads_the_auto_runs_split(tmp_path):
    import json

    (tmp_path / "split.json").write_text(json.dumps({"tables": {
        "C1": {"num_hot": 94, "num_embeddings": 45834, "limited_by": "threshold"},
        "C13": {"num_hot": 2, "num_embeddings": 3, "limited_by": "candidates"}}}))
    assert mn.split_tables({"job_dir": str(tmp_path)}) == ["C1"]
    assert mn.split_tables({"job_dir": str(tmp_path / "missing")}) is None and mn.split_tables({}) is None


def _row(bw, variant, sps, pred_ms=None):
    step = 1024 / sps * 1e3
    return {"bandwidth_mbit": bw, "variant": variant, "samples_per_s": sps, "step_ms": step,
            "predicted_over_measured": (pred_ms / step) if pred_ms else None}


def test_acceptance_verdicts_per_bandwidth():
    rows = [_row(100, "auto", 22_000, 50), _row(100, "hybrid", 21_000, 50), _row(100, "no_hybrid", 19_000, 55),
            _row(100, "hybrid_mp", 20_000, 50),
            _row(100, "table_wise", 6_000, 170), _row(50, "auto", 14_000, 75), _row(50, "hybrid", 14_500, 70),
            _row(50, "no_hybrid", 10_000, 100), _row(1000, "auto", 40_000, 20), _row(1000, "hybrid", 30_000, 40)]
    acc = mn.acceptance(rows)
    assert acc["per_bandwidth"]["100"]["hybrid_vs_pooled"] == pytest.approx(21_000 / 19_000)
    assert acc["per_bandwidth"]["100"]["hybrid_vs_pooled_pass"] is False  # 1.11 < 1.3
    assert acc["per_bandwidth"]["100"]["hybrid_mp_vs_pooled"] == pytest.approx(20_000 / 19_000)  # reported only
    assert acc["per_bandwidth"]["50"]["hybrid_vs_pooled_pass"] is True  # 1.45
    assert "hybrid_vs_pooled_pass" not in acc["per_bandwidth"]["1000"]  # fast links: reported, not judged
    assert acc["hybrid_vs_pooled_pass"] is False
    assert acc["per_bandwidth"]["50"]["auto_vs_best"] == pytest.approx(14_000 / 14_500)
    assert acc["auto_vs_best_pass"] is True  # 0.966 >= 0.95 at 50; auto is the best row elsewhere
    assert acc["prediction_pass"] is False  # 1000 mbit hybrid: 40 ms predicted vs 34 measured is fine, ...
    assert acc["per_bandwidth"]["1000"]["worst_prediction_error"] == pytest.approx(abs(20 / (1024 / 40_000 * 1e3) - 1))


def test_repeats_make_one_row_of_medians():
    runs = [dict(_row(100, "auto", sps, 45.0), predicted_ms=pred, plan_summary=plan, mb_per_step=0.6)
            for sps, pred, plan in ((20_000, 45.0, "a"), (26_000, 47.0, "a"), (24_000, 50.0, "b"))]
    row = mn.median_row(runs)
    assert row["repeats"] == 3 and row["samples_per_s_runs"] == [20_000, 26_000, 24_000]
    assert row["samples_per_s"] == 24_000 and row["predicted_ms"] == 47.0
    assert row["step_ms"] == pytest.approx(1024 / 24_000 * 1e3)  # the median step is the median run's
    assert row["predicted_over_measured"] == pytest.approx(47.0 / (1024 / 24_000 * 1e3))
    assert row["plans"] == ["a", "b"] and row["variant"] == "auto"
    failed = mn.median_row([{"bandwidth_mbit": 50, "variant": "hybrid", "samples_per_s": None}])
    assert failed["samples_per_s"] is None and failed["predicted_over_measured"] is None


def test_by_plan_pools_the_runs_of_identical_plans():
    """auto and hybrid running the same placements are one plan: their runs pool, and auto's plan is then the
    best plan however their rows' medians fell; each plan's median is over every run of it."""
    same, pooled = {"C1": "hybrid", "C2": "data_parallel"}, {"C1": "table_wise", "C2": "data_parallel"}
    runs = [{"bandwidth_mbit": 100.0, "variant": v, "samples_per_s": sps, "plan": dict(plan), "plan_summary": v}
            for v, sps, plan in (("auto", 19_000, same), ("auto", 20_000, same), ("auto", 25_000, same),
                                 ("hybrid", 27_000, same), ("hybrid", 26_000, same), ("hybrid", 18_000, same),
                                 ("no_hybrid", 18_000, pooled), ("no_hybrid", 17_000, pooled),
                                 ("no_hybrid", None, pooled))]
    e = mn.by_plan(runs)["100.0"]
    assert [(p["variants"], len(p["runs"])) for p in e["plans"]] == [(["auto", "hybrid"], 6), (["no_hybrid"], 2)]
    assert e["plans"][0]["samples_per_s"] == 22_500 and e["plans"][1]["samples_per_s"] == 17_500
    assert e["auto_plan_vs_best_plan"] == 1.0
    assert e["hybrid_plan_vs_pooled_plan"] == pytest.approx(22_500 / 17_500)
    rows = [mn.median_row([r for r in runs if r["variant"] == v]) for v in ("auto", "hybrid", "no_hybrid")]
    assert mn.acceptance(rows)["per_bandwidth"]["100.0"]["auto_vs_best"] == pytest.approx(20_000 / 26_000)
    runs[0]["plan"] = dict(pooled)  # a run that chose another plan is another plan's run
    e = mn.by_plan(runs)["100.0"]
    assert [sorted(p["runs"]) for p in e["plans"]] == [[17_000, 18_000, 19_000],
                                                       [18_000, 20_000, 25_000, 26_000, 27_000]]
    assert e["auto_plan_vs_best_plan"] == 1.0  # auto's plan: the one 2 of its 3 runs chose
