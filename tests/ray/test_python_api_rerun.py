"""``EmbeddingTrainer.fit()`` called again continues the job's unfinished run, and returns a finished one as it is.

The first ``fit()`` fails at step 25 (a worker raises, no restarts left): the run is FAILED with checkpoints at
steps 10 and 20. Calling ``fit()`` again on the same trainer continues the run from step 20 in the same MLflow
run, attempt 2, to the end. A third ``fit()`` trains nothing; ``fit(new_run=True)`` starts another run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_fit_again_continues_a_failed_run_and_returns_a_finished_one(ray_2_cpus, tiny_data, tmp_path, monkeypatch):
    import ray.train
    from mlflow import MlflowClient

    import rayemb
    from rayemb.config import load_config
    from rayemb.constants import FAULT_INJECTION_ENV_VAR
    from rayemb.train.driver.job_record import read_record

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "fault-injected"
    monkeypatch.setenv(FAULT_INJECTION_ENV_VAR, f"25:{marker}")
    small = load_config(str(REPO / "jobs" / "configs" / "synth_small.yaml"),
                        ["model.embedding_dim=8", "model.bottom_mlp=[16,8]", "model.top_mlp=[16,1]"])
    trainer = rayemb.EmbeddingTrainer(
        "dlrm", datasets=tiny_data, config=small,
        scaling_config=ray.train.ScalingConfig(num_workers=2),
        run_config=ray.train.RunConfig(name="api-rerun", storage_path=str(tmp_path / "runs"),
                                       failure_config=ray.train.FailureConfig(max_failures=0)),
        train={"epochs": 1, "max_steps_per_epoch": 40, "checkpoint_every_n_steps": 10, "log_every_n_steps": 5,
               "early_stopping_patience": None},
        planner={"calibrate": False}, data={"batch_size": 128}, tracking={"experiment": "api-rerun"})
    with pytest.raises(rayemb.RayembError):
        trainer.fit()
    assert marker.exists()
    failed = read_record(str(tmp_path / "runs"), "api-rerun")
    assert (failed.status, failed.attempt) == ("FAILED", 1) and failed.run_id

    result = trainer.fit()  # the fault fired once: this attempt trains to the end
    assert result.status == "FINISHED" and result.run_id == failed.run_id
    end = [r for r in result.reports if r.get("epoch_end")]
    assert [(r["step"], r["resumed_at_step"]) for r in end] == [(40, 20)]
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["rayemb.attempt"] == "2"
    steps = [m.step for m in sorted(client.get_metric_history(result.run_id, "train_loss"), key=lambda m: m.timestamp)]
    assert steps == sorted(set(steps)) and steps[-1] == 40, steps

    again = trainer.fit()  # finished: nothing trained, the same run returned
    assert again.status == "FINISHED" and again.run_id == result.run_id and again.reports == []
    assert again.metrics["valid_auc"] == pytest.approx(result.metrics["valid_auc"])
    other = trainer.fit(new_run=True)
    assert other.status == "FINISHED" and other.run_id != result.run_id
    assert read_record(str(tmp_path / "runs"), "api-rerun").run_id == other.run_id
