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
    for plan in ("row_wise", "column_wise"):  # the pooled baselines every table pinned to
        assert tp.variant_overrides(plan, TABLES) == [f"planner.tables.{t}.sharding={plan}" for t in TABLES]
    assert {"row_wise", "column_wise"} <= set(tp.DEFAULT_VARIANTS)
    assert tp.variant_overrides("hybrid", TABLES, ["C1", "C3"]) == ["planner.tables.C1.hybrid=true",
                                                                    "planner.tables.C3.hybrid=true"]
    with pytest.raises(ValueError):
        tp.variant_overrides("hybrid", TABLES)
    with pytest.raises(ValueError):
        tp.variant_overrides("column_wize", TABLES)


@pytest.mark.parametrize("variant", ["auto", "no_hybrid", "data_parallel", "table_wise", "hybrid", "row_wise",
                                     "column_wise", "table_wise_no_prefetch"])
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


def _run(variant, sps, step_s=None, pred=None, probed=None, plan=None, **kw):
    kind = "peer" if variant == "peer" else "auto" if variant == "auto" else "forced"
    return dict({"variant": variant, "kind": kind, "samples_per_s": sps, "step_time_s": step_s,
                 "predicted_step_time_s": pred, "probed_step_time_s": probed, "plan": plan}, **kw)


def _runs():
    return [
        _run("peer", 100.0, plan={"C1": "table_wise"}), _run("peer", 120.0, step_ms_mean=30.0),
        _run("peer", 101.0),
        _run("auto", 110.0, 0.020, 0.022, 0.019, plan={"C1": "hybrid"},
             time_s={"data_wait": 0.001, "forward": 0.01, "backward": 0.01, "optimizer": 0.002}),
        _run("auto", 130.0, 0.020, 0.026, 0.020), _run("auto", 112.0, 0.020, 0.024, 0.021),
        _run("data_parallel", 100.0, 0.02, 0.02),
        _run("table_wise", 118.0, 0.02, 0.02),
        _run("table_wise", None),  # a failed run
    ]


def test_aggregate_medians_with_min_max_and_failed_runs():
    rows = tp.aggregate(_runs())
    assert rows["peer"]["samples_per_s"] == 101.0 and rows["peer"]["runs"] == 3  # the median, not the mean (107)
    assert rows["peer"]["samples_per_s_min"] == 100.0 and rows["peer"]["samples_per_s_max"] == 120.0
    assert rows["auto"]["samples_per_s"] == 112.0 and rows["auto"]["plan"] == {"C1": "hybrid"}
    # the model's prediction over the measured step, per run 1.1, 1.3, 1.2: their median with min-max
    assert rows["auto"]["predicted_over_measured"] == pytest.approx(1.2)
    assert rows["auto"]["predicted_over_measured_min"] == pytest.approx(1.1)
    assert rows["auto"]["predicted_over_measured_max"] == pytest.approx(1.3)
    assert rows["auto"]["probed_over_measured"] == pytest.approx(1.0)
    assert rows["peer"]["predicted_over_measured"] is None
    assert rows["auto"]["time_s"]["forward"] == pytest.approx(0.01)
    assert rows["table_wise"]["runs"] == 1 and rows["table_wise"]["failed"] == 1


def _complete(auto=112.0, pred=0.022, runs=5):
    """Every row of a peer/auto/data_parallel/table_wise benchmark with ``runs`` runs each."""
    out = []
    for i in range(runs):
        out += [_run("peer", 100.0 + i), _run("auto", auto + i, 0.020, pred, 0.020, plan={"C1": "hybrid"}),
                _run("data_parallel", 90.0 + i, 0.020, 0.021, plan={"C1": "data_parallel"}),
                _run("table_wise", 114.0 + i, 0.020, 0.019, plan={"C1": "table_wise"})]
    return out


def test_acceptance_ratios_and_verdicts_on_complete_rows():
    acc = tp.acceptance(tp.aggregate(_complete()), ["data_parallel", "table_wise"])
    assert acc["auto_vs_peer"] == pytest.approx(114 / 102) and acc["auto_vs_peer_pass"] is True
    assert acc["best_pure"] == "table_wise"
    assert acc["auto_vs_best_pure"] == pytest.approx(114 / 116) and acc["auto_vs_best_pure_pass"] is True
    assert acc["worst_prediction_row"] == "auto" and acc["worst_prediction_error"] == pytest.approx(0.1)
    assert acc["prediction_pass"] is True and acc["rows_pass"] is True and acc["row_problems"] == {}
    acc = tp.acceptance(tp.aggregate(_complete(auto=95.0, pred=0.025)), ["data_parallel", "table_wise"])
    assert acc["auto_vs_peer_pass"] is False and acc["auto_vs_best_pure_pass"] is False
    assert acc["prediction_pass"] is False  # 25 % over
    assert "FAIL" in tp.verdict(acc) and "table_wise" in tp.verdict(acc)


