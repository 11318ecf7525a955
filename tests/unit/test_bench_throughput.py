"""The pure parts of jobs/bench/throughput.py and jobs/bench/peer_torchrec.py (no Ray, no torchrun)."""

from __future__ import annotations

import os

import pytest

from tests._bench import BENCH_DIR, load_bench as _load


tp = _load("throughput")
peer = _load("peer_torchrec")

TABLES = ["C1", "C2", "C3"]


# ---- steady windows ---- #


def test_steady_median_drops_the_first_window_and_epoch_end_reports():
    reports = [
        {"step": 40, "samples_per_s": 30000.0},
        {"step": 20, "samples_per_s": 1500.0},  # warm-up window, out of order on purpose
        {"step": 60, "samples_per_s": 28000.0},
        {"step": 80, "samples_per_s": 29000.0},
        {"step": 80, "epoch_end": 1, "valid_auc": 0.9},
    ]
    assert tp.steady_windows(reports) == [30000.0, 28000.0, 29000.0]
    assert tp.steady_median(reports) == 29000.0


def test_steady_median_single_window_and_missing_key():
    assert tp.steady_median([{"step": 20, "samples_per_s": 1000.0}]) == 1000.0
    assert tp.steady_median([{"step": 20, "valid_auc": 0.9}]) is None
    assert tp.steady_median([]) is None


def test_steady_median_of_phase_times():
    reports = [{"step": 20 * i, "time_s.forward": v} for i, v in enumerate([0.5, 0.01, 0.03, 0.02], start=1)]
    assert tp.steady_median(reports, "time_s.forward") == pytest.approx(0.02)


def test_reports_from_mlflow_histories_merge_by_step():
    hist = {"samples_per_s": [(40, 2.0), (20, 1.0)], "time_s.forward": [(20, 0.1)], "valid_auc": [(40, 0.9)]}
    reports = tp.reports_from_histories(hist)
    assert reports == [{"step": 20, "samples_per_s": 1.0, "time_s.forward": 0.1},
                       {"step": 40, "samples_per_s": 2.0, "valid_auc": 0.9}]
    assert tp.steady_median(reports) == 2.0


# ---- overrides per variant ---- #


def test_variant_overrides_pin_every_table():
    assert tp.variant_overrides("auto", TABLES) == []
    assert tp.variant_overrides("no_hybrid", TABLES) == ["planner.hybrid=false"]
    assert tp.variant_overrides("data_parallel", TABLES) == [f"planner.tables.{t}.sharding=data_parallel" for t in TABLES]
    assert tp.variant_overrides("table_wise", TABLES) == [f"planner.tables.{t}.sharding=table_wise" for t in TABLES]
    assert tp.variant_overrides("hybrid", TABLES, ["C1", "C3"]) == ["planner.tables.C1.hybrid=true",
                                                                    "planner.tables.C3.hybrid=true"]
    with pytest.raises(ValueError):
        tp.variant_overrides("hybrid", TABLES)
    with pytest.raises(ValueError):
        tp.variant_overrides("column_wize", TABLES)


@pytest.mark.parametrize("variant", ["auto", "no_hybrid", "data_parallel", "table_wise", "hybrid", "row_wise",
                                     "table_wise_no_prefetch"])
def test_overrides_make_a_valid_config_with_the_pins(variant, tmp_path):
    from rayemb.config import load_config
    from rayemb.train.sharding import pins_of

    overrides = tp.common_overrides("/data/x", str(tmp_path), steps=100, window=20, batch_size=512, world=2,
                                    run_name="r", stats_path="/s/stats.json")
    overrides += tp.variant_overrides(variant, TABLES, ["C1", "C2"])
    cfg = load_config(tp.CONFIG, overrides)
    assert cfg.train.epochs == 1 and cfg.train.max_steps_per_epoch == 120
    assert cfg.train.log_every_n_steps == 20 and cfg.train.early_stopping_patience is None
    assert cfg.data.path == "/data/x" and cfg.data.stats_path == "/s/stats.json"
    assert cfg.data.batch_size * cfg.scaling.num_workers == 1024
    assert cfg.tracking.output_dir == str(tmp_path)
    pins = pins_of(cfg, TABLES)
    assert cfg.train.prefetch_input_dist is (variant != "table_wise_no_prefetch")
    if variant == "auto":
        assert pins == {}
    elif variant == "no_hybrid":
        assert all(p.hybrid is False and p.sharding is None for p in pins.values()) and set(pins) == set(TABLES)
    elif variant == "hybrid":
        assert set(pins) == {"C1", "C2"} and all(p.hybrid is True for p in pins.values())
    else:
        plan = variant.removesuffix("_no_prefetch")
        assert set(pins) == set(TABLES) and all(p.sharding.value == plan for p in pins.values())


