"""MovieLens ratings kept as a regression label train as is: `rayemb convert movielens --label rating`, then
`rayemb train` with no extra flag, on a real local 2-CPU Ray.

The ratings are generated (biases and a low-rank affinity, half stars, long-tailed item popularity;
rayemb.data.synthetic_ratings). The job must score the validation split by RMSE, and beat the mean
predictor (the train labels' mean) computed here with numpy from the same parquet. A binarised label
(values 0/1, mean predictor around 0.5 away) or a binary task (no valid_rmse) fails it.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from rayemb.cli import main
from rayemb.data.synthetic_ratings import write_ratings_csv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _labels(data, split):
    return pq.read_table(sorted(glob.glob(os.path.join(data, split, "*.parquet"))), columns=["rating"]) \
        .column("rating").to_numpy().astype(np.float64)


def test_rating_label_trains_a_regression_model_that_beats_the_mean(ray_2_cpus, tmp_path):
    raw = str(tmp_path / "ratings.csv")
    write_ratings_csv(raw, users=300, items=200, seed=0)
    data = str(tmp_path / "data")
    assert main(["convert", "movielens", "--input", raw, "--out", data, "--label", "rating",
                 "--history-length", "5"]) == 0
    with open(os.path.join(data, "schema.yaml")) as f:
        schema = yaml.safe_load(f)
    assert schema["label"] == "rating" and schema["task_types"] == {"rating": "regression"}
    train, valid = _labels(data, "train"), _labels(data, "valid")
    assert set(np.unique(train)) <= set(np.arange(1, 11) / 2.0) and len(np.unique(train)) > 2  # half stars kept

    result_json = tmp_path / "result.json"
    rc = main(["train", "--config", os.path.join(REPO, "jobs", "configs", "synth_small.yaml"),
               "--set", f"data.path={data}", "--set", f"tracking.output_dir={tmp_path / 'runs'}",
               "--set", "data.batch_size=64", "--set", "train.epochs=2", "--set", "planner.calibrate=false",
               "--set", "model.embedding_dim=8", "--set", "model.bottom_mlp=[16,8]", "--set", "model.top_mlp=[16,1]",
               "--set", "tracking.experiment=movielens-rating", "--result-json", str(result_json)])
    assert rc == 0
    result = json.loads(result_json.read_text())
    assert result["status"] == "FINISHED"
    rmse = result["metrics"]["valid_rmse"]
    mean_rmse = float(np.sqrt(np.mean((valid - train.mean()) ** 2)))
    assert "valid_auc" not in result["metrics"]
    assert rmse < 0.97 * mean_rmse, (rmse, mean_rmse)
