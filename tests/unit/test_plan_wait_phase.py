"""Rank 0's wait for a job handed over after the workers' launch (rayemb.train.driver.handoff) is its own phase,
not the model's, and the driver's stages made beside the workers' start add up as their own figures."""

from __future__ import annotations

import pytest

from rayemb.train.driver.phases import JobPhases, phases_line


def test_the_wait_for_the_plan_is_not_the_models_time():
    p = JobPhases()
    p.start, p.launched = 1000.0, 1004.0
    p.stages = {"checks": 1.0, "ray": 1.0, "statistics": 1.0, "plan": 0.5}
    p.add("plan", 2.0)  # the rest of the plan, beside the workers' start
    p.add("tracking", 1.5)
    report = {"epoch": 0, "epoch_end": 1, "clock.loop_start_unix_s": 1010.0, "clock.plan_wait_s": 1.25,
              "clock.ready_unix_s": 1014.0, "clock.epoch_start_unix_s": 1015.0, "clock.epoch_steps_end_unix_s": 1020.0}
    out = p.summary([report], end=1022.0)
    assert out["plan"] == 2.5 and out["tracking"] == 1.5
    assert out["workers"] == 6.0 and out["plan_wait"] == 1.25 and out["model"] == pytest.approx(2.75)
    assert "| workers 6.0 s | plan wait 1.2 s | model 2.8 s |" in phases_line(out)