def test_hot_tables_of_split_json_in_natural_order():
    split = {"tables": {"C10": {"num_hot": 3, "num_embeddings": 100}, "C2": {"num_hot": 0, "num_embeddings": 9},
                        "C1": {"num_hot": 5, "num_embeddings": 50}, "C3": {},
                        "C4": {"num_hot": 8, "num_embeddings": 8}}}  # all rows hot: no cold half, not hybrid
    assert tp.hot_tables_of(split) == ["C1", "C10"]


def test_infrequent_tables_leave_out_rounding_remainders():
    split = {"tables": {"C1": {"num_hot": 94, "num_embeddings": 45834, "limited_by": "threshold"},
                        "C12": {"num_hot": 132, "num_embeddings": 346, "limited_by": "memory"},
                        "C13": {"num_hot": 2, "num_embeddings": 3, "limited_by": "candidates"},  # 3 frequent rows, W=2
                        "C15": {"num_hot": 12, "num_embeddings": 12, "limited_by": "threshold"}}}  # all hot
    assert tp.hot_tables_of(split) == ["C1", "C12", "C13"]
    assert tp.infrequent_tables_of(split) == ["C1", "C12"]


def test_round_order_starts_with_peer_then_auto_and_rotates():
    variants = ["auto", "data_parallel", "hybrid"]
    assert tp.round_order(variants, 0) == ["peer", "auto", "data_parallel", "hybrid"]
    assert tp.round_order(variants, 1) == ["auto", "data_parallel", "hybrid", "peer"]
    assert sorted(tp.round_order(variants, 5)) == sorted(tp.round_order(variants, 0))


def test_plan_summary_counts_most_common_first():
    assert tp.plan_summary({"C1": "hybrid", "C2": "data_parallel", "C3": "data_parallel"}) == \
        "data_parallel x2, hybrid x1"


# ---- aggregation and acceptance ---- #


def _runs():
    return [
        {"variant": "peer", "kind": "peer", "samples_per_s": 100.0, "plan": {"C1": "table_wise"}},
        {"variant": "peer", "kind": "peer", "samples_per_s": 120.0, "step_ms_mean": 30.0},
        {"variant": "auto", "kind": "auto", "samples_per_s": 110.0, "plan": {"C1": "hybrid"},
         "time_s": {"data_wait": 0.001, "forward": 0.01, "backward": 0.01, "optimizer": 0.002}},
        {"variant": "auto", "kind": "auto", "samples_per_s": 120.0},
        {"variant": "data_parallel", "kind": "forced", "samples_per_s": 100.0},
        {"variant": "table_wise", "kind": "forced", "samples_per_s": 118.0},
        {"variant": "table_wise", "kind": "forced", "samples_per_s": None},  # a failed run
    ]


def test_aggregate_means_and_failed_runs():
    rows = tp.aggregate(_runs())
    assert rows["peer"]["samples_per_s"] == 110.0 and rows["peer"]["runs"] == 2
    assert rows["peer"]["samples_per_s_min"] == 100.0 and rows["peer"]["samples_per_s_max"] == 120.0
    assert rows["auto"]["samples_per_s"] == 115.0 and rows["auto"]["plan"] == {"C1": "hybrid"}
    assert rows["auto"]["time_s"]["forward"] == pytest.approx(0.01)
    assert rows["table_wise"]["runs"] == 1 and rows["table_wise"]["failed"] == 1


def test_acceptance_ratios_and_verdicts():
    rows = tp.aggregate(_runs())
    acc = tp.acceptance(rows, ["data_parallel", "table_wise"])
    assert acc["auto_vs_peer"] == pytest.approx(115 / 110) and acc["auto_vs_peer_pass"] is True
    assert acc["best_pure"] == "table_wise"
    assert acc["auto_vs_best_pure"] == pytest.approx(115 / 118) and acc["auto_vs_best_pure_pass"] is True
    rows["auto"]["samples_per_s"] = 100.0
    acc = tp.acceptance(rows, ["data_parallel", "table_wise"])
    assert acc["auto_vs_peer_pass"] is False and acc["auto_vs_best_pure_pass"] is False
    assert "FAIL" in tp.verdict(acc) and "table_wise" in tp.verdict(acc)


