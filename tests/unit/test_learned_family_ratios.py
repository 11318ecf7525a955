"""Learned ratios per step-time family: the plans a key's jobs and plan probes measured, each with the model's own
seconds by family, fitted to one ratio per family when their mixes tell the families apart, else one overall
ratio; and the kept file's round trip, older files (overall ratios alone) still read."""

import json
import os
from dataclasses import replace

import pytest

from rayemb.planner.step_time import DEFAULT_CALIBRATION, FAMILIES, LinkCost, predict_step_time
from rayemb.planner.types import ClusterTopology, Placement, TableSpec
from rayemb.train.calibration.store import (FAMILY_RATIO_BOUNDS, check_calibration, fit_family_ratios, learn_ratio,
                                            load_learned, ratio_file, with_learned_ratio)

TABLES = [TableSpec("C1", rows=50_000, dim=16, hot_rows=500, hot_share=0.9),
          TableSpec("C2", rows=2_000, dim=16), TableSpec("C3", rows=80_000, dim=16, pooling_factor=3.0)]
FIELDS = {"shape": {"local_batch": 256}, "ranks": {"world": 2}, "hardware": {"link": "all-to-all band 0"}}
TOPO = ClusterTopology(2, 1)
#: plans of different mixes: all-to-all heavy, all-reduce heavy, both
PLANS = [
    {"C1": Placement.TABLE_WISE, "C2": Placement.TABLE_WISE, "C3": Placement.TABLE_WISE},
    {"C1": Placement.DATA_PARALLEL, "C2": Placement.DATA_PARALLEL, "C3": Placement.DATA_PARALLEL},
    {"C1": Placement.HYBRID, "C2": Placement.DATA_PARALLEL, "C3": Placement.ROW_WISE},
    {"C1": Placement.ROW_WISE, "C2": Placement.DATA_PARALLEL, "C3": Placement.TABLE_WISE},
]
TRUE = {"compute": 0.8, "all_to_all": 2.0, "all_reduce": 1.3}


def _measured(**kw):
    return replace(DEFAULT_CALIBRATION, source="measured", all_to_all=LinkCost(3e-4, 8.4e-8),
                   all_reduce=LinkCost(4e-4, 9e-8), overlap_fraction=0.3, **kw)


def _truth(families, scales=TRUE):
    """The step a cluster whose families cost ``scales`` times the model's would measure."""
    return sum(scales[f] * families[f] for f in FAMILIES) + families["overlap"]


def _summary(learned, plans, measured_probe, job=0, probe_source="measured"):
    """plan.json as the driver leaves it: the trained plan's own families, the probe's candidates."""
    preds = [predict_step_time(TABLES, p, TOPO, 1024, _measured()) for p in plans]
    return {"predicted_step_time_s": preds[job].total_s, "predicted_step_time_families_s": preds[job].families,
            "learned_ratio": learned,
            "plan_probe": {"source": probe_source, "candidates": [
                {"probed_step_time_s": m, "predicted_step_time_s": p.total_s,
                 "predicted_step_time_families_s": p.families} for p, m in zip(preds, measured_probe)]}}


def test_the_families_sum_to_the_model_s_step_and_the_ratios_scale_each_apart():
    base = predict_step_time(TABLES, PLANS[2], TOPO, 1024, _measured())
    assert set(base.families) == set(FAMILIES) | {"overlap"} and base.families["overlap"] < 0
    assert sum(base.families.values()) == pytest.approx(base.total_s, rel=1e-12)
    scaled = predict_step_time(TABLES, PLANS[2], TOPO, 1024, _measured(family_ratios=TRUE))
    assert scaled.total_s == pytest.approx(_truth(base.families), rel=1e-12)
    assert scaled.families == base.families  # the model's own figures, what the next fit is made against
    assert sum(scaled.per_table_s.values()) < scaled.total_s
    assert check_calibration(_measured(family_ratios=TRUE).to_dict()).family_ratios == TRUE
    with pytest.raises(ValueError, match="family_ratios.compute"):
        check_calibration(_measured(family_ratios={"compute": float("nan")}).to_dict())


