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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FACTORY = "examples.deepfm:deepfm"


def test_a_model_of_ones_own_trains_with_a_hybrid_plan(user_model_jobs):
    first, _ = user_model_jobs
    assert first.status == "FINISHED"
    assert first.plan["tables"]["C1"]["placement"] == "hybrid" and first.plan["tables"]["C1"]["hot_rows"] > 0
    assert first.metrics["valid_auc"] > 0.7, first.metrics
    assert first.plan["calibration"]["source"] == "measured" and first.plan["plan_probe"]["candidates"]
    run = MlflowClient(first.tracking_uri).get_run(first.run_id)
    assert run.data.params["model.factory"] == FACTORY and run.data.params["model.args.hidden"] == "[32, 16]"
    meta = json.loads((Path(first.last_checkpoint) / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["placements"]["C1"] == "hybrid"


def test_its_checkpoint_resumes_on_three_ranks_and_trains_on(user_model_jobs):
    first, resumed = user_model_jobs
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
