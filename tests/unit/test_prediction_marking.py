"""A step time predicted with the built-in constants is marked uncalibrated everywhere it is shown or logged."""

from dataclasses import replace

from rayemb.config import load_config
from rayemb.data.schema import DatasetSchema, SparseFeature
from rayemb.planner.report import prediction_text
from rayemb.planner.step_time import DEFAULT_CALIBRATION, prediction_kind
from rayemb.train.calibration.store import skipped_because
from rayemb.train.driver.results import step_time_check, step_time_line

REPORTS = [{"epoch": 0, "step_time_s": 0.5}, {"epoch": 0, "step_time_s": 0.150}, {"epoch": 0, "step_time_s": 0.160}]


def test_only_a_measured_or_kept_calibration_makes_a_calibrated_prediction():
    assert prediction_kind(None) == "uncalibrated"
    assert prediction_kind(DEFAULT_CALIBRATION) == "uncalibrated"
    assert prediction_kind(replace(DEFAULT_CALIBRATION, source="measured")) == "calibrated"
    assert prediction_kind(replace(DEFAULT_CALIBRATION, source="cached", age_s=60.0)) == "calibrated"


def test_the_plan_line_says_an_uncalibrated_prediction_and_why():
    summary = {"predicted_step_time_s": 0.0097, "prediction": "uncalibrated"}
    assert prediction_text(summary, "every table is pinned") == \
        "predicted 9.7 ms/step (uncalibrated: built-in constants, every table is pinned)"
    assert prediction_text(dict(summary, prediction="calibrated"), "unused") == "predicted 9.7 ms/step"


def test_an_uncalibrated_prediction_is_never_logged_as_the_model_s():
    out = step_time_check(REPORTS, predicted=0.0097, uncalibrated=True)
    assert out["step_time_uncalibrated_s"] == 0.0097
    assert abs(out["step_time_uncalibrated_over_measured"] - 0.0097 / 0.155) < 1e-12
    assert not any(k.startswith("step_time_predicted") for k in out)
    assert "9.7 ms uncalibrated (0.06x)" in step_time_line(out) and "predicted" not in step_time_line(out)
    calibrated = step_time_check(REPORTS, predicted=0.150)
    assert "step_time_predicted_s" in calibrated and "step_time_uncalibrated_s" not in calibrated


def test_the_reason_a_job_runs_no_calibration():
    schema = DatasetSchema("label", ("I1",), (SparseFeature("C1", 100), SparseFeature("C2", 100)))
    base = "jobs/configs/synth_small.yaml"
    assert skipped_because(load_config(base, ["planner.calibrate=false"]), schema, 2) == "planner.calibrate is off"
    pinned = load_config(base, ["planner.tables={C1: {sharding: table_wise}, C2: {sharding: row_wise}}"])
    assert skipped_because(pinned, schema, 2) == "every table is pinned"
    assert skipped_because(load_config(base), schema, 1) == "one rank"
    assert skipped_because(load_config(base), schema, 2) is None
