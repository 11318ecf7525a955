"""A model written outside rayemb (examples/deepfm.py) trains as a real job, and its checkpoint resumes on more ranks.

The first job trains DeepFM through ``model.factory`` on 2 gloo ranks with a hybrid table (pinned, so the plan
under test does not depend on the cost model), calibrated and probed on its own model; the second resumes its last checkpoint on 3 ranks, which loads
the same logical rows into another sharding plan and hot set, and trains on. The factory's module is not
installed: it reaches the workers with the job.
"""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FACTORY = "examples.deepfm:deepfm"


@pytest.fixture(scope="module")
def jobs(shared_ray, tiny_data, tmp_path_factory):
    from rayemb.train.trainer import run_training

    shared_ray.ensure()
    out = tmp_path_factory.mktemp("user_model")
    common = [f"data.path={tiny_data}", f"tracking.output_dir={out}", "data.batch_size=256",
              f"model.factory={FACTORY}", "model.args={hidden: [32, 16]}",
              "planner.tables={C1: {sharding: hybrid}}", "train.log_every_n_steps=10", "tracking.experiment=user"]
    # calibrated and probed: the calibration's dense step and the plan probe build DeepFM from its factory
    first = run_training(load_config("jobs/configs/synth_small.yaml", common + ["train.epochs=1"]))
    resumed = run_training(load_config("jobs/configs/synth_small.yaml", common + ["planner.calibrate=false",
        "train.epochs=2", "train.early_stopping_patience=null", f"train.resume_from={first.last_checkpoint}",
        "scaling.num_workers=3", "scaling.cpus_per_worker=0.5"]))
    return first, resumed


def test_a_model_of_ones_own_trains_with_a_hybrid_plan(jobs):
    first, _ = jobs
    assert first.status == "FINISHED"
    assert first.plan["tables"]["C1"]["placement"] == "hybrid" and first.plan["tables"]["C1"]["hot_rows"] > 0
    assert first.metrics["valid_auc"] > 0.7, first.metrics
    assert first.plan["calibration"]["source"] == "measured" and first.plan["plan_probe"]["candidates"]
    run = MlflowClient(first.tracking_uri).get_run(first.run_id)
    assert run.data.params["model.factory"] == FACTORY and run.data.params["model.args.hidden"] == "[32, 16]"
    meta = json.loads((Path(first.last_checkpoint) / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["placements"]["C1"] == "hybrid"


def test_its_checkpoint_resumes_on_three_ranks_and_trains_on(jobs):
    first, resumed = jobs
    assert resumed.status == "FINISHED"
    end = [r for r in resumed.reports if r.get("epoch_end")]
    assert [(r["epoch"], r["world_size"]) for r in end] == [(1, 3)]  # epoch 0 came from the checkpoint
    first_end = [r for r in first.reports if r.get("epoch_end")][-1]
    assert end[0]["resumed_at_step"] == first_end["step"]
    assert end[0]["step"] > first_end["step"]
    # the resumed model starts where the first ended: its first loss is near the first job's last
    first_losses = [r["train_loss"] for r in first.reports if "train_loss" in r]
    resumed_losses = [r["train_loss"] for r in resumed.reports if "train_loss" in r]
    assert resumed_losses[0] < first_losses[0] - 0.05, (first_losses, resumed_losses)
    assert resumed.metrics["valid_auc"] > first.metrics["valid_auc"] - 0.01, (first.metrics, resumed.metrics)
    assert json.loads((Path(resumed.last_checkpoint) / "meta.json").read_text())["world_size"] == 3
