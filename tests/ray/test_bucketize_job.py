"""A training job over a bucketized dense column, its export and ``rayemb predict``.

I3 is declared ``{bucketize: [1, 3, 8]}``: the driver's statistics count its bucket ids (the plan's table ``I3``
of 4 rows), the workers train on them, the checkpoint records the boundaries, and ``rayemb predict`` (Ray Data
actors building the exported model from its model.json) scores every validation row what the exported model
scores on the batch the training converter makes of the same rows.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from _dense import declare_transforms

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BUCKETS = [1.0, 3.0, 8.0]
CONFIG = str(Path(__file__).resolve().parents[2] / "jobs" / "configs" / "synth_small.yaml")


@pytest.fixture(scope="module")
def bucket_data(tmp_path_factory):
    from rayemb.data.synthetic import SyntheticSpec, generate

    out = str(tmp_path_factory.mktemp("bucketize_job_data"))
    generate(SyntheticSpec(rows=4_000, num_tables=4, seed=7, num_signal_tables=3), out)
    return declare_transforms(out, {"I3": {"bucketize": BUCKETS}}, {})


def test_a_bucketized_column_trains_exports_and_predict_scores_the_training_inputs(ray_2_cpus, bucket_data,
                                                                                   tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from rayemb.cli import main
    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.stats_io import kept_stats_path, load_stats_json
    from rayemb.serve.model import InferenceModel, sigmoid
    from rayemb.train.driver.trainer import run_training

    monkeypatch.chdir(tmp_path)  # nothing MLflow writes may land in the repository
    cfg = load_config(CONFIG, [
        f"data.path={bucket_data}", f"tracking.output_dir={tmp_path}", "data.batch_size=256", "train.epochs=1",
        "train.max_steps_per_epoch=4", "planner.calibrate=false"])
    result = run_training(cfg)
    assert result.status == "FINISHED"

    trained = DatasetSchema.load(bucket_data)
    assert trained.bucketized == ["I3"] and "I3" not in trained.dense and len(trained.dense) == 12
    # the statistics the plan was made from counted the bucket ids, every bucket of them
    kept = load_stats_json(kept_stats_path(str(tmp_path), str(bucket_data))).tables["I3"]
    assert (kept.num_embeddings, kept.invalid, kept.min_id, kept.max_id) == (4, 0, 0, 3)
    with open(os.path.join(result.last_checkpoint, "meta.json")) as f:
        meta = json.load(f)
    assert meta["dense_transforms"]["I3"] == {"bucketize": BUCKETS} and "I3" in meta["placements"]

    out, preds = tmp_path / "model", tmp_path / "preds"
    assert main(["export", "--run-id", result.run_id, "--tracking-uri", result.tracking_uri, "--out", str(out)]) == 0
    valid_dir = os.path.join(bucket_data, "valid")
    assert main(["predict", "--model", str(out), "--data", valid_dir, "--out", str(preds)]) == 0
    got = pa.concat_tables([pq.read_table(f) for f in sorted(preds.glob("*.parquet"))])

    loaded = InferenceModel.load(str(out))
    assert loaded.schema == trained
    valid = pq.read_table(valid_dir)
    batch = BatchConverter(trained)(valid)  # the inputs a training step makes of these rows
    i3 = valid.column("I3").to_numpy(zero_copy_only=False).astype(np.float32)
    np.testing.assert_array_equal(batch.sparse["I3"].values().numpy(),
                                  np.searchsorted(np.float32(BUCKETS), i3, side="right"))
    with torch.no_grad():
        want = sigmoid(loaded.model(batch.dense, batch.sparse).numpy())
    assert got.num_rows == valid.num_rows and want.std() > 1e-4
    np.testing.assert_allclose(got.column("prediction").to_numpy(), want, rtol=0, atol=1e-6)
