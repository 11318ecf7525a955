"""jobs/bench/plan_identity.py: two plan.json compared key by key, what depends on the moment left out."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jobs" / "bench"))

from plan_identity import differences, flatten  # noqa: E402

PLAN = {"calibration": {"source": "measured", "age_s": 0.0, "seconds": 7.7, "all_to_all": {"latency_s": 2e-4}},
        "plan_probe": {"source": "measured", "age_s": 0.0, "seconds": 5.1},
        "topology": {"ddr_bytes": 7_865_520_947, "world_size": 2},
        "ranks": [{"rank": 0, "capacity_bytes": 6_685_692_804, "memory_bytes": 1_561_824}],
        "tables": {"C1": {"placement": "table_wise", "hot_rows": 0}}, "predicted_step_time_s": 0.0124}


def test_flatten_names_nested_keys_and_list_items():
    assert flatten({"a": {"b": 1}, "c": [{"d": 2}]}) == {"a.b": 1, "c.0.d": 2}


def test_a_rerun_from_kept_measurements_differs_only_in_volatile_keys():
    cached = {**PLAN, "calibration": {**PLAN["calibration"], "source": "cached", "age_s": 29.0, "seconds": 0.0},
              "plan_probe": {"source": "cached", "age_s": 29.0, "seconds": 0.0},
              "topology": {"ddr_bytes": 7_000_000_000, "world_size": 2},
              "ranks": [{"rank": 0, "capacity_bytes": 6_000_000_000, "memory_bytes": 1_561_824}]}
    assert differences(PLAN, cached) == []


def test_a_changed_placement_prediction_or_measured_figure_is_a_difference():
    other = {**PLAN, "tables": {"C1": {"placement": "row_wise", "hot_rows": 0}}, "predicted_step_time_s": 0.013,
             "calibration": {**PLAN["calibration"], "all_to_all": {"latency_s": 3e-4}},
             "ranks": [{"rank": 0, "capacity_bytes": 6_685_692_804, "memory_bytes": 2}]}
    keys = [d["key"] for d in differences(PLAN, other)]
    assert keys == ["calibration.all_to_all.latency_s", "predicted_step_time_s", "ranks.0.memory_bytes",
                    "tables.C1.placement"]
    assert [d["key"] for d in differences(PLAN, {k: v for k, v in PLAN.items() if k != "tables"})] == [
        "tables.C1.hot_rows", "tables.C1.placement"]
