"""The calibration's dense step steps the job's dense optimizer (``train.dense_optimizer``, weight decay)."""

from pathlib import Path

import pytest
import torch

from rayemb.config import ModelConfig, config_from_dict
from rayemb.contract.factory import model_spec
from rayemb.data.schema import DatasetSchema
from rayemb.train.calibration.calibrate import job_shape
from rayemb.train.calibration.dense import dense_model_step

REPO = Path(__file__).resolve().parents[2]


def _schema():
    return DatasetSchema.from_dict({"label": "label", "dense": ["I1", "I2"], "sparse": [
        {"name": f"C{i}", "num_embeddings": 20} for i in range(3)]})


def _optimizer(step):
    step()  # forward, backward, optimizer
    return step.func.optimizer


@pytest.mark.parametrize("name,cls", [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW),
                                      ("sgd", torch.optim.SGD), ("adagrad", torch.optim.Adagrad)])
@pytest.mark.parametrize("own_model", [False, True])
def test_the_dense_step_uses_the_jobs_dense_optimizer(monkeypatch, name, cls, own_model):
    monkeypatch.syspath_prepend(str(REPO))
    spec = model_spec(ModelConfig(embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(8, 1))) if own_model else None
    step, _ = dense_model_step(torch.device("cpu"), 16, 2, 3, 8, (16, 8), (8, 1), spec,
                               _schema() if own_model else None, dense_optimizer=name, weight_decay=0.01)
    opt = _optimizer(step)
    assert type(opt) is cls
    assert all(g["weight_decay"] == 0.01 for g in opt.param_groups)
    if name in ("adam", "adamw"):  # the state the job's optimizer keeps is the one stepped
        assert all("exp_avg_sq" in s for s in opt.state.values())


def test_the_calibration_shape_carries_the_jobs_dense_optimizer():
    base = {"name": "t", "data": {"path": "d"}, "model": {"embedding_dim": 8, "bottom_mlp": [8]}}
    default = job_shape(config_from_dict(base), _schema())
    assert "dense_optimizer" not in default and "weight_decay" not in default  # kept calibrations still match
    cfg = config_from_dict({**base, "train": {"dense_optimizer": "adamw", "weight_decay": 0.1}})
    shape = job_shape(cfg, _schema())
    assert (shape["dense_optimizer"], shape["weight_decay"]) == ("adamw", 0.1)
