"""``train.lr_schedule``: the factor of the base learning rates as a pure function of the global step.

Each kind is checked at chosen steps against its closed form, warmup against its linear rise, and a restart:
an :class:`~rayemb.train.worker.schedule.LrSchedule` started at a checkpoint's step sets the same rates from there
on as one that ran every step since the first.
"""

from __future__ import annotations

import math

import pytest
import torch

from rayemb.config import LR_SCHEDULE_DEFAULTS, config_from_dict
from rayemb.errors import ConfigError
from rayemb.train.worker.schedule import LrSchedule, is_constant, lr_factor


def _sched(**kw):
    return {**LR_SCHEDULE_DEFAULTS, **kw}


def test_constant_is_one_at_every_step_and_the_default():
    s = _sched()
    assert is_constant(s) and [lr_factor(t, 10, s) for t in (0, 5, 9, 50)] == [1.0] * 4
    cfg = config_from_dict({"name": "x", "data": {"path": "p"}})
    assert cfg.train.lr_schedule == LR_SCHEDULE_DEFAULTS and cfg.train.dense_optimizer == "adagrad"


def test_warmup_rises_linearly_to_one_then_the_kind_takes_over():
    s = _sched(kind="constant", warmup_steps=4)
    assert not is_constant(s)
    assert [lr_factor(t, 100, s) for t in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    c = _sched(kind="cosine", warmup_steps=4)
    assert [lr_factor(t, 14, c) for t in (0, 3, 4)] == [0.25, 1.0, 1.0] and lr_factor(9, 14, c) == pytest.approx(0.5)


@pytest.mark.parametrize("step, expected", [(0, 1.0), (5, 0.55), (10, 0.1), (20, 0.1)])
def test_linear_falls_to_min_lr_ratio_at_the_last_step(step, expected):
    assert lr_factor(step, 10, _sched(kind="linear", min_lr_ratio=0.1)) == pytest.approx(expected)


@pytest.mark.parametrize("step", [0, 3, 5, 7, 10])
def test_cosine_follows_the_half_cosine_after_warmup(step):
    s = _sched(kind="cosine", warmup_steps=2, min_lr_ratio=0.2)
    got = lr_factor(step + 2, 12, s)
    assert got == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / 10))))


def test_step_multiplies_by_gamma_every_step_size_steps():
    s = _sched(kind="step", step_size=3, gamma=0.5)
    assert [lr_factor(t, 100, s) for t in range(8)] == [1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25]


def test_a_restarted_schedule_sets_the_rates_a_continuous_one_does():
    s = _sched(kind="cosine", warmup_steps=3, min_lr_ratio=0.05)
    total, resume_at = 20, 7

    def schedule():
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.4)
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.1})
        return opt, LrSchedule(opt, s)

    opt, fresh = schedule()
    fresh.start(0, total)
    seen = []
    for _ in range(total):
        fresh.apply()
        seen.append([g["lr"] for g in opt.param_groups])
    opt2, resumed = schedule()
    opt2.load_state_dict(opt.state_dict())  # a checkpoint's state, its rates the scheduled ones
    resumed.start(resume_at, total)
    for t in range(resume_at, total):
        resumed.apply()
        assert [g["lr"] for g in opt2.param_groups] == seen[t]
        assert seen[t] == [0.4 * lr_factor(t, total, s), 0.1 * lr_factor(t, total, s)]


@pytest.mark.parametrize("train, key", [
    ({"dense_optimizer": "rmsprop"}, "train.dense_optimizer"),
    ({"lr_schedule": {"kind": "exponential"}}, "train.lr_schedule.kind"),
    ({"lr_schedule": {"warmup": 10}}, "train.lr_schedule"),
    ({"lr_schedule": {"warmup_steps": -1}}, "train.lr_schedule.warmup_steps"),
    ({"lr_schedule": {"kind": "step", "gamma": 0}}, "train.lr_schedule.gamma"),
    ({"weight_decay": -0.1}, "train.weight_decay"),
    ({"grad_clip_norm": 0}, "train.grad_clip_norm"),
])
def test_bad_values_name_the_key(train, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_from_dict({"name": "x", "data": {"path": "p"}, "train": train})
