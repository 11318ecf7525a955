"""A job's phases (rayemb.train.driver.phases): the driver's stages and the workers' clock split the wall time."""

from __future__ import annotations

import pytest

from rayemb.train.driver.phases import JobPhases, phases_line


def _epoch(epoch, ready, start, end, loop=1012.0):
    return {"epoch": epoch, "epoch_end": 1, "clock.loop_start_unix_s": loop, "clock.ready_unix_s": ready,
            "clock.epoch_start_unix_s": start, "clock.epoch_steps_end_unix_s": end}


def test_phases_split_the_wall_time_by_the_workers_clock():
    p = JobPhases()
    p.start = 1000.0
    p.stages = {"checks": 0.5, "ray": 2.0, "statistics": 1.0, "plan": 3.0, "tracking": 0.5}
    p.launched = 1007.0
    reports = [{"step": 5, "train_loss": 0.5},  # a step report: no clock
               _epoch(0, 1015.0, 1016.0, 1026.0),
               _epoch(1, 1015.0, 1028.0, 1038.0),
               _epoch(1, 1040.0, 1041.0, 1043.0)]  # epoch 1 again after an elastic restart: the last one counts
    out = p.summary(reports, end=1046.0)
    assert out["workers"] == 5.0 and out["model"] == 3.0 and out["data"] == 1.0
    assert out["steps"] == 12.0  # epoch 0's 10 s and the restarted epoch 1's 2 s
    assert out["validation_and_checkpoints"] == pytest.approx((1043.0 - 1016.0) - 12.0)
    assert out["end"] == 3.0 and out["wall"] == 46.0
    assert out["outside_steps_fraction"] == pytest.approx(1 - 12 / 46)
    line = phases_line(out)
    assert line.startswith("rayemb: phases: checks 0.5 s | ray 2.0 s") and "steps 12.0 s" in line
    assert line.endswith("(wall 46.0 s, 74 % outside steps)")


def test_a_job_that_reported_no_epoch_has_only_the_drivers_stages():
    p = JobPhases()
    p.mark("checks")
    p.launch()
    out = p.summary([{"step": 1}])
    assert set(out) == {"checks", "wall"} and "outside steps" not in phases_line(out)
