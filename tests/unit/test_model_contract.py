"""The model contract: how a config names a factory, what a factory must return, and where the plan's keys go.

Every broken factory fails with a ``ConfigError`` of category ``bad_model_factory`` whose message names the
fix; a model that keeps the contract is built with the embedding modules rayemb made, wherever it holds them.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rayemb.config import ModelConfig
from rayemb.data.schema import DatasetSchema
from rayemb.errors import ConfigError
from rayemb.contract.factory import model_spec

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "user_models"


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.syspath_prepend(str(REPO))


def _schema() -> DatasetSchema:
    return DatasetSchema.from_dict({"label": "label", "dense": ["I1", "I2"], "sparse": [
        {"name": "C1", "num_embeddings": 50}, {"name": "C2", "num_embeddings": 30}]})


def _build(factory: str, args=None, placements=None, hot=None):
    from rayemb.config import config_from_dict
    from rayemb.train.sharding import build_model

    cfg = config_from_dict({"name": "t", "data": {"path": "d"},
                            "model": {"factory": factory, "args": args or {}, "embedding_dim": 8}})
    meta = torch.device("meta")
    return build_model(cfg, _schema(), placements or {}, hot or {}, meta, meta, model=model_spec(cfg.model))


@pytest.mark.parametrize("factory,says", [
    ("no_such_module_xyz:build", "cannot be imported"),
    ("broken_models:missing", "has no 'missing'"),
    ("broken_models:NOT_A_FUNCTION", "not a function"),
])
def test_a_factory_that_cannot_be_found_is_named_with_the_fix(on_path, factory, says):
    with pytest.raises(ConfigError) as e:
        model_spec(ModelConfig(factory=factory))
    assert e.value.category == "bad_model_factory" and says in str(e.value) and factory.split(":")[0] in str(e.value)


def test_a_factory_string_without_a_function_is_a_config_error():
    with pytest.raises(ConfigError, match="package.module:function"):
        ModelConfig(factory="examples.deepfm")


def test_an_unknown_shipped_model_lists_the_known_ones():
    with pytest.raises(ConfigError, match="'dlrm'"):
        ModelConfig(name="resnet")


@pytest.mark.parametrize("factory,args,says", [
    ("broken_models:returns_a_dict", None, "returned dict, not a torch.nn.Module"),
    ("broken_models:drops_the_embeddings", None, "self.embedding = embeddings.pooled"),
    ("broken_models:own_table", None, "holds embedding tables rayemb did not build: {'own': 'Embedding'}"),
    ("broken_models:takes_no_args", {"width": 3}, "must name its keyword arguments"),
])
def test_a_factory_that_breaks_the_contract_fails_naming_what_is_missing(on_path, factory, args, says):
    with pytest.raises(ConfigError) as e:
        _build(factory, args)
    assert e.value.category == "bad_model_factory" and says in str(e.value), str(e.value)


def test_a_model_of_ones_own_is_built_around_the_embeddings_rayemb_made(on_path):
    from rayemb.planner.types import Placement, TablePlan

    placements = {"C1": TablePlan("C1", Placement.HYBRID, "row_wise", (0, 1), 3, 0.0, 0, "fused")}
    model, embeddings, paths = _build("examples.deepfm:deepfm", {"hidden": [12]}, placements,
                                      {"C1": np.array([1, 2, 3])})
    assert type(model).__name__ == "DeepFM" and model.embedding is embeddings.pooled
    assert paths == {"pooled": "embedding"}
    assert [m.out_features for m in model.deep if isinstance(m, torch.nn.Linear)] == [12, 1]  # model.args reached it
    assert embeddings.features == ("C1", "C2") and embeddings.dim == 8
    assert sorted(embeddings.pooled.remapper.hot_ids("C1").tolist()) == [1, 2, 3]  # the plan's hot set


def test_the_plan_follows_the_model_to_wherever_it_holds_the_tables():
    from torchrec.distributed.types import ShardingPlan

    from rayemb.train.sharding import plan_for_model

    plan = ShardingPlan(plan={"embedding.plain": "p", "embedding.cold.d8": "c", "sequence": "s"})
    moved = plan_for_model(plan, {"pooled": "towers.user.tables", "sequence": "history.sequence"})
    assert moved.plan == {"towers.user.tables.plain": "p", "towers.user.tables.cold.d8": "c", "history.sequence": "s"}
    assert plan_for_model(plan, {"pooled": "embedding"}).plan == plan.plan


def test_a_users_module_travels_to_ray_workers_by_value(on_path):
    from ray import cloudpickle

    spec = model_spec(ModelConfig(factory="examples.deepfm:deepfm"))
    blob = cloudpickle.dumps(spec)
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.startswith("examples")}
    try:  # a worker that cannot import examples.deepfm still gets the function
        fn = cloudpickle.loads(blob).factory
        assert fn.__name__ == "deepfm" and "examples" not in sys.modules
    finally:
        sys.modules.update(saved)


def test_shipped_models_use_only_the_public_api():
    """rayemb.models is built on what `rayemb.__all__` names, as a user's model is."""
    import rayemb

    bad = []
    for path in sorted((REPO / "rayemb" / "models").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rayemb":
                if node.module != "rayemb":
                    bad.append(f"{path.name}: from {node.module} import ...")
                else:
                    bad += [f"{path.name}: rayemb.{a.name}" for a in node.names if a.name not in rayemb.__all__]
            elif isinstance(node, ast.Import):
                bad += [f"{path.name}: import {a.name}" for a in node.names if a.name.startswith("rayemb.")]
    assert not bad, f"rayemb/models imports rayemb internals: {bad}"
    assert any((REPO / "rayemb" / "models").glob("*.py"))
