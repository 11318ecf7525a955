"""A training job over a dense column that goes below 0 under ``standardize``, and one under ``log1p``.

The driver's statistics pass measures I1's mean and std and puts them on the schema the workers receive: the
job trains (a worker's batches of a ``standardize`` column without them would be refused), and every
checkpoint's meta.json records each dense column's transform with those numbers, what ``rayemb export``
carries into the model. I2, ``log1p`` by default with negative values, is a warning at job start naming it.
"""

import json
import os

import pytest
from _dense import declare_transforms

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def dense_data(tmp_path_factory):
    from rayemb.data.synthetic import SyntheticSpec, generate

    out = str(tmp_path_factory.mktemp("dense_job_data"))
    generate(SyntheticSpec(rows=4_000, num_tables=4, seed=7, num_signal_tables=3), out)
    return declare_transforms(out, {"I1": "standardize"}, {"I1": -5.0, "I2": -1.0})


def test_job_standardizes_with_the_statistics_and_records_them_in_its_checkpoints(ray_2_cpus, dense_data,
                                                                                 tmp_path, capfd):
    from rayemb.data.stats import compute_stats
    from rayemb.train.driver.trainer import run_training

    cfg = load_config("jobs/configs/synth_small.yaml", [
        f"data.path={dense_data}", f"tracking.output_dir={tmp_path}", "data.batch_size=256", "train.epochs=1",
        "train.max_steps_per_epoch=4", "planner.calibrate=false"])
    result = run_training(cfg)
    assert result.status == "FINISHED"
    out = capfd.readouterr().out
    assert "rayemb: warning: dense column 'I2' holds negative values" in out and "'I1' holds" not in out

    moments = compute_stats(dense_data, in_process=True).values.dense_moments["I1"]
    with open(os.path.join(result.last_checkpoint, "meta.json")) as f:
        recorded = json.load(f)["dense_transforms"]
    assert recorded["I1"] == {"standardize": {"mean": moments.mean, "std": moments.std}}
    assert recorded["I2"] == "log1p" and set(recorded) == {f"I{i}" for i in range(1, 14)}
    # the job kept the statistics of its files (moments included) for the next job on them
    from rayemb.data.stats_io import kept_stats_path, load_stats_json

    kept = load_stats_json(kept_stats_path(str(tmp_path), str(dense_data)))
    assert kept.values.dense_moments["I1"].mean == moments.mean
