"""The calibration's dense step is the job's own model from its factory, not a DLRM stand-in."""

from pathlib import Path

import pytest
import torch

from rayemb.config import ModelConfig
from rayemb.data.schema import DatasetSchema
from rayemb.contract.factory import model_spec
from rayemb.train.calibration.dense import dense_model_step

REPO = Path(__file__).resolve().parents[2]


def _schema():
    return DatasetSchema.from_dict({"label": "label", "dense": ["I1", "I2", "I3"], "sparse": [
        {"name": f"C{i}", "num_embeddings": 20} for i in range(4)]})


def _dense_bytes(spec, schema, dim):
    """Bytes of the parameters of the model the factory builds, its tables left out."""
    from rayemb.train.sharding import build_model
    from rayemb.config import config_from_dict

    cfg = config_from_dict({"name": "t", "data": {"path": "d"}, "model": {"embedding_dim": dim, "bottom_mlp": [dim]}})
    model, embeddings, _ = build_model(cfg, schema, {}, {}, torch.device("cpu"), torch.device("cpu"), model=spec)
    tables = {id(p) for p in embeddings.pooled.parameters()}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in tables)


@pytest.mark.parametrize("model_cfg", [
    ModelConfig(embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(8, 1)),
    ModelConfig(embedding_dim=8, factory="examples.deepfm:deepfm", args={"hidden": [24]}),
])
def test_the_dense_step_trains_the_jobs_own_model(monkeypatch, model_cfg):
    monkeypatch.syspath_prepend(str(REPO))
    spec, schema = model_spec(model_cfg), _schema()
    step, param_bytes = dense_model_step(torch.device("cpu"), 16, 3, 4, 8, (16, 8), (8, 1), spec, schema)
    assert param_bytes == _dense_bytes(spec, schema, 8)
    step()  # forward, backward, optimizer: runs without the tables


def test_without_the_model_the_step_is_a_dlrm_of_the_given_mlps():
    _, param_bytes = dense_model_step(torch.device("cpu"), 16, 3, 4, 8, (16, 8), (8, 1))
    bottom = (3 * 16 + 16) + (16 * 8 + 8)
    top = (8 + 4 * 5 // 2) * 8 + 8 + (8 * 1 + 1)
    assert param_bytes == 4 * (bottom + top)
