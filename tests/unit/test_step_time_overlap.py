"""The step-time model's overlap term follows the calibration's measured overlap fraction, and says when it had none."""

import dataclasses
import json

import pytest

from rayemb.planner.step_time import DEFAULT_CALIBRATION, Calibration, LinkCost, _overlap, predict_step_time
from rayemb.planner.types import ClusterTopology, Placement, TableSpec

AR, A2A = LinkCost(0.0, 1e-8), LinkCost(0.0, 2e-8)
TABLES = [TableSpec("small", rows=100, dim=64), TableSpec("big", rows=200_000, dim=64)]
PLACEMENTS = {"small": Placement.DATA_PARALLEL, "big": Placement.TABLE_WISE}


def _cal(fraction):
    return dataclasses.replace(DEFAULT_CALIBRATION, all_reduce=AR, all_to_all=A2A, dense_sync_bytes=4e5,
                               overlap_fraction=fraction, source="measured")


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.6, 1.0])
def test_overlap_is_the_measured_share_of_the_shorter_family(fraction):
    # 1 MB all-reduce (10 ms) beside 0.2 MB all-to-all (4 ms): the shorter one's 4 ms, that share of it hidden
    sent = {"all_reduce": 1e6, "all_to_all": 0.2e6}
    assert _overlap(sent, _cal(fraction)) == pytest.approx(-fraction * 0.004)
    # one family alone: nothing to overlap, whatever was measured
    assert _overlap({"all_reduce": 0.0, "all_to_all": 1e6}, _cal(fraction)) == 0.0


def test_prediction_follows_the_measured_fraction_and_marks_an_assumed_one():
    topo = ClusterTopology(2, 1)
    preds = {f: predict_step_time(TABLES, PLACEMENTS, topo, 1024, _cal(f)) for f in (0.0, 0.3, 0.9)}
    overlaps = [preds[f].components["overlap"] for f in (0.0, 0.3, 0.9)]
    assert overlaps[0] == 0.0 and overlaps[0] > overlaps[1] > overlaps[2]
    assert overlaps[2] == pytest.approx(3 * overlaps[1])  # linear in the fraction
    assert preds[0.9].total_s == pytest.approx(sum(preds[0.9].components.values()))
    assert all(p.assumed == [] for p in preds.values())
    # not measured (the built-in constants, a calibration kept from before): the assumed term, and said so
    unmeasured = predict_step_time(TABLES, PLACEMENTS, topo, 1024, _cal(None))
    assert unmeasured.assumed == ["overlap"] and unmeasured.to_dict()["assumed"] == ["overlap"]
    assert unmeasured.components["overlap"] < 0.0
    # one rank: no collectives, nothing assumed
    assert predict_step_time(TABLES, PLACEMENTS, ClusterTopology(1, 1), 1024, _cal(None)).assumed == []


def test_a_kept_calibration_without_the_fraction_still_loads():
    kept = _cal(0.4).to_dict()
    assert Calibration.from_dict(json.loads(json.dumps(kept))).overlap_fraction == 0.4
    del kept["overlap_fraction"]
    assert Calibration.from_dict(kept).overlap_fraction is None
