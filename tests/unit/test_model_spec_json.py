"""An export's model.json resolves to the model its job trained: the ModelSpec of the config it was written from.

model.json's ``model`` section is written from the job's config (``rayemb.serve.model.model_config``);
``model_spec_from_json`` of it must name the same factory, arguments and name as ``model_spec`` of the
config, for the shipped models and a user's factory (``examples/deepfm.py``) alike, and an export made
before models had names (no ``name``, no ``factory``) is the DLRM.
"""

from __future__ import annotations

import pytest

from rayemb.config import ModelConfig
from rayemb.errors import ConfigError
from rayemb.contract.factory import model_spec, model_spec_from_json
from rayemb.serve.model import model_config
from rayemb.serve.user_model import job_model_config


class _Job:
    def __init__(self, model: ModelConfig) -> None:
        self.model = model


@pytest.mark.parametrize("model", [
    ModelConfig(),
    ModelConfig(embedding_dim=8, bottom_mlp=(32, 8), top_mlp=(16, 1), sequence_tower="mean", args={"extra": 1}),
    ModelConfig(name="two_tower", embedding_dim=8, args={"tower": [16]}),
    ModelConfig(name="dcn_v2", embedding_dim=8),
    ModelConfig(embedding_dim=8, factory="examples.deepfm:deepfm", args={"hidden": [24]}),
], ids=["dlrm", "dlrm-sequence", "two_tower", "dcn_v2", "factory"])
def test_model_json_resolves_to_the_configs_model(model):
    written = model_config(_Job(model))
    assert model_spec_from_json(written) == model_spec(model)
    assert job_model_config(written) == model


def test_an_export_naming_no_model_is_the_dlrm():
    old = {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]}
    spec = model_spec_from_json(old)
    assert (spec.factory, spec.name) == ("rayemb.models.dlrm:dlrm", "dlrm")
    assert dict(spec.args) == {"bottom_mlp": [16, 8], "top_mlp": [16, 1]}


def test_an_unknown_model_name_is_one_error_naming_the_shipped_ones():
    with pytest.raises(ConfigError, match="model.name.*'dlrm'") as e:
        model_spec_from_json({"name": "wide_and_deep", "embedding_dim": 8})
    assert e.value.category == "bad_model_factory"
