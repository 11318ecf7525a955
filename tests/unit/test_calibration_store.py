"""Calibrations kept for later jobs (rayemb.train.calibration_store): what the key holds, and when a kept
calibration is used, on a local folder as on any storage the job writes to."""

from __future__ import annotations

import json
import os

import pytest

from rayemb.planner.step_time import DEFAULT_CALIBRATION
from rayemb.train.calibration_store import cache_key, key_fields, load_calibration, store_calibration

SHAPE = dict(local_batch=512, num_dense=13, dim=16, num_sparse=26, bottom_mlp=[64, 16], top_mlp=[64, 1],
             prefetch_input_dist=True, model=None, schema=None)
RANKS = {"world": 2, "cpus_per_worker": 0.5, "gpu": False, "nodes": 1, "strategy": "PACK"}
NODES = [(2.0, 0.0, "")]


def test_the_key_changes_with_the_shape_the_ranks_the_cluster_and_holds_the_versions():
    base = key_fields(SHAPE, RANKS, NODES)
    assert {"torch", "torchrec", "rayemb"} <= set(base["versions"])
    keys = {cache_key(base),
            cache_key(key_fields({**SHAPE, "dim": 32}, RANKS, NODES)),
            cache_key(key_fields({**SHAPE, "local_batch": 256}, RANKS, NODES)),
            cache_key(key_fields(SHAPE, {**RANKS, "world": 3}, NODES)),
            cache_key(key_fields(SHAPE, RANKS, NODES + [(2.0, 0.0, "")])),
            cache_key(key_fields(SHAPE, RANKS, [(16.0, 1.0, "accelerator_type:H100")]))}
    assert len(keys) == 6
    assert cache_key(key_fields(dict(SHAPE), dict(RANKS), list(NODES))) == cache_key(base)


def test_the_jobs_step_precision_and_table_dtype_are_in_the_key():
    from rayemb.config import load_config
    from rayemb.train.calibration_store import step_numerics

    keys = {cache_key(key_fields({**SHAPE, **step_numerics(load_config("jobs/configs/synth_small.yaml", o))},
                                 RANKS, NODES))
            for o in ([], ["train.precision=bf16"], ["model.embedding_dtype=fp16"])}
    assert len(keys) == 3


def test_a_kept_calibration_is_used_while_young_and_only_for_its_own_key(tmp_path):
    out = str(tmp_path / "runs")
    fields = key_fields(SHAPE, RANKS, NODES)
    measured = DEFAULT_CALIBRATION.__class__(**{**DEFAULT_CALIBRATION.__dict__, "source": "measured",
                                                "lookup_s": 3.25e-7, "seconds": 12.0})
    path = store_calibration(out, fields, measured, now=1000.0)
    assert path == os.path.join(out, "calibrations", f"{cache_key(fields)}.json")
    cal, age, where = load_calibration(out, fields, max_age_s=3600, now=1000.0 + 60)
    assert (cal.lookup_s, cal.source, cal.seconds, age, where) == (3.25e-7, "cached", 0.0, 60.0, path)
    assert load_calibration(out, fields, max_age_s=3600, now=1000.0 + 3601) is None  # too old: measured again
    assert load_calibration(out, fields, max_age_s=0, now=1000.0) is None  # 0 h: always measure
    assert load_calibration(out, key_fields({**SHAPE, "dim": 32}, RANKS, NODES), 3600, now=1001.0) is None
    with open(path) as f:
        doc = json.load(f)
    doc["key_fields"]["ranks"]["world"] = 8  # a file that does not hold what its name says is not used
    with open(path, "w") as f:
        json.dump(doc, f)
    assert load_calibration(out, fields, 3600, now=1001.0) is None
    with open(path, "w") as f:
        f.write("{not json")
    assert load_calibration(out, fields, 3600, now=1001.0) is None


@pytest.mark.parametrize("hours,ok", [(-1, False), (0, True), (24, True)])
def test_the_age_limit_is_checked(hours, ok):
    from rayemb.config import load_config
    from rayemb.errors import ConfigError

    overrides = [f"planner.calibration_max_age_h={hours}"]
    if ok:
        assert load_config("jobs/configs/synth_small.yaml", overrides).planner.calibration_max_age_h == hours
    else:
        with pytest.raises(ConfigError, match="calibration_max_age_h"):
            load_config("jobs/configs/synth_small.yaml", overrides)
