"""A job with every table pinned has nothing to choose: it measures its link on its ranks for the prediction (no
calibration probes, no plan probe), or reuses a kept calibration of its shape; its placements are the pins'."""

from dataclasses import replace

import pytest

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PINS = {"C1": "table_wise", "C2": "row_wise", "C3": "table_wise", "C4": "data_parallel", "C5": "table_wise",
        "C6": "row_wise", "C7": "table_wise", "C8": "table_wise"}


def _plan(cfg):
    from rayemb.train.driver.trainer import check_inputs, compute_statistics, job_topology, plan_job

    inputs = check_inputs(cfg)
    topology = job_topology(cfg)
    stats = compute_statistics(inputs)
    return inputs, topology, stats, plan_job(inputs, topology, stats).plans[inputs.world_size].job_plan.summary


def test_a_pinned_job_measures_its_link_or_reuses_a_kept_calibration(ray_2_cpus, tiny_data, tmp_path, capsys):
    from rayemb.planner.step_time import DEFAULT_CALIBRATION
    from rayemb.train.calibration.calibrate import job_shape
    from rayemb.train.calibration.store import job_hardware, job_key_fields, store_calibration
    from rayemb.train.driver.resources import worker_resources

    pins = "{" + ", ".join(f"{t}: {{sharding: {p}}}" for t, p in PINS.items()) + "}"
    args = [f"data.path={tiny_data}", f"tracking.output_dir={tmp_path}", "data.batch_size=256",
            f"planner.tables={pins}", "planner.probe_steps=4"]
    inputs, topology, stats, summary = _plan(load_config("jobs/configs/synth_small.yaml", args))
    printed = capsys.readouterr().out
    assert {t: s["placement"] for t, s in summary["tables"].items()} == PINS
    assert summary["prediction"] == "link-measured" and summary["calibration"]["source"] == "link-measured"
    link = summary["calibration"]["all_to_all"]
    assert link["latency_s"] > 0 or link["seconds_per_byte"] > 0
    assert "measuring the link on 2 ranks" in printed and "link-measured: the link measured" in printed
    assert "plan_probe" not in summary and "probing" not in printed and "calibrating" not in printed
    assert summary["learned_ratio"]["applied"] is None

    # the pins plan the same placements whatever the prediction was priced with
    off = _plan(load_config("jobs/configs/synth_small.yaml", args + ["planner.calibrate=false"]))[3]
    assert {t: s["placement"] for t, s in off["tables"].items()} == PINS and off["prediction"] == "uncalibrated"

    # a calibration of this shape and hardware kept by an earlier job: reused whole, the prediction calibrated
    cfg = inputs.cfg
    resources = worker_resources(cfg, inputs.schema, stats, inputs.train_rows, inputs.valid_rows)
    fields = job_key_fields(inputs, topology, resources, job_shape(cfg, inputs.schema, inputs.model))
    store_calibration(inputs.out_dir, {**fields, "hardware": job_hardware(inputs, resources)},
                      replace(DEFAULT_CALIBRATION, source="measured", world_size=2, num_nodes=1))
    capsys.readouterr()
    kept = _plan(cfg)[3]
    printed = capsys.readouterr().out
    assert kept["prediction"] == "calibrated" and kept["calibration"]["source"] == "cached"
    assert {t: s["placement"] for t, s in kept["tables"].items()} == PINS
    assert "plan_probe" not in kept and "probing" not in printed and "measuring the link" not in printed
