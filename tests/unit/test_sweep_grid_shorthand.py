"""``rayemb train --sweep key=v1,v2``: the specs parsed and turned into the grid space ``rayemb sweep`` runs."""

from __future__ import annotations

import pytest

from rayemb.errors import ConfigError
from rayemb.tracking.sweep import grid_space, parse_sweep


def test_parse_sweep():
    assert parse_sweep("model.embedding_dim=8,16") == ("model.embedding_dim", ["8", "16"])
    assert parse_sweep(" train.dense_lr = 0.1, 0.01 ") == ("train.dense_lr", ["0.1", "0.01"])
    assert parse_sweep("model.bottom_mlp=[64,16],[32,16]") == ("model.bottom_mlp", ["[64,16]", "[32,16]"])
    assert parse_sweep("tag='a,b',c") == ("tag", ["'a,b'", "c"])
    for bad in ("model.embedding_dim", "=1,2", "k=1,,2", "k=", "k=1,1"):
        with pytest.raises(ConfigError) as e:
            parse_sweep(bad)
        assert e.value.category == "invalid_sweep"


def test_grid_space_reads_values_as_set_does():
    space = grid_space(["train.dense_lr=0.1,0.02", "model.bottom_mlp=[64,16],[32,16]", "planner.engine=fast,torchrec"])
    assert space == {"train.dense_lr": {"grid": [0.1, 0.02]}, "model.bottom_mlp": {"grid": [[64, 16], [32, 16]]},
                     "planner.engine": {"grid": ["fast", "torchrec"]}}


def test_grid_space_refuses_a_key_twice_or_no_spec():
    with pytest.raises(ConfigError, match="same key twice"):
        grid_space(["train.dense_lr=0.1", "train.dense_lr=0.2"])
    with pytest.raises(ConfigError, match="at least one --sweep"):
        grid_space([])
    with pytest.raises(ConfigError, match="not valid YAML"):
        grid_space(["train.dense_lr=[0.1"])


def test_train_sweep_with_a_bad_value_exits_2_before_anything_starts(tmp_path, capsys):
    import os

    import ray

    from rayemb.cli import main

    rc = main(["train", "--config", "jobs/configs/synth_small.yaml", "--set", f"tracking.output_dir={tmp_path}",
               "--sweep", "train.epochs=1,0"])
    err = capsys.readouterr().err
    assert rc == 2 and "train.epochs: the config refuses the grid value 0" in err, err
    assert not ray.is_initialized() and not os.path.exists(tmp_path / "mlflow.db")
