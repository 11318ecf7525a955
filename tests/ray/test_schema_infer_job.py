"""A dataset of one's own parquet files trains with the schema `rayemb schema infer` wrote, unedited.

The files: the real 200-row Criteo sample converted with a vocabulary, columns renamed, no schema.yaml. One
small epoch on the shared local Ray must finish and log a finite validation AUC.
"""

from __future__ import annotations

import math
import os

import pytest

from rayemb.cli import main
from rayemb.config import load_config
from rayemb.data.schema import DatasetSchema
from tests._own_parquet import CRITEO_RENAMES, converted_criteo, renamed_copy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_inferred_schema_trains_as_written(shared_ray, tmp_path):
    from rayemb.train.trainer import run_training

    data = renamed_copy(converted_criteo(main, tmp_path, "--vocab-from-train"), str(tmp_path / "mine"),
                        CRITEO_RENAMES)
    assert not os.path.exists(os.path.join(data, "schema.yaml"))
    assert main(["schema", "infer", data]) == 0
    schema = DatasetSchema.load(data)
    assert len(schema.sparse) == 26 and all(f.ids == "encoded" for f in schema.sparse)
    shared_ray.ensure()
    # ~150 train rows: one global batch of 2 x 64 rows per step
    cfg = load_config("jobs/configs/synth_small.yaml", [
        f"data.path={data}", f"tracking.output_dir={tmp_path / 'runs'}", "data.batch_size=64", "train.epochs=1",
        "planner.calibrate=false", "model.embedding_dim=8", "model.bottom_mlp=[16,8]", "model.top_mlp=[16,1]",
        "tracking.experiment=schema-infer", "train.log_every_n_steps=1"])
    result = run_training(cfg)
    assert result.status == "FINISHED"
    auc = result.metrics["valid_auc"]
    assert math.isfinite(auc) and 0.0 <= auc <= 1.0, result.metrics
