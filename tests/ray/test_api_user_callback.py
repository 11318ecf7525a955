"""A ``ray.train.UserCallback`` given in ``RunConfig(callbacks=...)`` is called by the job's Ray Train run beside
rayemb's own (whose reports still reach the result), and the checkpoint score attribute picks the metric the
job's best checkpoint follows."""

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

import ray.train


class WritesReports(ray.train.UserCallback):
    """Runs in Ray Train's controller (another process): it appends each report's metrics to a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def after_report(self, run_context, metrics, checkpoint) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({k: v for k, v in metrics[0].items() if isinstance(v, (int, float))}) + "\n")


def test_a_user_callback_sees_the_jobs_reports(shared_ray, tiny_data, tmp_path):
    import rayemb

    shared_ray.ensure()
    seen = tmp_path / "reports.jsonl"
    result = rayemb.EmbeddingTrainer(
        "dlrm", datasets=tiny_data, scaling_config=ray.train.ScalingConfig(num_workers=2),
        run_config=ray.train.RunConfig(
            name="callback", storage_path=str(tmp_path / "runs"), callbacks=[WritesReports(str(seen))],
            checkpoint_config=ray.train.CheckpointConfig(checkpoint_score_attribute="valid_logloss",
                                                         checkpoint_score_order="min")),
        train={"epochs": 1, "max_steps_per_epoch": 4, "log_every_n_steps": 1}, planner={"calibrate": False},
        data={"batch_size": 256}).fit()
    assert result.status == "FINISHED"
    reports = [json.loads(line) for line in Path(seen).read_text().splitlines()]
    assert any("valid_logloss" in r for r in reports) and any(r.get("step") == 4 for r in reports)
    assert result.metrics["best_valid_logloss"] == pytest.approx(min(r["valid_logloss"] for r in reports
                                                                     if "valid_logloss" in r))
