"""The verdict of jobs/bench/convert_ray.py: per-core ratio of medians, and a FAIL for a missing, failed or short
row or engines whose datasets differ (no Ray)."""

from __future__ import annotations

import re

import pytest

from tests._bench import load_bench

cr = load_bench("convert_ray")


def _runs(local=(100_000.0,) * 5, ray=(400_000.0,) * 5, errors=()):
    runs = [{"side": "local", "lines_per_s": v, "cpu_per_wall": 1.0} for v in local]
    runs += [{"side": "ray", "lines_per_s": v} for v in ray]
    runs += [{"side": side, "error": "DataError: boom"} for side in errors]
    return runs


def _rows(runs, cores=2):
    return [cr.side_row("local", runs, 1), cr.side_row("ray", runs, cores)]


def test_per_core_ratio_of_medians_passes_at_one_and_a_half():
    rows = _rows(_runs(local=(90_000, 100_000, 110_000, 100_000, 95_000), ray=(300_000, 320_000, 280_000,
                                                                               310_000, 300_000)))
    local, ray = rows
    assert (local["per_core"], ray["per_core"]) == (100_000, 150_000)
    assert ray["lines_per_s_spread"] == {"median": 300_000, "min": 280_000, "max": 320_000, "n": 5}
    v = cr.verdict(rows, identical=True)
    assert v["ratio"] == pytest.approx(1.5) and v["verdict"] == "PASS" and v["problems"] == []
    below = cr.verdict(_rows(_runs(ray=(290_000,) * 5)), identical=True)
    assert below["verdict"] == "FAIL" and below["ratio"] == pytest.approx(1.45) and below["problems"] == []


@pytest.mark.parametrize("rows,identical,problem", [
    (lambda: [cr.side_row("local", _runs(), 1)], True, "ray: missing"),  # the Ray side never ran
    (lambda: [r for r in _rows(_runs()) if r["side"] == "ray"], True, "local: missing"),
    (lambda: _rows(_runs(errors=("ray",))), True, "ray: 1 failed run(s)"),
    (lambda: _rows(_runs(ray=(400_000.0,) * 4)), True, "ray: 4 run(s), fewer than the 5 it needs"),
    (lambda: _rows(_runs(ray=())), True, "ray: no run"),
    (lambda: _rows(_runs()), False, "the engines' datasets differ"),
    (lambda: _rows(_runs()), None, "the engines' datasets were not compared"),
])
def test_a_missing_failed_or_short_row_or_differing_outputs_fail(rows, identical, problem):
    v = cr.verdict(rows(), identical)
    assert v["verdict"] == "FAIL" and problem in v["problems"], v


def test_result_file_is_named_by_date_and_commit(tmp_path):
    name = cr.default_out().rsplit("/", 1)[-1]
    assert re.fullmatch(r"convert_ray_\d{4}-\d{2}-\d{2}_([0-9a-f]{7}|unknown)\.json", name)
