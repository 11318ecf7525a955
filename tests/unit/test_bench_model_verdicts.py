"""The verdicts of jobs/bench/model_auc.py and jobs/bench/regression.py: a missing or failed run is a FAIL."""

from __future__ import annotations

import pytest

from tests._bench import load_bench as _load

ma = _load("model_auc")
rg = _load("regression")


def _r(seed, side, task, auc):
    """A run whose last epoch scored ``auc``; its best epoch, picked on the same rows, higher."""
    return {"seed": seed, "side": side, "task": task, "valid_auc": auc, "best_valid_auc": auc + 0.02}


def test_dcn_v2_passes_within_the_margin_and_fails_below_it_or_without_a_run():
    ok = [_r(0, "dlrm", "label", 0.80), _r(0, "dcn_v2", "label", 0.796), _r(1, "dlrm", "label", 0.8),
          _r(1, "dcn_v2", "label", 0.81)]
    assert ma.verdicts("models", ok, [0, 1], None)["dcn_v2_vs_dlrm"]["verdict"] == "PASS"
    low = ok[:1] + [_r(0, "dcn_v2", "label", 0.794)] + ok[2:]
    assert ma.verdicts("models", low, [0, 1], None)["dcn_v2_vs_dlrm"]["verdict"] == "FAIL"
    assert ma.verdicts("models", ok[:3], [0, 1], None)["dcn_v2_vs_dlrm"]["verdict"] == "FAIL"  # seed 1 missing


def test_every_auc_verdict_judges_the_last_epoch_not_the_best_one():
    # DCN-v2's best epoch ties DLRM's, its last epoch is 0.009 behind on one seed of three: FAIL
    runs = [_r(s, "dlrm", "label", 0.897) for s in (0, 1, 2)] + [_r(0, "dcn_v2", "label", 0.898),
                                                                  _r(1, "dcn_v2", "label", 0.888),
                                                                  _r(2, "dcn_v2", "label", 0.899)]
    runs[4]["best_valid_auc"] = 0.917
    v = ma.verdicts("models", runs, [0, 1, 2], None)["dcn_v2_vs_dlrm"]
    assert v["verdict"] == "FAIL" and v["diff_per_seed"][1] == pytest.approx(-0.009)
    assert v["median_diff"] == pytest.approx(0.001)  # reported; the verdict needs every seed
    fp32 = dict(_r(0, "fp32", "label", 0.910), best_valid_auc=0.912)
    bf16 = dict(_r(0, "bf16", "label", 0.905), best_valid_auc=0.912)
    assert ma.verdicts("precision", [fp32, bf16], [0], None)["bf16_vs_fp32"]["verdict"] == "FAIL"
    two = [dict(_r(0, "two_tasks", "label", 0.84), best_valid_auc=0.86), _r(0, "two_tasks", "like", 0.88),
           _r(0, "label_only", "label", 0.84), _r(0, "like_only", "like", 0.88)]
    assert ma.verdicts("multitask", two, [0], 0.1)["label_auc"]["verdict"] == "FAIL"


def test_epoch_aucs_take_the_last_epoch_and_report_the_best():
    reports = [{"step": 10, "loss": 0.5}, {"valid_auc": 0.91}, {"valid_auc": 0.93}, {"valid_auc": 0.92}]
    assert ma.epoch_aucs(reports) == {"valid_auc": 0.92, "best_valid_auc": 0.93, "epochs": 3}
    assert ma.epoch_aucs([{"valid_auc.like": 0.8}], ".like")["valid_auc"] == 0.8
    assert ma.epoch_aucs([]) == {"valid_auc": None, "best_valid_auc": None, "epochs": 0}


def test_bf16_passes_within_its_margin_of_fp32_and_fails_beyond_it_or_without_a_run():
    ok = [_r(0, "fp32", "label", 0.910), _r(0, "bf16", "label", 0.9075)]
    assert ma.verdicts("precision", ok, [0], None)["bf16_vs_fp32"]["verdict"] == "PASS"
    far = [_r(0, "fp32", "label", 0.910), _r(0, "bf16", "label", 0.9065)]
    assert ma.verdicts("precision", far, [0], None)["bf16_vs_fp32"]["verdict"] == "FAIL"
    assert ma.verdicts("precision", ok[:1], [0], None)["bf16_vs_fp32"]["verdict"] == "FAIL"


