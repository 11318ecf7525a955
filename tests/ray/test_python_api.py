"""``rayemb.EmbeddingTrainer``: a job from Python with a factory function and Ray Datasets the caller built.

The datasets carry a preprocessing step of the caller's (``map_batches``: a dense feature rescaled, one id column
shifted). Trained through the API, they must give the job that the same transform, applied offline and written
as a dataset folder, gives through the config: the same plan and the same first-step loss (1e-6). The factory
is a function of this test module, which no Ray worker can import: it reaches them with the job.
"""

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SETTINGS = dict(train={"epochs": 1, "max_steps_per_epoch": 6, "log_every_n_steps": 1},
                planner={"calibrate": False}, data={"batch_size": 256})


def shift(table: pa.Table) -> pa.Table:
    """The caller's preprocessing: I1 rescaled, C2's ids moved by one (within its rows)."""
    i1 = table.schema.get_field_index("I1")
    table = table.set_column(i1, "I1", pc.multiply(table["I1"], pa.scalar(3.0, pa.float32())))
    c2 = table.schema.get_field_index("C2")
    return table.set_column(c2, "C2", pc.subtract(pc.max_element_wise(table["C2"], pa.scalar(1)), pa.scalar(1)))


def tiny_deepfm(embeddings, schema, hidden=(16,)):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from examples.deepfm import DeepFM

    return DeepFM(embeddings, len(schema.dense), hidden)


def _offline(src: str, dst: Path) -> str:
    for split in ("train", "valid"):
        (dst / split).mkdir(parents=True)
        for f in sorted(Path(src, split).glob("*.parquet")):
            pq.write_table(shift(pq.read_table(f)), dst / split / f.name)
    shutil.copy(Path(src) / "schema.yaml", dst / "schema.yaml")
    return str(dst)


@pytest.fixture(scope="module")
def jobs(shared_ray, tiny_data, tmp_path_factory):
    import ray
    import ray.train

    import rayemb

    shared_ray.ensure()
    out = tmp_path_factory.mktemp("api")
    datasets = {split: ray.data.read_parquet(f"{tiny_data}/{split}").map_batches(shift, batch_format="pyarrow")
                for split in ("train", "valid")}
    scaling = ray.train.ScalingConfig(num_workers=2)
    api = rayemb.EmbeddingTrainer(
        tiny_deepfm, model_args={"hidden": [16]}, datasets=datasets, schema=f"{tiny_data}",
        scaling_config=scaling, run_config=ray.train.RunConfig(name="api", storage_path=str(out / "api")),
        **SETTINGS).fit()
    offline = rayemb.EmbeddingTrainer(
        "examples.deepfm:deepfm", model_args={"hidden": [16]}, datasets=_offline(tiny_data, out / "offline"),
        scaling_config=scaling, run_config=ray.train.RunConfig(name="offline", storage_path=str(out / "offline_runs")),
        **SETTINGS).fit()
    return api, offline


def test_a_ray_dataset_with_the_callers_preprocessing_trains_as_the_same_data_on_disk(jobs):
    api, offline = jobs
    assert api.status == offline.status == "FINISHED"
    strip = ("calibration", "predicted_step_time_s", "predicted_step_time_components_s",
             "predicted_step_time_families_s")
    assert {k: v for k, v in api.plan.items() if k not in strip} == {k: v for k, v in offline.plan.items()
                                                                      if k not in strip}
    first = [next(r["train_loss"] for r in job.reports if r.get("step") == 1 and "train_loss" in r)
             for job in (api, offline)]
    assert abs(first[0] - first[1]) <= 1e-6, first
    assert api.metrics["valid_auc"] == pytest.approx(offline.metrics["valid_auc"], abs=1e-6)


def test_the_function_and_the_run_config_reach_the_run(jobs):
    from mlflow.tracking import MlflowClient

    api, _ = jobs
    params = MlflowClient(api.tracking_uri).get_run(api.run_id).data.params
    assert params["model.factory"].endswith(":tiny_deepfm") and params["model.args.hidden"] == "[16]"
    assert params["name"] == "api" and params["train.max_steps_per_epoch"] == "6"
    assert Path(api.last_checkpoint).is_relative_to(Path(params["tracking.output_dir"]))
    written = Path(params["data.path"])
    assert written.parent.name == "datasets" and (written / "schema.yaml").exists()
    assert sum(pq.read_metadata(f).num_rows for f in (written / "train").glob("*.parquet")) == 36_000


def test_an_uncalibrated_prediction_is_logged_under_its_own_name(jobs):
    """planner.calibrate=false: the step is predicted with the built-in constants, so the run logs it as
    ``step_time_uncalibrated_*`` and tags it, never as the step-time model's ``step_time_predicted_*``."""
    from mlflow.tracking import MlflowClient

    api, _ = jobs
    assert api.plan["prediction"] == "uncalibrated" and api.plan["calibration"]["source"] == "default"
    run = MlflowClient(api.tracking_uri).get_run(api.run_id).data
    assert run.tags["rayemb.prediction"] == "uncalibrated"
    assert "step_time_measured_s" in run.metrics and "step_time_uncalibrated_s" in run.metrics
    assert "step_time_uncalibrated_over_measured" in run.metrics
    assert not any(k.startswith("step_time_predicted") for k in run.metrics), sorted(run.metrics)
