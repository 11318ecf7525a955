"""rayemb.train.driver.progress: the driver's progress lines, with a fake clock."""

from __future__ import annotations

import io

import pytest

from rayemb.train.driver.progress import ProgressPrinter, format_duration


@pytest.mark.parametrize(
    "seconds, text",
    [(0, "0s"), (59, "59s"), (75, "1m15s"), (3725, "1h02m"), (59.6, "1m00s"), (-3, "0s"), (3600, "1h00m")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _printer(**kw):
    clock, out = FakeClock(), io.StringIO()
    p = ProgressPrinter(epochs=2, steps_per_epoch=100, global_batch=1024, min_interval_s=5.0, out=out, clock=clock,
                        **kw)
    return p, clock, out


def _lines(out: io.StringIO):
    return out.getvalue().splitlines()


def test_step_lines_eta_from_report_rate_then_observed_rate_and_throttled():
    p, clock, out = _printer()
    # first report: no observed rate yet -> 2048 samples/s / 1024 per step = 2 steps/s; 180 steps left -> 90 s
    p.update({"step": 20, "epoch": 0, "train_loss": 0.5, "samples_per_s": 2048.0})
    assert _lines(out) == ["rayemb: epoch 1/2 step 20/100 (20%) loss 0.5000 | 2,048 samples/s | ETA 1m30s"]

    clock.t = 4.0  # within min_interval_s of the last line: nothing printed
    p.update({"step": 30, "epoch": 0, "train_loss": 0.4, "samples_per_s": 2048.0})
    assert len(_lines(out)) == 1

    # observed: (60 - 20) steps in 10 s = 4 steps/s; 140 steps left -> 35 s (the report's own 1000 samples/s
    # would give 140 / (1000/1024) = 143 s = "2m23s")
    clock.t = 10.0
    p.update({"step": 60, "epoch": 0, "train_loss": 0.25, "samples_per_s": 1000.0})
    assert _lines(out)[1] == "rayemb: epoch 1/2 step 60/100 (60%) loss 0.2500 | 1,000 samples/s | ETA 35s"

    # second epoch: the step within the epoch; (130 - 20) / 22 = 5 steps/s, 70 left -> 14 s
    clock.t = 22.0
    p.update({"step": 130, "epoch": 1, "train_loss": 0.123456, "samples_per_s": 5120.0})
    assert _lines(out)[2] == "rayemb: epoch 2/2 step 30/100 (30%) loss 0.1235 | 5,120 samples/s | ETA 14s"
    assert len(_lines(out)) == 3


def test_eta_unknown_without_any_rate_and_reports_without_loss_are_ignored():
    p, clock, out = _printer()
    p.update({"step": 5, "epoch": 0})  # no train_loss: nothing to print
    assert out.getvalue() == ""
    p.update({"step": 5, "epoch": 0, "train_loss": 1.0})
    assert _lines(out) == ["rayemb: epoch 1/2 step 5/100 (5%) loss 1.0000 | ETA ?"]


def test_resumed_job_eta_uses_steps_since_first_report():
    p, clock, out = _printer()
    clock.t = 100.0
    p.update({"step": 150, "epoch": 1, "train_loss": 0.3, "samples_per_s": 1024.0})  # 1 step/s -> 50 s
    clock.t = 110.0
    p.update({"step": 170, "epoch": 1, "train_loss": 0.3, "samples_per_s": 1024.0})  # 20 steps / 10 s -> 15 s
    assert [line.rsplit("| ", 1)[1] for line in _lines(out)] == ["ETA 50s", "ETA 15s"]


def test_epoch_end_lines_best_so_far_then_best_of_earlier_epoch_and_early_stop():
    p, clock, out = _printer()
    p.update({"step": 100, "epoch": 0, "epoch_end": 1, "valid_auc": 0.9, "valid_logloss": 0.3,
              "best_valid_auc": 0.9, "best_epoch": 0.0, "early_stopped": 0})
    p.update({"step": 200, "epoch": 1, "epoch_end": 1, "valid_auc": 0.85, "valid_logloss": 0.35,
              "best_valid_auc": 0.9, "best_epoch": 0.0, "early_stopped": 1})
    assert _lines(out) == [
        "rayemb: epoch 1/2 done: valid_auc 0.9000 valid_logloss 0.3000 (best so far)",
        "rayemb: epoch 2/2 done: valid_auc 0.8500 valid_logloss 0.3500 (best 0.9000 at epoch 1); "
        "stopping early (no valid_auc gain)",
    ]


def test_epoch_end_resets_the_throttle():
    p, clock, out = _printer()
    p.update({"step": 90, "epoch": 0, "train_loss": 0.5, "samples_per_s": 2048.0})
    clock.t = 1.0
    p.update({"step": 100, "epoch": 0, "epoch_end": 1, "valid_auc": 0.7, "valid_logloss": 0.6})
    clock.t = 2.0  # 2 s after the last step line, but the new epoch's first report prints
    p.update({"step": 110, "epoch": 1, "train_loss": 0.4, "samples_per_s": 2048.0})
    lines = _lines(out)
    assert len(lines) == 3
    assert lines[1] == "rayemb: epoch 1/2 done: valid_auc 0.7000 valid_logloss 0.6000 (best so far)"
    assert lines[2].startswith("rayemb: epoch 2/2 step 10/100 (10%) loss 0.4000 | 2,048 samples/s | ETA ")


def test_a_group_restarted_on_fewer_ranks_shows_its_own_steps_and_keeps_the_eta():
    """An elastic job that lost half its ranks runs twice the steps per epoch: its reports say where it is."""
    p, clock, out = _printer()  # 100 steps per epoch at the first world size
    p.update({"step": 40, "epoch": 0, "train_loss": 0.5, "samples_per_s": 2048.0, "epoch_step": 40,
              "epoch_steps": 100})
    clock.t = 10.0  # on half the ranks: epoch 1 is 200 steps, 80 done before (40 of 100), 40 since
    p.update({"step": 80, "epoch": 0, "train_loss": 0.4, "samples_per_s": 1024.0, "epoch_step": 120,
              "epoch_steps": 200})
    # 60 of this printer's steps are done: 20 more in 10 s = 2 steps/s, 140 left -> 70 s
    assert _lines(out)[1] == "rayemb: epoch 1/2 step 120/200 (60%) loss 0.4000 | 1,024 samples/s | ETA 1m10s"