def test_fp16_tables_pass_within_0_003_of_fp32_and_fail_beyond_it_or_without_their_run():
    fp32, bf16 = _r(0, "fp32", "label", 0.910), _r(0, "bf16", "label", 0.909)
    ok = [fp32, bf16, _r(0, "fp16_tables", "label", 0.9075)]
    v = ma.verdicts("precision", ok, [0], None)
    assert v["fp16_tables_vs_fp32"]["verdict"] == "PASS" and v["bf16_vs_fp32"]["verdict"] == "PASS"
    assert v["fp16_tables_vs_fp32"]["rule"] == "|fp16_tables - fp32| <= 0.003"
    far = [fp32, bf16, _r(0, "fp16_tables", "label", 0.9135)]
    assert ma.verdicts("precision", far, [0], None)["fp16_tables_vs_fp32"]["verdict"] == "FAIL"
    missing = ma.verdicts("precision", [fp32, bf16], [0], None)
    assert missing["fp16_tables_vs_fp32"]["verdict"] == "FAIL" and missing["bf16_vs_fp32"]["verdict"] == "PASS"
    failed = [fp32, bf16, {"seed": 0, "side": "fp16_tables", "task": "data", "error": "RuntimeError: x"}]
    assert ma.verdicts("precision", failed, [0], None)["fp16_tables_vs_fp32"]["verdict"] == "FAIL"
    assert "model.embedding_dtype=fp16" in ma.SUITES["precision"]["fp16_tables"][0]


def test_multitask_needs_every_task_learnt_close_to_its_single_task_model():
    runs = [_r(0, "two_tasks", "label", 0.90), _r(0, "two_tasks", "like", 0.88), _r(0, "label_only", "label", 0.902),
            _r(0, "like_only", "like", 0.884)]
    v = ma.verdicts("multitask", runs, [0], 0.1)
    assert [v[k]["verdict"] for k in ("label_auc", "like_auc", "label_vs_single", "like_vs_single",
                                       "label_correlation")] == ["PASS"] * 5
    worse = runs[:3] + [_r(0, "like_only", "like", 0.89)]
    assert ma.verdicts("multitask", worse, [0], 0.1)["like_vs_single"]["verdict"] == "FAIL"
    assert ma.verdicts("multitask", runs, [0], 0.7)["label_correlation"]["verdict"] == "FAIL"
    assert ma.verdicts("multitask", runs[1:], [0], 0.1)["label_auc"]["verdict"] == "FAIL"


def test_regression_ratio_on_medians_and_a_failed_run_fails():
    def runs(old, new):
        return [{"side": "old", "samples_per_s": v} for v in old] + [{"side": "new", "samples_per_s": v} for v in new]

    commits = {"old": "a", "new": "b"}
    s = rg.summarize(runs([100, 101, 99, 100, 102], [98, 99, 97, 100, 99]), commits, 0.97)
    assert s["verdict"] == "PASS" and abs(s["ratio"] - 0.99) < 1e-9 and s["rows"]["new"]["min"] == 97
    assert rg.summarize(runs([100] * 5, [96] * 5), commits, 0.97)["verdict"] == "FAIL"
    assert rg.summarize(runs([100] * 5, [100] * 4 + [None]), commits, 0.97)["verdict"] == "FAIL"
    assert rg.summarize(runs([100] * 4, [100] * 4), commits, 0.97)["problems"] == ["old: 4 runs (< 5)",
                                                                                  "new: 4 runs (< 5)"]


def test_two_tower_needs_its_ratio_over_the_popular_items_on_every_seed():
    tt = _load("two_tower")
    baseline = {"hit_rate_at_50": 0.15}
    ok = [{"seed": 0, "hit_rate_at_50": 0.30}, {"seed": 1, "hit_rate_at_50": 0.19}]
    v = tt.verdict(ok, baseline, [0, 1])
    assert v["verdict"] == "PASS" and v["ratio_per_seed"][1] == pytest.approx(0.19 / 0.15)
    assert tt.verdict([ok[0], {"seed": 1, "hit_rate_at_50": 0.17}], baseline, [0, 1])["verdict"] == "FAIL"
    assert tt.verdict([ok[0], {"seed": 1, "error": "RuntimeError"}], baseline, [0, 1])["verdict"] == "FAIL"
    assert tt.verdict(ok[:1], baseline, [0, 1])["verdict"] == "FAIL"
