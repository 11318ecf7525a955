"""A dataset of one's own parquet files trains with the schema `rayemb schema infer` wrote, unedited.

The files: the real 200-row Criteo sample converted with a vocabulary, and a MovieLens conversion (a multi-hot
history; the label named by a flag), columns renamed, no schema.yaml. One small epoch of each on the shared
local Ray must finish and log a finite validation AUC.
"""

from __future__ import annotations

import math
import os

import pytest

from rayemb.cli import main
from rayemb.config import load_config
from rayemb.data.schema import DatasetSchema
from tests._own_parquet import CRITEO_RENAMES, MOVIELENS_RENAMES, converted_criteo, converted_movielens, renamed_copy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_inferred_criteo_schema_trains_as_written(shared_ray, tmp_path):
    data = renamed_copy(converted_criteo(main, tmp_path, "--vocab-from-train"), str(tmp_path / "mine"),
                        CRITEO_RENAMES)
    assert not os.path.exists(os.path.join(data, "schema.yaml"))
    assert main(["schema", "infer", data]) == 0
    schema = DatasetSchema.load(data)
    assert len(schema.sparse) == 26 and all(f.ids == "encoded" for f in schema.sparse)
    _train_one_epoch(shared_ray, data, tmp_path)


def test_inferred_movielens_schema_trains_as_written(shared_ray, tmp_path):
    data = renamed_copy(converted_movielens(main, tmp_path, users=60), str(tmp_path / "mine"), MOVIELENS_RENAMES)
    assert main(["schema", "infer", data, "--label", "liked"]) == 0
    schema = DatasetSchema.load(data)
    assert schema.label == "liked" and schema.feature("recent_movies").multi_hot
    _train_one_epoch(shared_ray, data, tmp_path)


def _train_one_epoch(shared_ray, data, tmp_path):
    from rayemb.train.driver.trainer import run_training

    shared_ray.ensure()
    # a few hundred train rows: one global batch of 2 x 64 rows per step
    cfg = load_config("jobs/configs/synth_small.yaml", [
        f"data.path={data}", f"tracking.output_dir={tmp_path / 'runs'}", "data.batch_size=64", "train.epochs=1",
        "planner.calibrate=false", "model.embedding_dim=8", "model.bottom_mlp=[16,8]", "model.top_mlp=[16,1]",
        "tracking.experiment=schema-infer", "train.log_every_n_steps=1"])
    result = run_training(cfg)
    assert result.status == "FINISHED"
    auc = result.metrics["valid_auc"]
    assert math.isfinite(auc) and 0.0 <= auc <= 1.0, result.metrics
