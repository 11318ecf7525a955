"""A job resumed from a checkpoint over data whose ``standardize`` column moved (rows appended since, say) trains
with the mean and std its checkpoint's model was trained with, not the new statistics pass's: the driver says so,
and the resumed job's checkpoints record the first job's figures."""

import json
import os
import shutil

import pytest
from _dense import declare_transforms

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _recorded(checkpoint: str) -> dict:
    with open(os.path.join(checkpoint, "meta.json")) as f:
        return json.load(f)["dense_transforms"]


def test_a_resumed_job_keeps_its_checkpoints_standardize_figures(ray_2_cpus, tmp_path, capfd):
    from rayemb.data.synthetic import SyntheticSpec, generate
    from rayemb.train.driver.trainer import run_training

    first_data = str(tmp_path / "first")
    generate(SyntheticSpec(rows=4_000, num_tables=4, seed=7, num_signal_tables=3), first_data)
    declare_transforms(first_data, {"I1": "standardize"}, {"I1": -5.0})
    moved = str(tmp_path / "moved")
    shutil.copytree(first_data, moved)
    declare_transforms(moved, {"I1": "standardize"}, {"I1": 3.0})  # the same tables, I1's mean 3 higher

    def job(data, *overrides):
        return run_training(load_config("jobs/configs/synth_small.yaml", [
            f"data.path={data}", f"tracking.output_dir={tmp_path / 'runs'}", "data.batch_size=256",
            "train.max_steps_per_epoch=4", "planner.calibrate=false", *overrides]))

    first = job(first_data, "name=first", "train.epochs=1")
    trained = _recorded(first.last_checkpoint)["I1"]
    capfd.readouterr()
    resumed = job(moved, "name=resumed", "train.epochs=2", f"train.resume_from={first.last_checkpoint}")
    assert resumed.status == "FINISHED" and resumed.last_checkpoint != first.last_checkpoint
    assert _recorded(resumed.last_checkpoint)["I1"] == trained
    out = capfd.readouterr().out
    assert "resuming with the checkpoint's dense transforms" in out and "I1 standardize (mean" in out
