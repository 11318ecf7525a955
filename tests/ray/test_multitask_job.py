"""A real multi-task job: two label columns, one DLRM with a logit per label, metrics per task in MLflow."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def job(shared_ray, tmp_path_factory):
    from rayemb.data.synthetic import SyntheticSpec, generate
    from rayemb.train.driver.trainer import run_training

    shared_ray.ensure()
    data = tmp_path_factory.mktemp("two_labels")
    generate(SyntheticSpec(rows=40_000, num_tables=10, seed=7, num_signal_tables=4, second_label=True), str(data))
    out = tmp_path_factory.mktemp("multitask")
    cfg = load_config("jobs/configs/synth_small.yaml", [
        f"data.path={data}", f"tracking.output_dir={out}", "data.batch_size=256", "train.epochs=1",
        "planner.calibrate=false", "train.task_weights={like: 2.0}", "train.early_stopping_task=like",
        "train.log_every_n_steps=10", "train.eval_every_n_steps=30", "tracking.experiment=multitask"])
    return run_training(cfg)


def test_each_task_is_learned_and_reported(job):
    assert job.status == "FINISHED"
    m = job.metrics
    assert m["valid_auc.label"] > 0.7 and m["valid_auc.like"] > 0.7, m
    assert m["valid_auc"] == m["valid_auc.like"] and m["best_valid_auc"] == m["valid_auc.like"]  # the chosen task
    history = sorted(MlflowClient(job.tracking_uri).get_metric_history(job.run_id, "valid_auc.like"),
                     key=lambda e: e.step)
    assert history[-1].value == pytest.approx(m["valid_auc.like"])
    # validated within the epoch too, every train.eval_every_n_steps steps, reported at that step
    mid = [e.step for e in history[:-1]]
    assert mid and all(s % 30 == 0 and s < history[-1].step for s in mid), [e.step for e in history]
    mid_ne = MlflowClient(job.tracking_uri).get_metric_history(job.run_id, "valid_ne.like")
    assert len(mid_ne) == len(history) and all(0 < e.value < 1 for e in mid_ne)
    assert json.loads((Path(job.best_checkpoint) / "meta.json").read_text())["best_valid_auc"] == \
        pytest.approx(m["valid_auc.like"])
