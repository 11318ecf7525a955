"""A swept embedding dim of the shipped DLRM: its bottom MLP's last width follows it, in the check before the sweep
starts and in each trial's config, where the base's bottom MLP ends at its embedding dim and is not swept itself."""

from __future__ import annotations

import pytest

from rayemb.config import load_config
from rayemb.errors import ConfigError
from rayemb.sweep.space import check_space, parse_space, with_carried
from rayemb.sweep.trial import trial_config

CONFIG = "jobs/configs/synth_small.yaml"


def test_the_embedding_dim_of_the_shipped_dlrm_can_be_swept():
    base = load_config(CONFIG).to_dict()
    space = parse_space({"model.embedding_dim": {"grid": [8, 16, 32]},
                         "train.dense_lr": {"loguniform": [0.0005, 0.02]}})
    built = check_space(space, base)
    assert [(c.model.embedding_dim, list(c.model.bottom_mlp)) for c in built[:3]] == [
        (8, [64, 8]), (16, [64, 16]), (32, [64, 32])]


def test_each_trial_config_carries_the_bottom_mlp_along(tmp_path):
    base = load_config(CONFIG).to_dict()
    cfg = trial_config(base, {"model.embedding_dim": 8, "train.dense_lr": 0.001}, "t_00000", str(tmp_path),
                       "sqlite:////abs/mlflow.db")
    assert cfg.model.embedding_dim == 8 and list(cfg.model.bottom_mlp) == [64, 8]
    # the child run's params are the config's keys: the real bottom MLP is among them
    assert cfg.to_dict()["model"]["bottom_mlp"] == [64, 8]


def test_a_numpy_integer_tune_sampled_is_carried():
    np = pytest.importorskip("numpy")
    base = load_config(CONFIG).to_dict()
    assert with_carried(base, {"model.embedding_dim": np.int64(24)})["model.bottom_mlp"] == [64, 24]


def test_a_swept_bottom_mlp_or_one_ended_elsewhere_is_left_as_it_is():
    base = load_config(CONFIG).to_dict()
    both = {"model.embedding_dim": 8, "model.bottom_mlp": [32, 8]}
    assert with_carried(base, both) == both
    assert with_carried(base, {"train.dense_lr": 0.1}) == {"train.dense_lr": 0.1}
    # a factory of one's own has no DLRM bottom MLP to carry
    own = {**base, "model": {**base["model"], "factory": "my_models:build"}}
    assert "model.bottom_mlp" not in with_carried(own, {"model.embedding_dim": 8})
    # a grid of both keys crosses them: a combination whose bottom MLP ends elsewhere is refused, naming the key
    with pytest.raises(ConfigError) as e:
        check_space(parse_space({"model.embedding_dim": {"grid": [16, 8]},
                                 "model.bottom_mlp": {"grid": [[64, 16]]}}), base)
    assert "model.embedding_dim: the config refuses the grid value 8" in e.value.message
