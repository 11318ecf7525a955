"""Predictions from what was measured: a pinned job's link-measured prediction, the plan probe's choice within
its own noise, and the measured-over-predicted step ratio a job leaves for the next one on its key."""

import json
import os
from dataclasses import replace

import pytest

from rayemb.planner.report import prediction_text
from rayemb.planner.step_time import DEFAULT_CALIBRATION, LinkCost, predict_step_time, prediction_kind
from rayemb.planner.types import ClusterTopology, Placement, TableSpec
from rayemb.train.calibration.plan_probe import ProbeResult, choose, repeat_noise
from rayemb.train.calibration.store import check_calibration, learn_ratio, ratio_file, with_learned_ratio

TABLES = [TableSpec("C1", rows=50_000, dim=16, hot_rows=500, hot_share=0.9),
          TableSpec("C2", rows=2_000, dim=16), TableSpec("C3", rows=80_000, dim=16, pooling_factor=3.0)]
PLACEMENTS = {"C1": Placement.HYBRID, "C2": Placement.DATA_PARALLEL, "C3": Placement.ROW_WISE}
FIELDS = {"shape": {"local_batch": 256}, "ranks": {"world": 2}, "hardware": {"link": "all-to-all band 0"}}


def _measured(**kw):
    return replace(DEFAULT_CALIBRATION, source="measured", all_to_all=LinkCost(3e-4, 8.4e-8),
                   all_reduce=LinkCost(4e-4, 9e-8), **kw)


def test_a_link_measured_prediction_is_its_own_kind_and_says_so():
    link = replace(DEFAULT_CALIBRATION, source="link-measured", all_to_all=LinkCost(3e-4, 8.4e-8))
    assert prediction_kind(link) == "link-measured"
    assert prediction_kind(DEFAULT_CALIBRATION) == "uncalibrated" and prediction_kind(_measured()) == "calibrated"
    assert prediction_text({"predicted_step_time_s": 0.1585, "prediction": "link-measured"},
                           "every table is pinned") == ("predicted 158.5 ms/step (link-measured: the link measured, "
                                                        "compute figures built in, every table is pinned)")
    # the measured link prices the bytes: a slow link's prediction is far above the built-in 1 GB/s one's
    topo = ClusterTopology(2, 1)
    slow = predict_step_time(TABLES, PLACEMENTS, topo, 1024, link).total_s
    assert slow > 1.5 * predict_step_time(TABLES, PLACEMENTS, topo, 1024, DEFAULT_CALIBRATION).total_s


def test_candidates_within_the_probe_s_noise_train_the_model_s_plan():
    # interleaved rounds: the other plan 1-3 ms faster round by round, the differences' scatter 1 ms
    model_plan, other = [0.020, 0.030, 0.025, 0.022, 0.028], [0.018, 0.027, 0.024, 0.021, 0.025]
    noise = repeat_noise(other, model_plan, paired=True)
    assert noise == pytest.approx(0.001)
    assert repeat_noise(model_plan, model_plan, paired=True) == 0.0
    # apart, each plan's own scatter (the host's drift between rounds) counts: far wider
    assert repeat_noise(other, model_plan, paired=False) > 0.002
    assert choose([0.0250, 0.0245], [0.0, 0.001]) == (0, True)  # 0.5 ms apart, 1 ms noise: the model's choice
    assert choose([0.0250, 0.0200], [0.0, 0.001]) == (1, False)  # 5 ms apart: the faster trains
    assert choose([0.0200, 0.0205], [0.0, 0.001]) == (0, True)
    assert choose([0.0250, 0.0245], None) == (1, False)  # a probe kept before noise was measured: the fastest
    result = ProbeResult([0.0250, 0.0245], 0, 3.0, noise_s=[0.0, 0.001], within_noise=True)

    class Plan:
        summary = {"tables": {"C1": {"placement": "table_wise"}}, "predicted_step_time_s": 0.02}

    record = result.to_dict([Plan(), Plan()])
    assert record["within_noise"] is True and record["chosen"] == 0
    assert [c["noise_s"] for c in record["candidates"]] == [0.0, 0.001]
    back = ProbeResult.from_kept(result.kept(), 2, age_s=5.0)
    assert back.chosen == 0 and back.within_noise and back.noise_s == [0.0, 0.001]
    with pytest.raises(ValueError, match="chosen is 1"):  # within noise a kept probe chose the model's plan
        ProbeResult.from_kept(dict(result.kept(), chosen=1), 2, age_s=5.0)
    old = {"step_s": [0.0250, 0.0245], "chosen": 1, "seconds": 3.0, "interleaved": True}
    assert ProbeResult.from_kept(old, 2, age_s=5.0).chosen == 1  # kept before noise_s: still read