def test_a_missing_failed_short_or_unpredicted_row_fails_the_verdicts():
    forced = ["data_parallel", "table_wise"]
    no_peer = tp.acceptance(tp.aggregate([r for r in _complete() if r["variant"] != "peer"]), forced)
    assert no_peer["auto_vs_peer"] is None and no_peer["auto_vs_peer_pass"] is False  # not "n/a"
    assert no_peer["row_problems"] == {"peer": "missing"} and no_peer["rows_pass"] is False
    assert "auto_vs_peer = - (target >= 1.0): FAIL" in tp.verdict(no_peer)
    acc = tp.acceptance({"auto": {"samples_per_s": 10.0, "runs": 5, "predicted_over_measured": 1.0}}, forced)
    assert not any(acc[k] for k in ("auto_vs_peer_pass", "auto_vs_best_pure_pass", "prediction_pass", "rows_pass"))
    failed = tp.acceptance(tp.aggregate(_complete() + [_run("table_wise", None)]), forced)
    assert failed["row_problems"] == {"table_wise": "1 failed run(s)"}
    assert failed["auto_vs_best_pure_pass"] is False and failed["prediction_pass"] is False
    assert failed["auto_vs_peer_pass"] is True  # it rests on auto and peer only
    short = tp.acceptance(tp.aggregate(_complete(runs=4)), forced)
    assert short["row_problems"]["auto"] == "4 run(s), fewer than the 5 it needs"
    assert not any(short[k] for k in ("auto_vs_peer_pass", "auto_vs_best_pure_pass", "prediction_pass"))
    unpredicted = [dict(r, predicted_step_time_s=None) if r["variant"] == "data_parallel" else r for r in _complete()]
    acc = tp.acceptance(tp.aggregate(unpredicted), forced)
    assert acc["row_problems"] == {"data_parallel": "no predicted step time"} and acc["prediction_pass"] is False
    # one run of five with a prediction: its ratio is one run's figure, not a verdict's
    once = [dict(r, predicted_step_time_s=None) if r["variant"] == "data_parallel" else r for r in _complete()]
    once[2] = dict(once[2], predicted_step_time_s=0.021)
    rows = tp.aggregate(once)
    assert rows["data_parallel"]["predicted_runs"] == 1 and rows["data_parallel"]["predicted_over_measured"] is not None
    acc = tp.acceptance(rows, forced)
    assert acc["row_problems"] == {
        "data_parallel": "1 of 5 run(s) with a predicted step time, fewer than the 5 it needs"}
    assert acc["prediction_pass"] is False and acc["auto_vs_best_pure_pass"] is False


def test_table_rows_order_ratios_and_format():
    rows = tp.aggregate(_runs())
    acc = tp.acceptance(rows, ["data_parallel", "table_wise"])
    out = tp.table_rows(rows, acc)
    assert [r["variant"] for r in out] == ["peer", "auto", "data_parallel", "table_wise"]
    assert out[0]["vs_peer"] == 1.0 and out[1]["vs_best_pure"] == pytest.approx(112 / 118)
    assert out[1]["step_ms"] == pytest.approx(23.0) and out[1]["plan_summary"] == "hybrid x1"
    assert out[1]["phases_ms"] == "1.0/10.0/10.0/2.0" and out[0]["step_ms"] == 30.0
    assert out[0]["spread_pct"] == pytest.approx(100 * 20 / 101)
    from _report import format_table

    text = format_table(out, tp.COLUMNS, tp.KEYS)
    assert "peer" in text.splitlines()[1] and "112" in text and "1.20" in text


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


def test_plan_choice_compares_auto_s_own_runs_with_the_forced_runs_of_its_plan():
    tw = {"C1": "table_wise", "C2": "table_wise"}
    hy = {"C1": "hybrid", "C2": "data_parallel"}
    runs = [{"variant": "auto", "plan": tw, "plan_summary": "table_wise x2", "samples_per_s": 54.0},
            {"variant": "table_wise", "plan": tw, "plan_summary": "table_wise x2", "samples_per_s": 66.0},
            {"variant": "auto", "plan": tw, "plan_summary": "table_wise x2", "samples_per_s": 60.0},
            {"variant": "table_wise", "plan": tw, "plan_summary": "table_wise x2", "samples_per_s": 56.0},
            {"variant": "hybrid", "plan": hy, "plan_summary": "hybrid x1, data_parallel x1", "samples_per_s": 44.0},
            {"variant": "peer", "plan": hy, "samples_per_s": 90.0}]
    out = tp.plan_choice(runs)
    # auto trained the fastest row's plan, but its own runs are slower than table_wise's runs of it: 57 vs 61
    assert out["auto_plan"] == "table_wise x2" and out["auto_chose_fastest_plan"] == "yes"
    assert out["fastest_row"] == "table_wise"  # the peer is no rayemb plan
    same = out["auto_vs_same_plan"]
    assert same["ratio"] == pytest.approx(57.0 / 61.0) and same["forced_rows"] == ["table_wise"]
    assert (same["auto"]["min"], same["auto"]["max"], same["forced"]["min"], same["forced"]["max"]) == \
        (54.0, 60.0, 56.0, 66.0)
    assert "auto_plan_vs_best_pure_plan" not in out and "plans" not in out
    # auto on the slower plan, which no forced row ran
    runs2 = [dict(r, plan=hy, plan_summary="hybrid x1, data_parallel x1") if r["variant"] == "auto" else r
             for r in runs]
    out = tp.plan_choice(runs2)
    assert out["auto_chose_fastest_plan"] == "no" and out["fastest_row"] == "table_wise"
    assert out["auto_vs_same_plan"]["forced_rows"] == ["hybrid"]
    assert out["auto_vs_same_plan"]["ratio"] == pytest.approx(57.0 / 44.0)


