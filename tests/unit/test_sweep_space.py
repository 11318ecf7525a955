"""A sweep's space: every search form, and every bad input refused before a trial or an MLflow run exists."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from rayemb.config import load_config
from rayemb.errors import ConfigError
from rayemb.sweep.space import check_space, load_space, override, parse_space

CONFIG = "jobs/configs/synth_small.yaml"


def test_every_form_becomes_its_tune_sampler():
    from ray.tune.search.sample import Categorical, Float, Integer, LogUniform

    space = parse_space({"model.embedding_dim": {"grid": [8, 16]}, "model.args.hidden": {"choice": [[64, 32], [32]]},
                         "train.dense_lr": {"loguniform": [0.001, 0.3]}, "train.weight_decay": {"uniform": [0.0, 0.01]},
                         "data.batch_size": {"randint": [128, 513]}})
    assert space["model.embedding_dim"].tune() == {"grid_search": [8, 16]}
    hidden = space["model.args.hidden"].tune()
    assert isinstance(hidden, Categorical) and hidden.categories == [[64, 32], [32]]
    lr = space["train.dense_lr"].tune()
    assert isinstance(lr, Float) and isinstance(lr.sampler, LogUniform) and (lr.lower, lr.upper) == (0.001, 0.3)
    wd = space["train.weight_decay"].tune()
    assert isinstance(wd, Float) and (wd.lower, wd.upper) == (0.0, 0.01)
    bs = space["data.batch_size"].tune()
    assert isinstance(bs, Integer) and (bs.lower, bs.upper) == (128, 513)
    # a range is checked at both ends; randint's upper end is excluded, as Tune draws it
    assert space["data.batch_size"].checked_values() == (128, 512)
    assert space["model.embedding_dim"].checked_values() == (8, 16)


def test_every_form_builds_a_config_with_each_checked_value():
    space = parse_space({"train.epochs": {"grid": [1, 2]}, "model.args.hidden": {"choice": [[64, 32]]},
                         "train.dense_lr": {"loguniform": [0.001, 0.3]}, "data.batch_size": {"randint": [128, 513]}})
    base = load_config(CONFIG).to_dict()
    built = check_space(space, base)
    assert [c.train.epochs for c in built[:2]] == [1, 2]
    assert built[2].model.args == {"hidden": [64, 32]}
    assert [c.train.dense_lr for c in built[3:5]] == [0.001, 0.3]
    assert [c.data.batch_size for c in built[5:]] == [128, 512]


def test_override_is_yaml_the_config_reads_back():
    assert override("model.args.hidden", [64, 32]) == "model.args.hidden=[64, 32]"
    assert override("planner.engine", "fast") == 'planner.engine="fast"'
    assert yaml.safe_load(override("train.dense_lr", 0.01).split("=", 1)[1]) == 0.01


@pytest.mark.parametrize("doc,says", [
    ({"train.dense_lr": [0.1, 0.01]}, "not one search form"),
    ({"train.dense_lr": {"grid": [0.1], "choice": [0.2]}}, "not one search form"),
    ({"train.dense_lr": {"normal": [0, 1]}}, "not one search form"),
    ({"train.dense_lr": {"grid": []}}, "non-empty list"),
    ({"train.dense_lr": {"choice": 0.1}}, "non-empty list"),
    ({"train.dense_lr": {"grid": [0.1, 0.1]}}, "repeats a value"),
    ({"train.dense_lr": {"uniform": [0.3, 0.1]}}, "lo < hi"),
    ({"train.dense_lr": {"uniform": [0.1]}}, "lo < hi"),
    ({"train.dense_lr": {"uniform": ["a", "b"]}}, "lo < hi"),
    ({"train.dense_lr": {"loguniform": [0.0, 0.1]}}, "lo > 0"),
    ({"data.batch_size": {"randint": [1.5, 8]}}, "two integers"),
    ({"tracking.experiment": {"grid": ["a", "b"]}}, "set by the sweep"),
    ({"name": {"grid": ["a", "b"]}}, "set by the sweep"),
    ({"train..lr": {"grid": [1, 2]}}, "not a config key"),
    ({}, "must map config keys"),
    ([1, 2], "must map config keys"),
])
def test_a_malformed_entry_is_refused_naming_the_key(doc, says):
    with pytest.raises(ConfigError) as e:
        parse_space(doc)
    assert says in e.value.message
    if isinstance(doc, dict) and doc:
        assert next(iter(doc)) in e.value.message


@pytest.mark.parametrize("doc,says", [
    ({"train.lrr": {"grid": [0.1, 0.2]}}, "train.lrr: is not a config key"),
    ({"modle.embedding_dim": {"choice": [8]}}, "modle.embedding_dim: is not a config key"),
    ({"train.epochs.x": {"grid": [1, 2]}}, "train.epochs.x: is not a config key"),
    ({"train.epochs": {"grid": [1, -2]}}, "train.epochs: the config refuses the grid value -2"),
    ({"train.epochs": {"choice": [1, "many"]}}, "the config refuses the choice value 'many'"),
    # a value the config refuses with the other keys' values: the DLRM's bottom MLP, swept too, ends elsewhere
    ({"model.embedding_dim": {"grid": [16, 8]}, "model.bottom_mlp": {"grid": [[64, 16]]}},
     "refuses the grid value 8 (Invalid config value model.bottom_mlp"),
    ({"train.dense_lr": {"uniform": [-1.0, 0.1]}}, "the config refuses the uniform bound -1.0"),
    ({"train.epochs": {"randint": [1, 1000000]}}, None),
    ({"planner.engine": {"grid": ["fast", "quantum"]}}, "the config refuses the grid value 'quantum'"),
])
def test_a_value_the_config_refuses_is_refused_naming_the_key(doc, says):
    base = load_config(CONFIG).to_dict()
    if says is None:  # a range the config takes at both ends
        check_space(parse_space(doc), base)
        return
    with pytest.raises(ConfigError) as e:
        check_space(parse_space(doc), base)
    assert says in e.value.message


def test_load_space_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_space(str(tmp_path / "none.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("train.dense_lr: {grid: [0.1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_space(str(bad))
    good = tmp_path / "space.yaml"
    good.write_text("train.dense_lr: {grid: [0.1, 0.01]}\n")
    assert load_space(str(good))["train.dense_lr"].values == (0.1, 0.01)


def test_trial_config_names_the_job_by_its_trial_and_keeps_one_store(tmp_path):
    from rayemb.sweep.trial import trial_config

    base = load_config(CONFIG).to_dict()
    cfg = trial_config(base, {"model.embedding_dim": 8, "model.bottom_mlp": [64, 8], "model.args.hidden": [32]},
                       "ab12_00001",
                       str(tmp_path / "t1"), "sqlite:////abs/mlflow.db")
    assert cfg.name == "synth-small-ab12_00001"
    assert cfg.model.embedding_dim == 8 and cfg.model.args == {"hidden": [32]}
    assert cfg.tracking.output_dir == str(tmp_path / "t1")
    assert cfg.tracking.tracking_uri == "sqlite:////abs/mlflow.db"
    assert cfg.tracking.experiment == "rayemb-synth-small"


def test_default_concurrency_leaves_cpus_for_data_reads():
    from rayemb.sweep.engine import default_concurrency

    two = load_config(CONFIG)  # 2 workers, CPUs per worker chosen from the cluster's
    assert default_concurrency([two], cluster_cpus=2.0) == 1  # 2 x 0.5 CPU, 1 CPU kept for reads
    assert default_concurrency([two], cluster_cpus=9.0) == 4  # 2 x 1 CPU in 8
    one = load_config(CONFIG, ["scaling.num_workers=1", "scaling.cpus_per_worker=1"])
    assert default_concurrency([one], cluster_cpus=9.0) == 8
    # the largest trial's job counts
    four = load_config(CONFIG, ["scaling.num_workers=4", "scaling.cpus_per_worker=1"])
    assert default_concurrency([one, four], cluster_cpus=9.0) == 2
    gpu = load_config(CONFIG, ["scaling.use_gpu=true", "scaling.cpus_per_worker=1"])
    assert default_concurrency([gpu], cluster_cpus=64.0, cluster_gpus=4.0) == 2
    # never none: one trial at a time on a cluster too small for a job's share
    assert default_concurrency([four], cluster_cpus=2.0) == 1


# ---- the command: bad input exits 2 before any trial or MLflow run ---- #


def _sweep(tmp_path, space_doc, *extra):
    from rayemb.cli import main

    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(space_doc) if not isinstance(space_doc, str) else space_doc)
    out = tmp_path / "runs"
    return main(["sweep", "--config", CONFIG, "--space", str(space), "--set", f"tracking.output_dir={out}",
                 "--set", f"data.path={tmp_path / 'no-data'}", *extra]), out


def _nothing_started(out):
    import ray

    assert not ray.is_initialized()  # no trial, no Tune, not even a Ray
    assert not os.path.exists(out / "mlflow.db")  # no MLflow run, not even the store


@pytest.mark.parametrize("space_doc,extra,says", [
    ({"train.lrr": {"grid": [0.1, 0.2]}}, (), "train.lrr: is not a config key"),
    ({"train.epochs": {"grid": [1, 0]}}, (), "train.epochs: the config refuses the grid value 0"),
    ({"train.dense_lr": {"loguniform": [0.0, 0.1]}}, (), "train.dense_lr: loguniform [0.0, 0.1]"),
    ({"train.dense_lr": {"grid": [0.1], "uniform": [0, 1]}}, (), "train.dense_lr: "),
    ("train.dense_lr: {grid: [0.1\n", (), "not valid YAML"),
    ({"train.dense_lr": {"grid": [0.1, 0.2]}}, ("--metric", "accuracy"), "--metric 'accuracy'"),
    ({"train.dense_lr": {"grid": [0.1, 0.2]}}, ("--scheduler", "pbt"), "--scheduler 'pbt'"),
    ({"train.dense_lr": {"grid": [0.1, 0.2]}}, ("--search", "hyperopt"), "--search 'hyperopt'"),
    ({"train.dense_lr": {"grid": [0.1, 0.2]}}, ("--num-samples", "0"), "--num-samples 0"),
    ({"train.dense_lr": {"grid": [0.1, 0.2]}}, ("--max-concurrent", "0"), "--max-concurrent 0"),
    ({"train.dense_lr": {"grid": [0.1, 0.2]}}, ("--resume",), "there is no sweep 'synth-small' to resume"),
    ({"train.dense_lr": {"grid": [0.1, 0.2]}}, ("--set", "train.epochs=0"), "train.epochs"),
])
def test_bad_input_exits_2_before_anything_starts(tmp_path, capsys, space_doc, extra, says):
    rc, out = _sweep(tmp_path, space_doc, *extra)
    err = capsys.readouterr().err
    assert rc == 2 and says in err, err
    assert "Traceback" not in err
    _nothing_started(out)


def test_optuna_search_names_the_extra_or_refuses_a_grid(tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("optuna") is None:
        rc, out = _sweep(tmp_path, {"train.dense_lr": {"loguniform": [0.001, 0.1]}}, "--search", "optuna")
        assert rc == 2 and "pip install 'rayemb[optuna]'" in capsys.readouterr().err
    else:
        rc, out = _sweep(tmp_path, {"train.dense_lr": {"grid": [0.1, 0.2]}}, "--search", "optuna")
        assert rc == 2 and "train.dense_lr use grid" in capsys.readouterr().err
    _nothing_started(out)


def test_an_existing_sweep_needs_resume_or_another_name(tmp_path, capsys):
    folder = tmp_path / "runs" / "sweeps" / "synth-small"
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps({"parent_run_id": "0123abcd", "settings": {}}))
    rc, out = _sweep(tmp_path, {"train.dense_lr": {"grid": [0.1, 0.2]}})
    err = capsys.readouterr().err
    assert rc == 2 and "Pass --resume to continue it, or --name NAME" in err, err
    # resumed with another space than it ran with
    rc, _ = _sweep(tmp_path, {"train.dense_lr": {"grid": [0.1, 0.2]}}, "--resume")
    err = capsys.readouterr().err
    assert rc == 2 and "ran with other" in err and "space" in err, err
    _nothing_started(out)
