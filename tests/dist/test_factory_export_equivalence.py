"""Models of other factories export what their sharded training model predicts.

On 2 gloo ranks the job's own model code (``rayemb.train.worker.build.sharded_model``) shards DeepFM
(``examples/deepfm.py`` through ``model.factory``) and DCN-v2 (``model.name: dcn_v2``) with the plan of
``test_export_equivalence.py`` (hybrid tables with row- and column-wise cold halves, row-, column-,
table-wise and data-parallel tables), trains a few steps and writes each a logical checkpoint; each rank
scores its half of the validation rows. ``rayemb export --checkpoint`` must give a model, rebuilt by the
factory around plain tables, whose logits equal the sharded model's on every validation row to 1e-5.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict

import numpy as np
import pytest

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 8
BATCH = 32
DIM = 8  # test_export_equivalence's plan is made for this dim
MODELS = {
    "deepfm": {"factory": "examples.deepfm:deepfm", "args": {"hidden": [16, 8]}},
    "dcn_v2": {"name": "dcn_v2", "args": {"cross_layers": 2, "bottom_mlp": [16, 8], "deep_mlp": [16, 8]}},
}


def _train_score_rank(rank: int, world_size: int, cfgs: Dict[str, Any], schema: Any, root: str) -> Dict[str, Any]:
    from test_export_equivalence import _job_plan

    from tests._export import train_save_score

    out = {}
    for name, cfg in cfgs.items():
        job_plan = _job_plan(cfg, schema, world_size)  # planned on the job's own model (its factory's)
        _, out[name] = train_save_score(rank, world_size, cfg, schema, job_plan, os.path.join(root, name), STEPS,
                                        BATCH)
    return out


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from tests._export import small_dataset

    root = tmp_path_factory.mktemp("user_export_eq")
    data = small_dataset(str(root / "data"))
    cfgs = {name: config_from_dict({
        "name": f"user-export-{name}", "data": {"path": data, "batch_size": BATCH},
        "model": {"embedding_dim": DIM, **spec}, "train": {"dense_lr": 0.1, "embedding_lr": 0.1},
        "tracking": {"output_dir": str(root / "runs"), "experiment": "user-export-eq"},
    }) for name, spec in MODELS.items()}
    for name, cfg in cfgs.items():
        (root / f"{name}.yaml").write_text(cfg.to_yaml())
    ranks = run_multiprocess(_train_score_rank, 2, cfgs=cfgs, schema=DatasetSchema.load(data),
                             root=str(root / "checkpoints"))
    return {"root": root, "data": data, "ranks": ranks}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_export_of_a_factory_model_predicts_what_the_sharded_model_predicts(model, jobs, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from rayemb.cli import main
    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel

    monkeypatch.chdir(tmp_path)  # nothing MLflow writes may land in the repository
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading an export puts its code/ on the path
    root = jobs["root"]
    valid = pq.read_table(parquet_files(jobs["data"], "valid"))
    half = valid.num_rows // 2
    sharded = np.concatenate([r[model]["logits"] for r in sorted(jobs["ranks"], key=lambda r: r[model]["lo"])])
    assert sharded.shape == (2 * half,) and np.isfinite(sharded).all()

    out = tmp_path / "model"
    assert main(["export", "--checkpoint", str(root / "checkpoints" / model), "--config", str(root / f"{model}.yaml"),
                 "--out", str(out), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]) == 0
    info = json.loads((out / "model.json").read_text())
    assert info["torchscript"] is None and (info["code"] is not None) == (model == "deepfm")
    loaded = InferenceModel.load(str(out))
    logits = loaded.logits(valid.slice(0, 2 * half))
    np.testing.assert_allclose(logits, sharded, rtol=0, atol=1e-5)
    assert logits.std() > 1e-3  # trained: the rows get different scores
