"""A multi-task model exports one prediction column per task, each what the sharded training model predicts.

On 2 gloo ranks the job's own model code (``rayemb.train.worker.build.sharded_model``) shards a two-task DLRM
(synthetic data with the second label ``like``: schema.yaml ``label: [label, like]``) with the plan of
``test_export_equivalence.py`` (hybrid tables with row- and column-wise cold halves, row-, column-,
table-wise and data-parallel tables), trains a few steps on both labels, writes a logical checkpoint, and
each rank scores its half of the validation rows: ``(B, 2)`` logits. ``rayemb export --checkpoint`` must
give a model whose ``predict`` is ``(N, 2)`` with column t equal to ``sigmoid(logits[:, t])`` of the sharded
model to 1e-5 (its TorchScript form: the logits), and whose pyfunc model, loaded in a fresh process, returns
the columns ``prediction_label`` and ``prediction_like`` with the same numbers.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict

import numpy as np
import pytest

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 8
BATCH = 32
DIM = 8  # test_export_equivalence's plan is made for this dim


def _train_score_rank(rank: int, world_size: int, cfg: Any, schema: Any, checkpoint: str) -> Dict[str, Any]:
    from test_export_equivalence import _job_plan

    from tests._export import train_save_score

    _, out = train_save_score(rank, world_size, cfg, schema, _job_plan(cfg, schema, world_size), checkpoint, STEPS,
                              BATCH)
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from tests._export import small_dataset

    root = tmp_path_factory.mktemp("multitask_export")
    data = small_dataset(str(root / "data"), second_label=True)
    cfg = config_from_dict({
        "name": "multitask-export", "data": {"path": data, "batch_size": BATCH},
        "model": {"embedding_dim": DIM, "bottom_mlp": [16, DIM], "top_mlp": [16, 1]},
        "train": {"dense_lr": 0.1, "embedding_lr": 0.1},
        "tracking": {"output_dir": str(root / "runs"), "experiment": "multitask-export"},
    })
    schema = DatasetSchema.load(data)
    assert schema.labels == ["label", "like"]
    checkpoint = str(root / "checkpoint")
    ranks = run_multiprocess(_train_score_rank, 2, cfg=cfg, schema=schema, checkpoint=checkpoint)
    (root / "job.yaml").write_text(cfg.to_yaml())
    return {"root": root, "data": data, "checkpoint": checkpoint, "config": str(root / "job.yaml"), "ranks": ranks}


def test_each_task_column_of_the_export_is_what_the_sharded_model_predicts(job, tmp_path, monkeypatch):
    import pyarrow.parquet as pq
    import torch
    from mlflow import MlflowClient

    from rayemb.cli import main
    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel, sigmoid
    from tests._pyfunc import fresh_pyfunc

    monkeypatch.chdir(tmp_path)  # nothing MLflow writes may land in the repository
    files = parquet_files(job["data"], "valid")
    valid = pq.read_table(files)
    half = valid.num_rows // 2
    assert valid.num_rows == 2 * half  # both ranks scored every validation row
    sharded = np.concatenate([r["logits"] for r in sorted(job["ranks"], key=lambda r: r["lo"])])
    assert sharded.shape == (valid.num_rows, 2) and np.isfinite(sharded).all()

    out, uri = tmp_path / "model", f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["export", "--checkpoint", job["checkpoint"], "--config", job["config"], "--out", str(out),
                 "--tracking-uri", uri, "--experiment", "multitask-export"]) == 0
    info = json.loads((out / "model.json").read_text())
    assert info["schema"]["label"] == ["label", "like"] and info["retrieval"] is None

    loaded = InferenceModel.load(str(out))
    probs = loaded.predict(valid)
    assert probs.shape == (valid.num_rows, 2)
    np.testing.assert_allclose(probs, sigmoid(sharded), rtol=0, atol=1e-5)
    # trained, and two different tasks: each column varies over the rows, and the columns differ
    assert probs.std(axis=0).min() > 1e-3 and np.abs(probs[:, 0] - probs[:, 1]).max() > 1e-2

    # the TorchScript form gives both logits too
    scripted = torch.jit.load(str(out / "model.torchscript.pt"))
    b = loaded.converter(loaded.rows(valid))
    with torch.no_grad():
        np.testing.assert_allclose(scripted(b.dense, b.sparse).numpy(), sharded, rtol=0, atol=1e-5)

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("multitask-export").experiment_id])
    (got,) = fresh_pyfunc(uri, f"runs:/{run.info.run_id}/model", files, [{}], str(tmp_path))
    assert list(got) == ["prediction_label", "prediction_like"]
    for t, name in enumerate(got):
        np.testing.assert_allclose(got[name], sigmoid(sharded[:, t]), rtol=0, atol=1e-5)
    assert sorted(os.listdir(out)) == ["model.json", "model.pt", "model.torchscript.pt"]
