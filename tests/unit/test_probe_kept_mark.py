"""A warm job launches its workers before its plan is made only when the plan measures nothing on the cluster:
its calibration kept, and a plan probe of its shape kept too (else the probe would wait for the CPUs or GPUs the
starting workers hold)."""

import types

from rayemb.config import load_config
from rayemb.train.calibration.store import mark_probe_kept, probe_kept
from rayemb.train.driver.trainer import PlanStart

KEY = {"shape": {"tables": [[1000, 16]], "world": 2}, "hardware": {"cpus": 2}}
DAY = 86_400.0


def test_a_kept_probe_is_seen_by_its_shape_within_the_age(tmp_path):
    out = str(tmp_path)
    assert not probe_kept(out, KEY, DAY)
    mark_probe_kept(out, KEY, now=1_000.0)
    assert probe_kept(out, KEY, DAY, now=1_000.0 + 60)
    assert not probe_kept(out, KEY, DAY, now=1_000.0 + 2 * DAY)  # too old: the next job probes first
    assert not probe_kept(out, KEY, 0.0, now=1_000.0 + 60)  # planner.recalibrate: nothing kept counts
    other = {**KEY, "shape": {"tables": [[1000, 32]], "world": 2}}
    assert not probe_kept(out, other, DAY, now=1_000.0 + 60)


def _start(tmp_path, source, overrides=()):
    cfg = load_config("jobs/configs/synth_small.yaml", ["data.path=data/synth_small", *overrides])
    schema = types.SimpleNamespace(sparse_names=[f"cat_{i}" for i in range(4)], raw_names=[])
    inputs = types.SimpleNamespace(cfg=cfg, schema=schema, world_size=2, out_dir=str(tmp_path))
    calibration = None if source is None else types.SimpleNamespace(source=source)
    return PlanStart(inputs, None, None, None, calibration, KEY, None)


def test_workers_go_first_only_when_nothing_is_left_to_measure(tmp_path):
    assert _start(tmp_path, None).measures_nothing_more  # no calibration: no probe either
    assert not _start(tmp_path, "measured").measures_nothing_more
    # a kept calibration, but no probe of this shape kept: the probe runs before the workers take the cluster
    assert not _start(tmp_path, "cached").measures_nothing_more
    assert _start(tmp_path, "cached", ["planner.probe_steps=0"]).measures_nothing_more
    mark_probe_kept(str(tmp_path), KEY)
    assert _start(tmp_path, "cached").measures_nothing_more
    assert not _start(tmp_path, "cached", ["planner.recalibrate=true"]).measures_nothing_more