def test_peer_fields_read_the_peer_s_result():
    res = {"samples_per_s": 50_000.0, "samples_per_s_window_median": 52_000.0,
           "step_ms": {"mean": 21.0, "p50": 20.0}, "threads_per_rank": 1, "loss_last": 0.4,
           "sharding": {"C1": {"sharding_type": "table_wise"}, "C2": {"sharding_type": "data_parallel"}}}
    f = tp.peer_fields(res)
    assert f["samples_per_s"] == 52_000.0 and f["step_time_s"] == pytest.approx(0.020)
    assert f["plan"] == {"C1": "table_wise", "C2": "data_parallel"}
    assert f["plan_summary"] == "data_parallel x1, table_wise x1"


def test_help_runs():
    with pytest.raises(SystemExit) as e:
        tp.main(["--help"])
    assert e.value.code == 0


def test_an_uncalibrated_prediction_is_listed_never_judged_as_the_model_s():
    """A pinned row priced with the built-in constants (plan.json ``prediction: uncalibrated``) has no model
    prediction: its ratio stays out of the worst error, the row is listed, and the prediction verdict FAILs."""
    forced = ["data_parallel", "table_wise"]
    pinned = [dict(r, prediction="uncalibrated", predicted_step_time_s=0.0012) if r["variant"] == "table_wise"
              else dict(r, prediction="calibrated") for r in _complete()]
    rows = tp.aggregate(pinned)
    assert rows["table_wise"]["uncalibrated_runs"] == 5 and rows["table_wise"]["predicted_runs"] == 0
    assert rows["table_wise"]["predicted_over_measured"] is None
    acc = tp.acceptance(rows, forced)
    assert acc["uncalibrated_rows"] == ["table_wise"]
    assert acc["prediction_problems"] == {
        "table_wise": "uncalibrated prediction in 5 of 5 run(s) (built-in constants)"}
    assert acc["worst_prediction_row"] == "auto" and acc["prediction_pass"] is False
    assert "[table_wise: uncalibrated prediction in 5 of 5 run(s) (built-in constants)]" in tp.verdict(acc)
    # its throughput is measured like any row's: the verdicts on throughput stand on it
    assert acc["row_problems"] == {} and acc["rows_pass"] is True
    assert acc["auto_vs_best_pure_pass"] is True and acc["auto_vs_peer_pass"] is True
    # a row that has no prediction at all (not uncalibrated: missing) still fails every verdict it rests on
    unpredicted = [dict(r, predicted_step_time_s=None, prediction="calibrated") if r["variant"] == "table_wise"
                   else r for r in pinned]
    acc = tp.acceptance(tp.aggregate(unpredicted), forced)
    assert acc["row_problems"] == {"table_wise": "no predicted step time"} and acc["auto_vs_best_pure_pass"] is False
    # a plan.json from before ``prediction`` existed: its calibration's source says the same
    assert tp.uncalibrated({"calibration": {"source": "default"}})
    assert not tp.uncalibrated({"calibration": {"source": "cached"}}) and not tp.uncalibrated({})


def test_a_link_measured_prediction_is_judged_and_listed():
    """A pinned row whose job measured its link (plan.json ``prediction: link-measured``) has the job's
    prediction for the cluster: judged in the prediction verdict like a calibrated row's, and listed."""
    forced = ["data_parallel", "table_wise"]
    pinned = [dict(r, prediction="link-measured") if r["variant"] == "table_wise" else dict(r, prediction="calibrated")
              for r in _complete()]
    rows = tp.aggregate(pinned)
    assert rows["table_wise"]["link_measured_runs"] == 5 and rows["table_wise"]["predicted_runs"] == 5
    acc = tp.acceptance(rows, forced)
    assert acc["link_measured_rows"] == ["table_wise"] and acc["uncalibrated_rows"] == []
    assert acc["prediction_pass"] is True and acc["row_problems"] == {} and acc.get("prediction_problems") == {}
    assert "(link measured, compute built in: table_wise)" in tp.verdict(acc)

