"""A real training job on a local 2-CPU Ray: 2 gloo workers, sharded DLRM, MLflow sqlite store."""

import pytest
from mlflow.tracking import MlflowClient

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_job_learns_and_is_tracked(ray_2_cpus, tiny_data, tmp_path):
    from rayemb.train.trainer import run_training

    cfg = load_config(
        "jobs/configs/synth_small.yaml",
        [f"data.path={tiny_data}", f"tracking.output_dir={tmp_path}", "data.batch_size=256",
         "train.epochs=2", "train.log_every_n_steps=10", "tracking.experiment=e2e"],
    )
    result = run_training(cfg)
    assert result.status == "FINISHED"
    assert result.metrics["valid_auc"] > 0.7, result.metrics
    assert result.tracking_uri == f"sqlite:///{tmp_path}/mlflow.db"

    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["data.batch_size"] == "256"
    auc_hist = client.get_metric_history(result.run_id, "valid_auc")
    assert len(auc_hist) == 2 and abs(auc_hist[-1].value - result.metrics["valid_auc"]) < 1e-9
    loss_hist = client.get_metric_history(result.run_id, "train_loss")
    steps = [m.step for m in loss_hist]
    assert steps == sorted(steps) and len(steps) >= 4
    assert loss_hist[-1].value < loss_hist[0].value
    artifacts = {a.path for a in client.list_artifacts(result.run_id)}
    assert {"config.yaml", "plan.json"} <= artifacts
    plan = result.plan
    assert plan["world_size"] == 2 and len(plan["tables"]) == 8