def test_acceptance_with_a_missing_side_is_not_applicable():
    acc = tp.acceptance({"auto": {"samples_per_s": 10.0}}, ["data_parallel"])
    assert acc["auto_vs_peer"] is None and acc["auto_vs_peer_pass"] is None
    assert acc["auto_vs_best_pure"] is None and acc["best_pure"] is None
    assert "n/a" in tp.verdict(acc)


def test_table_rows_order_ratios_and_format():
    rows = tp.aggregate(_runs())
    acc = tp.acceptance(rows, ["data_parallel", "table_wise"])
    out = tp.table_rows(rows, acc)
    assert [r["variant"] for r in out] == ["peer", "auto", "data_parallel", "table_wise"]
    assert out[0]["vs_peer"] == 1.0 and out[1]["vs_best_pure"] == pytest.approx(115 / 118)
    assert out[1]["step_ms"] == pytest.approx(23.0) and out[1]["plan_summary"] == "hybrid x1"
    assert out[1]["phases_ms"] == "1.0/10.0/10.0/2.0" and out[0]["step_ms"] == 30.0
    assert out[0]["spread_pct"] == pytest.approx(100 * 20 / 110)
    from _report import format_table

    text = format_table(out, tp.COLUMNS, tp.KEYS)
    assert "peer" in text.splitlines()[1] and "115" in text


# ---- the peer's pure parts ---- #


def test_rank_slices_equal_contiguous_shares():
    assert peer.rank_slices([250, 110], 0, 2) == [(0, 0, 180)]
    assert peer.rank_slices([250, 110], 1, 2) == [(0, 180, 250), (1, 0, 110)]
    shares = [peer.rank_slices([10, 10, 11], r, 3) for r in range(3)]
    assert [sum(b - a for _, a, b in s) for s in shares] == [10, 10, 10]


def test_window_rates_and_default_threads():
    assert peer.window_rates([0.1] * 5, 2, 1000) == pytest.approx([10000.0, 10000.0])
    assert peer.window_rates([0.1], 2, 1000) == []
    assert peer.default_threads(2, cores=2) == 1 and peer.default_threads(4, cores=2) == 1
    assert peer.default_threads(2, cores=16) == 8


def test_peer_imports_nothing_from_rayemb():
    import ast

    with open(os.path.join(BENCH_DIR, "peer_torchrec.py")) as f:
        tree = ast.parse(f.read())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module or "")
    assert "torchrec.models.dlrm" in modules
    assert not [m for m in modules if m.split(".")[0] in ("rayemb", "_report")]


def test_by_plan_pools_the_runs_of_auto_s_plan_with_the_forced_rows_that_ran_it():
    from throughput import by_plan

    tw = {"C1": "table_wise", "C2": "table_wise"}
    hy = {"C1": "hybrid", "C2": "data_parallel"}
    runs = [{"variant": "auto", "plan": tw, "plan_summary": "table_wise x2", "samples_per_s": 54.0},
            {"variant": "table_wise", "plan": tw, "plan_summary": "table_wise x2", "samples_per_s": 66.0},
            {"variant": "auto", "plan": tw, "plan_summary": "table_wise x2", "samples_per_s": 60.0},
            {"variant": "table_wise", "plan": tw, "plan_summary": "table_wise x2", "samples_per_s": 56.0},
            {"variant": "hybrid", "plan": hy, "plan_summary": "hybrid x1, data_parallel x1", "samples_per_s": 44.0},
            {"variant": "peer", "samples_per_s": 57.0}]
    out = by_plan(runs)
    # auto's rows alone: 57 vs table_wise's 61 (0.93); pooled, they are one plan, the best one
    assert out["auto_plan"] == "table_wise x2" and out["auto_plan_vs_best_pure_plan"] == 1.0
    assert sorted(p["samples_per_s"] for p in out["plans"]) == [44.0, 58.0]
    # auto on the slower plan: pooled against the best forced plan
    runs2 = [dict(r, plan=hy, plan_summary="hybrid x1, data_parallel x1") if r["variant"] == "auto" else r for r in runs]
    assert by_plan(runs2)["auto_plan_vs_best_pure_plan"] == 54.0 / 61.0  # median of 54, 60, 44 over table_wise's
