"""rayemb.train.calibration.plan_probe.other_side: which plan the plan probe times beside the step-time model's."""

from types import SimpleNamespace

import numpy as np

from rayemb.config import config_from_dict
from rayemb.train.calibration.plan_probe import other_side as _other_side


def _plan(**placements):
    return SimpleNamespace(summary={"tables": {n: {"placement": p} for n, p in placements.items()}})


def _split(**hot):
    """table -> (hot rows, rows)"""
    return SimpleNamespace(tables={n: SimpleNamespace(num_hot=h, num_embeddings=v, hot_ids=np.arange(h))
                                   for n, (h, v) in hot.items()})


def _cfg(**planner):
    return config_from_dict({"name": "probe", "data": {"path": "/data"}, "planner": planner})


def test_a_hybrid_plan_is_probed_beside_the_same_job_without_hybrid():
    cfg = _cfg()
    other = _other_side(cfg, _plan(C1="hybrid", C2="data_parallel"), _split(C1=(4, 100), C2=(2, 10)))
    assert other.planner.hybrid is False and other.planner.tables == {}


def test_a_pooled_plan_is_probed_beside_hybrid_on_the_tables_that_could_have_it():
    cfg = _cfg(tables={"C4": {"sharding": "row_wise"}})
    plan = _plan(C1="table_wise", C2="data_parallel", C3="table_wise", C4="row_wise", C5="table_wise")
    # C1: a hot set and cold rows; C2: replicated whole; C3: no hot set; C4: pinned by the user; C5: all rows hot
    other = _other_side(cfg, plan, _split(C1=(4, 100), C2=(2, 10), C3=(0, 100), C4=(8, 100), C5=(100, 100)))
    assert other.planner.hybrid is True
    assert other.planner.tables == {"C4": {"sharding": "row_wise"}, "C1": {"hybrid": True}}


def test_nothing_to_probe_beside_it_with_hybrid_off_or_no_candidate_table():
    assert _other_side(_cfg(hybrid=False), _plan(C1="table_wise"), _split(C1=(4, 100))) is None
    assert _other_side(_cfg(), _plan(C1="data_parallel"), _split(C1=(4, 100))) is None