def test_a_learned_ratio_scales_every_component_of_the_prediction_exactly():
    topo = ClusterTopology(2, 1)
    base = predict_step_time(TABLES, PLACEMENTS, topo, 1024, _measured())
    scaled = predict_step_time(TABLES, PLACEMENTS, topo, 1024, _measured(step_ratio=1.7))
    assert scaled.total_s == pytest.approx(1.7 * base.total_s, rel=1e-12)
    assert scaled.components == pytest.approx({k: 1.7 * v for k, v in base.components.items()}, rel=1e-12)
    assert scaled.per_table_s == pytest.approx({k: 1.7 * v for k, v in base.per_table_s.items()}, rel=1e-12)
    # a calibration dict that carries it is a valid kept calibration
    assert check_calibration(_measured(step_ratio=1.7).to_dict()).step_ratio == 1.7


def test_a_job_s_measured_over_predicted_step_is_what_the_next_job_predicts_with(tmp_path):
    out = str(tmp_path)
    cal, learned = with_learned_ratio(out, FIELDS, _measured())
    assert learned == {"fit": None, "applied": None, "families": None, "jobs": 0, "pairs": 0,
                       "file": ratio_file(FIELDS, "calibrated")}
    assert cal.step_ratio == 1.0
    topo = ClusterTopology(2, 1)
    first = predict_step_time(TABLES, PLACEMENTS, topo, 1024, cal).total_s
    summary = {"predicted_step_time_s": first, "learned_ratio": learned}
    assert learn_ratio(out, summary, 1.25 * first) == pytest.approx(1.25)
    # beside the kept calibrations of the shape, not taken for one (no .json)
    path = os.path.join(out, *learned["file"].split("/"))
    assert path.endswith(".ratio") and json.load(open(path))["ratios"] == [pytest.approx(1.25)]
    cal2, learned2 = with_learned_ratio(out, FIELDS, _measured())
    assert learned2["applied"] == pytest.approx(1.25) and learned2["jobs"] == 1
    second = predict_step_time(TABLES, PLACEMENTS, topo, 1024, cal2).total_s
    assert second == pytest.approx(1.25 * first, rel=1e-12)
    # the next job learns against the model's own figure (the applied ratio taken off), not the scaled one
    assert learn_ratio(out, {"predicted_step_time_s": second, "learned_ratio": learned2}, 1.25 * first) == \
        pytest.approx(1.25)
    # planner.recalibrate: predicted without the ratios, the job's own still learned (kept, counted from 0)
    fresh, learned3 = with_learned_ratio(out, FIELDS, _measured(), apply=False)
    assert fresh.step_ratio == 1.0 and learned3 == {"fit": None, "applied": None, "families": None, "jobs": 0,
                                                    "pairs": 0, "file": learned["file"]}
    # another key (another prediction kind: link-measured) learns apart
    link = replace(_measured(), source="link-measured")
    assert with_learned_ratio(out, FIELDS, link)[1]["applied"] is None
    # nothing to learn from: no key, an absurd ratio (a stalled window), no measurement
    assert with_learned_ratio(out, None, _measured()) == (_measured(), {})
    assert learn_ratio(out, {"predicted_step_time_s": first, "learned_ratio": learned}, 1000 * first) is None
    assert learn_ratio(out, {"predicted_step_time_s": first}, first) is None


def test_a_damaged_ratio_file_is_ignored_loudly(tmp_path, capsys):
    out = str(tmp_path)
    rel = ratio_file(FIELDS, "calibrated")
    path = os.path.join(out, *rel.split("/"))
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        json.dump({"ratios": [1.2, float("nan")]}, f)
    cal, learned = with_learned_ratio(out, FIELDS, _measured())
    assert learned["applied"] is None and cal.step_ratio == 1.0
    assert "ignoring the learned step ratios" in capsys.readouterr().out