def test_per_family_ratios_are_recovered_and_the_next_prediction_lands_on_each_measured_plan(tmp_path):
    out = str(tmp_path)
    cal, learned = with_learned_ratio(out, FIELDS, _measured())
    assert learned["fit"] is None and learned["pairs"] == 0
    own = [predict_step_time(TABLES, p, TOPO, 1024, cal).families for p in PLANS]
    truth = [_truth(f) for f in own]
    # a probe of two plans, then a job of a third probing a fourth: the job's own step measured too
    learn_ratio(out, _summary(learned, PLANS[:2], truth[:2]), None)
    assert with_learned_ratio(out, FIELDS, _measured())[1]["fit"] is None  # two mixes, three families
    ratio = learn_ratio(out, _summary(learned, PLANS[2:], truth[2:]), truth[2])
    assert ratio == pytest.approx(truth[2] / sum(own[2].values()), rel=1e-12)
    cal2, learned2 = with_learned_ratio(out, FIELDS, _measured())
    assert learned2["fit"] == "per component" and learned2["pairs"] == 5 and learned2["applied"] is None
    assert learned2["families"] == pytest.approx(TRUE, abs=1e-6)
    assert cal2.step_ratio == 1.0 and cal2.family_ratios == learned2["families"]
    for plan, measured in zip(PLANS, truth):
        assert predict_step_time(TABLES, plan, TOPO, 1024, cal2).total_s == pytest.approx(measured, rel=1e-6)
    # the fit is the same for the same pairs
    assert fit_family_ratios(load_learned(out, learned["file"])[1]) == learned2["families"]


def test_one_mix_of_the_families_learns_one_overall_ratio(tmp_path):
    out = str(tmp_path)
    cal, learned = with_learned_ratio(out, FIELDS, _measured())
    own = predict_step_time(TABLES, PLANS[2], TOPO, 1024, cal).families
    summary = _summary(learned, PLANS[2:3], [_truth(own)])
    for measured in (1.2 * sum(own.values()), 1.4 * sum(own.values())):  # the same plan twice: one equation
        learn_ratio(out, summary, measured)
    cal2, learned2 = with_learned_ratio(out, FIELDS, _measured())
    assert learned2["fit"] == "overall" and learned2["families"] is None and learned2["jobs"] == 2
    assert learned2["applied"] == pytest.approx(1.3) and cal2.step_ratio == pytest.approx(1.3)
    assert cal2.family_ratios == {}
    # a kept (not re-measured) probe adds no pairs: its plans were kept when they were measured
    before = len(load_learned(out, learned["file"])[1])
    learn_ratio(out, _summary(learned, PLANS, [_truth(own)] * 4, probe_source="cached"), None)
    assert len(load_learned(out, learned["file"])[1]) == before


def test_a_family_ratio_is_held_within_its_bounds():
    pairs = [{"families": predict_step_time(TABLES, p, TOPO, 1024, _measured()).families} for p in PLANS]
    far = {"compute": 1.0, "all_to_all": 10.0, "all_reduce": 1.0}
    for p in pairs:
        p["measured_s"] = _truth(p["families"], far)
    fitted = fit_family_ratios(pairs)
    assert fitted["all_to_all"] == FAMILY_RATIO_BOUNDS[1]
    assert FAMILY_RATIO_BOUNDS[0] <= min(fitted.values()) and max(fitted.values()) <= FAMILY_RATIO_BOUNDS[1]
    # one rank: no collective family priced at all; the compute ratio alone is learned, the others stay 1.0
    one = [{"families": {"compute": c, "all_to_all": 0.0, "all_reduce": 0.0, "overlap": 0.0},
            "measured_s": 0.7 * c} for c in (0.01, 0.02)]
    assert fit_family_ratios(one) == pytest.approx({"compute": 0.7, "all_to_all": 1.0, "all_reduce": 1.0})


def test_a_ratio_file_kept_before_pairs_is_still_read_and_extended(tmp_path):
    out = str(tmp_path)
    rel = ratio_file(FIELDS, "calibrated")
    path = os.path.join(out, *rel.split("/"))
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        json.dump({"ratios": [1.1, 1.3, 1.2], "measured_at": 0.0}, f)
    cal, learned = with_learned_ratio(out, FIELDS, _measured())
    assert learned["fit"] == "overall" and learned["applied"] == pytest.approx(1.2) and learned["pairs"] == 0
    own = predict_step_time(TABLES, PLANS[0], TOPO, 1024, _measured()).families
    summary = {"predicted_step_time_s": 1.2 * sum(own.values()), "predicted_step_time_families_s": own,
               "learned_ratio": learned}
    assert learn_ratio(out, summary, 1.5 * sum(own.values())) == pytest.approx(1.5)
    ratios, pairs = load_learned(out, rel)
    assert ratios == pytest.approx([1.1, 1.3, 1.2, 1.5])
    assert pairs == [{"families": pytest.approx(own), "measured_s": pytest.approx(1.5 * sum(own.values())),
                      "source": "job"}]
    # a damaged pair: the file teaches nothing, said loudly
    with open(path, "w") as f:
        json.dump({"ratios": [1.2], "pairs": [{"families": {"compute": 1.0}, "measured_s": 1.0}]}, f)
    assert load_learned(out, rel) == ([], [])
