"""A job of the same shape on the same cluster reuses the calibration a job before it measured and kept in
its output storage; `planner.recalibrate=true` measures anew (real calibration on the shared 2-CPU Ray)."""

from __future__ import annotations

import glob
import json
import os
from types import SimpleNamespace

import pytest

from rayemb.config import load_config
from rayemb.train.calibration.store import calibrate
from rayemb.train.driver.trainer import check_inputs, job_topology

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_next_job_of_the_same_shape_reuses_the_kept_calibration(ray_2_cpus, tiny_data, tmp_path, capsys):
    def stage(*extra):
        cfg = load_config(os.path.join(REPO, "jobs", "configs", "synth_small.yaml"), [
            f"data.path={tiny_data}", f"tracking.output_dir={tmp_path / 'runs'}", "data.batch_size=64",
            "model.embedding_dim=8", "model.bottom_mlp=[16,8]", "model.top_mlp=[16,1]", *extra])
        cal, fields = calibrate(check_inputs(cfg), job_topology(cfg), SimpleNamespace(cpus_per_worker=0.5))
        assert fields["ranks"]["world"] == 2 and fields["shape"]["local_batch"] == 64  # the key the probe reuses
        return cal

    first = stage()
    assert first.source == "measured" and first.seconds > 0
    kept = glob.glob(str(tmp_path / "runs" / "calibrations" / "*" / "*.json"))
    assert len(kept) == 1
    measured_at = json.loads(open(kept[0]).read())["measured_at"]
    second = stage("train.dense_lr=0.01")  # another learning rate: the same measurement
    assert second.source == "cached" and second.seconds == 0 and 0 < second.age_s < 3600
    assert {k: v for k, v in second.to_dict().items() if k not in ("source", "seconds", "age_s")} == \
        {k: v for k, v in first.to_dict().items() if k not in ("source", "seconds", "age_s")}
    assert "measured 0.0 h ago (planner.recalibrate=true measures anew)" in capsys.readouterr().out
    third = stage("planner.recalibrate=true")
    assert third.source == "measured"
    assert json.loads(open(kept[0]).read())["measured_at"] > measured_at  # replaced by the new measurement
