"""The pure parts of jobs/bench/gpu_job.py (no GPU, no Ray)."""

from __future__ import annotations

import pytest

from tests._bench import load_bench

gj = load_bench("gpu_job")


def _run(batch, sps, step, predicted, wall, **kw):
    return {"global_batch": batch, "samples_per_s": sps, "step_time_s": step, "predicted_step_time_s": predicted,
            "wall_s": wall, **kw}


def test_rows_are_medians_per_batch_with_the_models_ratio_to_each_runs_own_step():
    runs = [
        _run(512, 100_000.0, 0.005, 0.006, 110.0, time_s={"forward": 0.002, "backward": 0.002}),
        _run(8192, 1_000_000.0, 0.008, 0.004, 100.0),
        _run(512, 110_000.0, 0.004, 0.006, 120.0, time_s={"forward": 0.001, "backward": 0.003}),
        _run(512, 90_000.0, 0.006, 0.003, 130.0, probed_step_time_s=0.006, time_s={"forward": 0.003}),
    ]
    rows = gj.summarise(runs)
    assert [r["global_batch"] for r in rows] == [512, 8192]
    r512 = rows[0]
    assert (r512["runs"], r512["failed"]) == (3, 0)
    assert (r512["samples_per_s"], r512["samples_per_s_min"], r512["samples_per_s_max"]) == (100_000, 90_000, 110_000)
    # each run over its own step: 1.2, 1.5 and 0.5
    assert r512["predicted_over_measured"] == pytest.approx(1.2)
    assert r512["probed_over_measured"] == pytest.approx(1.0)  # only the run that probed
    assert r512["phases_ms"] == "2.00/2.50/-/-"  # per phase, the median over the runs that timed it
    assert r512["wall_s"] == 120.0
    assert rows[1]["predicted_over_measured"] == pytest.approx(0.5)


def test_a_failed_job_is_counted_and_makes_its_row_fail():
    rows = gj.summarise([_run(512, None, None, None, 50.0), _run(8192, 1e6, 0.008, 0.004, 100.0)])
    assert rows[0]["runs"] == 0 and rows[0]["failed"] == 1 and rows[0]["samples_per_s_text"] == "FAILED"
    assert rows[0]["predicted_over_measured"] is None


def test_training_seconds_count_the_warm_up_window_too():
    assert gj.training_seconds({"windows": [1.0, 2.0, 3.0], "step_time_s": 0.005}, window=20) == pytest.approx(0.4)
    assert gj.training_seconds({"windows": [], "step_time_s": 0.005}, window=20) is None
