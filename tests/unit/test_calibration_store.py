"""Calibrations kept for later jobs (rayemb.train.calibration.store): what the key holds, and when a kept
calibration is used, on a local folder as on any storage the job writes to."""

from __future__ import annotations

import json
import os

import pytest

from rayemb.planner.step_time import DEFAULT_CALIBRATION
from rayemb.train.calibration.store import cache_key, key_fields, load_calibration, store_calibration

SHAPE = dict(local_batch=512, num_dense=13, dim=16, num_sparse=26, bottom_mlp=[64, 16], top_mlp=[64, 1],
             prefetch_input_dist=True, model=None, schema=None)
RANKS = {"world": 2, "cpus_per_worker": 0.5, "gpu": False, "nodes": 1, "strategy": "PACK"}
NODES = [(2.0, 0.0, "")]


def test_the_key_changes_with_the_shape_the_ranks_the_cluster_and_holds_the_versions():
    base = key_fields(SHAPE, RANKS, NODES)
    assert {"torch", "torchrec", "ray", "rayemb"} <= set(base["versions"])
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
    from rayemb.train.calibration.store import step_numerics

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
    assert path == os.path.join(out, "calibrations", cache_key(fields), f"{cache_key(fields)}.json")
    cal, age, where = load_calibration(out, fields, max_age_s=3600, now=1000.0 + 60)
    assert (cal.lookup_s, cal.source, cal.seconds, cal.age_s, age, where) == (3.25e-7, "cached", 0.0, 60.0, 60.0, path)
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


HARDWARE = {"link": "one host", "cpus": ["Intel(R) Xeon(R) Processor"]}


def test_the_key_holds_the_link_band_and_the_cpu_model_and_they_have_their_own_entries(tmp_path):
    from rayemb.train.calibration.calibrate import bandwidth_band, hardware_key

    out = str(tmp_path / "runs")
    here = key_fields(SHAPE, RANKS, NODES, HARDWARE)
    # the same shape on another link (100 Mbit/s against 10 Gbit/s) or another CPU: another key
    slow = hardware_key({"all_to_all_mb_s": 11.9, "cpus": HARDWARE["cpus"]})
    fast = hardware_key({"all_to_all_mb_s": 1190.0, "cpus": HARDWARE["cpus"]})
    amd = {**HARDWARE, "cpus": ["AMD EPYC 7763 64-Core Processor"]}
    keys = {cache_key(here), cache_key(key_fields(SHAPE, RANKS, NODES, slow)),
            cache_key(key_fields(SHAPE, RANKS, NODES, fast)), cache_key(key_fields(SHAPE, RANKS, NODES, amd))}
    assert len(keys) == 4
    # the band is coarse: a link read 40 % slower or 60 % faster than its rate keeps its key; 100 Mbit/s,
    # 1 Gbit/s, 10 Gbit/s and 25 Gbit/s Ethernet do not share one
    for rate in (11.9, 119.0, 1190.0):
        assert len({bandwidth_band(rate * f) for f in (0.6, 1.0, 1.6)}) == 1
    assert [bandwidth_band(r) for r in (11.9, 119.0, 1190.0, 2975.0)] == [0, 2, 4, 5]
    store_calibration(out, key_fields(SHAPE, RANKS, NODES, slow), DEFAULT_CALIBRATION, now=1000.0)
    assert load_calibration(out, key_fields(SHAPE, RANKS, NODES, fast), 3600, now=1001.0) is None
    assert load_calibration(out, key_fields(SHAPE, RANKS, NODES, slow), 3600, now=1001.0) is not None


def test_whether_a_shape_has_a_kept_calibration_is_known_without_its_hardware(tmp_path):
    from rayemb.train.calibration.store import any_kept

    out = str(tmp_path / "runs")
    base = key_fields(SHAPE, RANKS, NODES)
    assert not any_kept(out, base)
    store_calibration(out, key_fields(SHAPE, RANKS, NODES, HARDWARE), DEFAULT_CALIBRATION, now=1000.0)
    assert any_kept(out, base) and any_kept(out, key_fields(SHAPE, RANKS, NODES, {**HARDWARE, "link": "x"}))
    assert not any_kept(out, key_fields({**SHAPE, "dim": 32}, RANKS, NODES))


@pytest.mark.parametrize("damage,named", [
    (lambda d: d.update(dense_step_s=float("nan")), "dense_step_s"),
    (lambda d: d.update(lookup_s=-1e-7), "lookup_s"),
    (lambda d: d.update(dense_step_s=0.0), "dense_step_s"),
    (lambda d: d["all_to_all"].update(seconds_per_byte=float("inf")), "all_to_all.seconds_per_byte"),
    (lambda d: d.pop("pool_s"), "pool_s"),
    (lambda d: d.update(groups={"row_wise": [1e-3, -2e-4]}), "groups.row_wise"),
    (lambda d: d.update(probe_rows=0), "probe_rows"),
    (lambda d: d.update(lookup_s="fast"), "lookup_s"),
])
def test_a_kept_calibration_with_a_bad_figure_is_ignored_with_a_warning_naming_its_file(tmp_path, capsys, damage,
                                                                                          named):
    out = str(tmp_path / "runs")
    fields = key_fields(SHAPE, RANKS, NODES, HARDWARE)
    path = store_calibration(out, fields, DEFAULT_CALIBRATION, now=1000.0)
    assert load_calibration(out, fields, 3600, now=1001.0) is not None
    with open(path) as f:
        doc = json.load(f)
    damage(doc["measured"])
    with open(path, "w") as f:
        f.write(json.dumps(doc).replace("NaN", "NaN"))
    capsys.readouterr()
    assert load_calibration(out, fields, 3600, now=1001.0) is None
    said = capsys.readouterr().out
    assert f"ignoring the kept measurement {path}" in said and named in said and "measuring anew" in said


def test_an_unreadable_kept_file_is_ignored_with_a_warning_naming_it(tmp_path, capsys):
    out = str(tmp_path / "runs")
    fields = key_fields(SHAPE, RANKS, NODES, HARDWARE)
    path = store_calibration(out, fields, DEFAULT_CALIBRATION, now=1000.0)
    with open(path, "w") as f:
        f.write("{not json")
    assert load_calibration(out, fields, 3600, now=1001.0) is None
    assert f"ignoring the kept measurement {path}" in capsys.readouterr().out


def test_a_kept_probe_result_is_checked_against_its_candidates():
    from rayemb.train.calibration.plan_probe import ProbeResult

    good = ProbeResult([0.03, 0.02], 1, 4.0, interleaved=False).kept()
    back = ProbeResult.from_kept(good, 2, age_s=90.0)
    assert (back.step_s, back.chosen, back.interleaved, back.source, back.age_s, back.seconds) == \
        ([0.03, 0.02], 1, False, "cached", 90.0, 0.0)
    for bad, named in ((dict(good, step_s=[0.03]), "step_s"), (dict(good, step_s=[0.03, float("nan")]), "step_s"),
                       (dict(good, step_s=[0.03, -0.02]), "step_s"), (dict(good, chosen=0), "chosen"),
                       ({k: v for k, v in good.items() if k != "chosen"}, "chosen"), ([1, 2], "list"),
                       (dict(good, interleaved="yes"), "interleaved")):
        with pytest.raises(ValueError, match=named):
            ProbeResult.from_kept(bad, 2, age_s=1.0)
