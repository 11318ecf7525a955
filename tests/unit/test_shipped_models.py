"""The shipped models, built from their factories as a job builds them, on plain (unsharded) tables."""

import numpy as np
import pytest
import torch

from rayemb.config import config_from_dict
from rayemb.data.schema import DatasetSchema
from rayemb.contract.factory import model_spec


def _build(model_section):
    from rayemb.train.sharding import build_model

    cfg = config_from_dict({"name": "t", "data": {"path": "d"}, "model": model_section})
    schema = DatasetSchema.from_dict({"label": "label", "dense": ["I1", "I2"], "sparse": [
        {"name": "C1", "num_embeddings": 20}, {"name": "C2", "num_embeddings": 10}]})
    cpu = torch.device("cpu")
    model, embeddings, paths = build_model(cfg, schema, {}, {}, cpu, cpu, model=model_spec(cfg.model))
    return model, embeddings, paths


def _batch(n=5):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = np.random.default_rng(0)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["C1", "C2"], values=torch.from_numpy(np.concatenate([gen.integers(0, 20, n), gen.integers(0, 10, n)])),
        lengths=torch.ones(2 * n, dtype=torch.int32))
    return torch.rand(n, 2), kjt


@pytest.mark.parametrize("low_rank,cls", [(None, "CrossNet"), (2, "LowRankCrossNet")])
def test_dcn_v2_holds_cross_layers_over_every_feature(low_rank, cls):
    model, embeddings, paths = _build({"name": "dcn_v2", "embedding_dim": 4,
                                       "args": {"cross_layers": 2, "low_rank": low_rank, "bottom_mlp": [6],
                                                "deep_mlp": [8]}})
    assert type(model.cross).__name__ == cls and model.cross._num_layers == 2
    assert model.cross._num_layers == len([p for n, p in model.cross.named_parameters() if "bias" in n])
    width = 6 + 4 * 2  # the dense features' vector and one vector per pooled feature
    first = next(p for n, p in model.cross.named_parameters() if not n.startswith("bias"))
    assert width in first.shape
    assert paths == {"pooled": "embedding"} and model.embedding is embeddings.pooled
    out = model(*_batch())
    assert out.shape == (5,) and bool(torch.isfinite(out).all())
    out.sum().backward()  # gradients reach the tables through the crosses
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in embeddings.pooled.parameters())


def test_dlrm_is_built_from_the_config_mlps():
    model, _, _ = _build({"name": "dlrm", "embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [6, 1]})
    assert type(model).__name__ == "DLRM"
    assert model(*_batch()).shape == (5,)
    assert [m.out_features for m in model.over_arch.modules() if isinstance(m, torch.nn.Linear)] == [6, 1]


def test_dcn_v2_refuses_no_cross_layers():
    from rayemb.errors import ConfigError

    with pytest.raises(ConfigError, match="dcn_v2 refused its arguments: dcn_v2: cross_layers=0"):
        _build({"name": "dcn_v2", "args": {"cross_layers": 0}})
