import pytest

from rayemb.config import config_from_dict, load_config, resolve_path
from rayemb.errors import ConfigError

BASE = {"name": "t", "data": {"path": "data/x"}}


def test_defaults_and_overrides_parse_yaml_values():
    cfg = config_from_dict(BASE, ["train.epochs=3", "model.bottom_mlp=[32,16]", "scaling.use_gpu=false"])
    assert cfg.train.epochs == 3
    assert cfg.model.bottom_mlp == (32, 16)
    assert cfg.scaling.use_gpu is False
    assert cfg.flatten()["train.epochs"] == 3
    assert cfg.flatten()["model.bottom_mlp"] == [32, 16]


def test_round_trip_through_dict():
    cfg = config_from_dict(BASE, ["train.dense_lr=0.1"])
    assert config_from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "override, needle",
    [
        ("data.batch_size=0", "data.batch_size"),
        ("data.id_policy=drop", "data.id_policy"),
        ("train.epochs=two", "train.epochs"),
        ("model.bottom_mlp=[64,8]", "model.bottom_mlp"),
        ("model.top_mlp=[64,2]", "model.top_mlp"),
        ("train.embedding_optimizer=lamb", "train.embedding_optimizer"),
        ("model.embedding_dtype=bf16", "model.embedding_dtype"),
        ("train.compile=all", "train.compile"),
        ("train.compile_mode=fast", "train.compile_mode"),
        ("train.bogus=1", "bogus"),
        ("scaling.num_workers=0", "scaling.num_workers"),
        ("scaling.use_gpu=yes please", "scaling.use_gpu"),
    ],
)
def test_invalid_values_name_the_key(override, needle):
    with pytest.raises(ConfigError) as e:
        config_from_dict(BASE, [override])
    assert needle in str(e.value)


def test_embedding_dtype_fp16_and_what_it_refuses():
    assert config_from_dict(BASE).model.embedding_bytes_per_element == 4
    cfg = config_from_dict(BASE, ["model.embedding_dtype=fp16", "planner.tables={C1: {compression: none}}"])
    assert cfg.model.embedding_dtype == "fp16" and cfg.model.embedding_bytes_per_element == 2
    with pytest.raises(ConfigError) as e:
        config_from_dict(BASE, ["model.embedding_dtype=float16"])
    assert str(e.value).startswith("Invalid config value model.embedding_dtype: 'float16' is unknown")
    assert "('fp32', 'fp16')" in str(e.value)
    with pytest.raises(ConfigError, match="model.embedding_dtype: fp16 tables are pooled tables only"):
        config_from_dict(BASE, ["model.embedding_dtype=fp16", "model.sequence_tower=mean"])
    with pytest.raises(ConfigError, match=r"model.embedding_dtype: fp16 tables cannot be compressed.*\['C2'\]"):
        config_from_dict(BASE, ["model.embedding_dtype=fp16", "planner.tables={C1: {sharding: row_wise}, "
                                                                "C2: {compression: qr}}"])
    assert config_from_dict(BASE, ["planner.tables={C2: {compression: qr}}"]).model.embedding_dtype == "fp32"


def test_missing_required_key():
    with pytest.raises(ConfigError, match="data.path"):
        config_from_dict({"name": "t", "data": {}})


def test_override_without_equals():
    with pytest.raises(ConfigError, match="key=value"):
        config_from_dict(BASE, ["train.epochs"])


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))


def test_shipped_config_is_valid():
    import os

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cfg = load_config(os.path.join(here, "jobs", "configs", "synth_small.yaml"))
    assert cfg.scaling.num_workers == 2 and cfg.model.bottom_mlp[-1] == cfg.model.embedding_dim


def test_resolve_path_uses_workspace(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYEMB_WORKSPACE", str(tmp_path))
    assert resolve_path("data/x") == str(tmp_path / "data" / "x")
    assert resolve_path("/abs/p") == "/abs/p"
    assert resolve_path("s3://bucket/p") == "s3://bucket/p"
