"""A worker dies mid-job; Ray Train restarts the group and it resumes from the last epoch checkpoint."""

import pytest
from mlflow.tracking import MlflowClient

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_job_resumes_from_the_epoch_checkpoint_after_a_failure(ray_2_cpus, tiny_data, tmp_path, monkeypatch):
    from rayemb.train.trainer import run_training

    marker = tmp_path / "fault-injected"
    # 36,000 train rows / (2 ranks x 256) = 70 steps per epoch: fail once in epoch 1, after epoch 0's checkpoint
    monkeypatch.setenv("RAYEMB_FAULT_INJECTION", f"100:{marker}")
    cfg = load_config("jobs/configs/synth_small.yaml", [
        f"data.path={tiny_data}", f"tracking.output_dir={tmp_path}", "data.batch_size=256", "train.epochs=2",
        "scaling.max_failures=1", "train.log_every_n_steps=10",
        "planner.calibrate=false",  # the restart is under test, not the plan (tests/ray/test_train_e2e.py has both)
    ])
    result = run_training(cfg)
    assert marker.exists(), "the fault was not injected"
    assert result.status == "FINISHED"
    epoch_ends = [r for r in result.reports if r.get("epoch_end")]
    # epoch 0 ran once (not repeated after the restart), epoch 1 completed after resuming at step 70
    assert [(r["epoch"], r["step"]) for r in epoch_ends] == [(0, 70), (1, 140)]
    steps = [r["step"] for r in result.reports if "train_loss" in r]
    # attempt 1 logged steps 10..90 and died at 100; attempt 2 resumed after step 70 and logged 80..140
    assert [steps.count(s) for s in (60, 70, 80, 90, 100, 140)] == [1, 1, 2, 2, 1, 1]
    assert result.metrics["valid_auc"] > 0.7
    client = MlflowClient(result.tracking_uri)
    assert [m.step for m in client.get_metric_history(result.run_id, "valid_auc")] == [70, 140]
    assert client.get_run(result.run_id).info.status == "FINISHED"
