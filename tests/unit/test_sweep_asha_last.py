"""ASHA in a sweep whose jobs validate mid-epoch: its rungs fit the job's validations, and a trial at its job's last
validation has trained to its end: it is never stopped there."""

from __future__ import annotations

import pytest

from rayemb.config import load_config
from rayemb.sweep.engine import _RecordingASHA, asha_max_t, job_validations, read_stops
from rayemb.train.worker.validation import validation_count
from rayemb.sweep.trial import LAST_VALIDATION, TuneReporter

CONFIG = "jobs/configs/synth_small.yaml"


@pytest.mark.parametrize("epochs,steps,every,count", [
    (1, 351, 50, 8),    # steps 50 ... 350, then the epoch's end at 351
    (1, 350, 50, 7),    # step 350 is the epoch's end: one validation there
    (2, 351, 50, 16),   # the second epoch's global steps 352 ... 702: 400 ... 700, then its end
    (3, 8, None, 3),    # one per epoch
    (1, 8, 4, 2),
])
def test_validation_count_follows_the_workers_loop(epochs, steps, every, count):
    assert validation_count(epochs, steps, every) == count


def test_job_validations_reads_the_steps_of_the_jobs_data(tiny_data):
    # 40,000 rows, 10 % valid: 36,000 train rows, 70 global batches of 512
    cfg = load_config(CONFIG, [f"data.path={tiny_data}", "scaling.num_workers=1", "train.eval_every_n_steps=20"])
    assert job_validations(cfg) == validation_count(1, job_steps(cfg), 20)
    capped = load_config(CONFIG, [f"data.path={tiny_data}", "train.eval_every_n_steps=4",
                                  "train.max_steps_per_epoch=8"])
    assert job_validations(capped) == 2 and asha_max_t([capped]) == 1
    # unreadable data: ASHA's rungs as far as 64 (the job itself fails with rayemb's error)
    missing = load_config(CONFIG, ["data.path=/nonexistent/data", "train.eval_every_n_steps=4"])
    assert job_validations(missing) is None and asha_max_t([missing]) == 99


def job_steps(cfg):
    from rayemb.data.schema import count_rows
    from rayemb.train.worker.data_loader import split_steps

    return split_steps(count_rows(cfg.data.path, "train"), count_rows(cfg.data.path, "valid"), cfg, cfg.data.path)


class _Trial:
    """What ASHA reads of a Tune trial."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def _asha(tmp_path, validations: int):
    from ray.tune.schedulers import TrialScheduler

    asha = _RecordingASHA(str(tmp_path / "stopped.json"), None, max_t=max(1, validations - 1), grace_period=1,
                          reduction_factor=2, stop_last_trials=False)
    asha.set_search_properties("valid_auc", "max")
    return asha, TrialScheduler


def _trials(asha, *ids):
    trials = [_Trial(i) for i in ids]
    for t in trials:
        asha.on_trial_add(None, t)
    return trials


def _result(validation: int, auc: float, last: bool) -> dict:
    return {"training_iteration": validation, "validation": validation, "valid_auc": auc, "step": 50 * validation,
            "epoch": 0, LAST_VALIDATION: int(last)}


@pytest.mark.parametrize("validations", [validation_count(1, 351, 50), 100])
def test_a_trial_at_its_last_validation_is_never_stopped(tmp_path, validations):
    """351 steps validated every 50: 8 validations. A trial above the median at every rung that falls back at its
    8th, its job's last, has trained to its end: it continues (and ends FINISHED), whether ASHA's rungs stop short
    of it or (the job's steps unknown to the sweep) go past it."""
    asha, scheduler = _asha(tmp_path, validations)
    leader, late = _trials(asha, "leader", "late")
    for v in range(1, 9):
        assert asha.on_trial_result(None, leader, _result(v, 0.80, v == 8)) == scheduler.CONTINUE
        assert asha.on_trial_result(None, late, _result(v, 0.90 if v < 8 else 0.50, v == 8)) == scheduler.CONTINUE
    assert read_stops(str(tmp_path / "stopped.json")) == {}


def test_a_trial_below_the_median_before_its_last_validation_is_stopped(tmp_path):
    asha, scheduler = _asha(tmp_path, validation_count(1, 351, 50))
    leader, behind = _trials(asha, "leader", "behind")
    for v in (1, 2):
        asha.on_trial_result(None, leader, _result(v, 0.80, False))
    assert asha.on_trial_result(None, behind, _result(1, 0.85, False)) == scheduler.CONTINUE
    assert asha.on_trial_result(None, behind, _result(2, 0.50, False)) == scheduler.STOP
    reason = read_stops(str(tmp_path / "stopped.json"))["behind"]
    assert reason.startswith("asha: valid_auc=0.5000 below the median") and "validation 2 (epoch 1)" in reason


@pytest.mark.parametrize("report,last", [
    ({"valid_auc": 0.7, "epoch": 0, "epoch_end": 1, "early_stopped": 0}, False),
    ({"valid_auc": 0.7, "epoch": 1, "epoch_end": 1, "early_stopped": 0}, True),
    ({"valid_auc": 0.7, "epoch": 0, "epoch_end": 1, "early_stopped": 1}, True),
    ({"valid_auc": 0.7, "epoch": 1, "step": 40, "mid_epoch_validation": 1}, False),
])
def test_the_reporter_flags_the_jobs_last_validation(report, last):
    assert TuneReporter("valid_auc", epochs=2).is_last(report) is last
