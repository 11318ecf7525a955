"""``rayemb export`` of a model other than the DLRM: rebuilt by its factory, its code carried in the export.

A checkpoint written from a plain model (no process group: ``tests/_tiny_checkpoint.py``) of DeepFM
(``examples/deepfm.py``, a module outside the installed packages) and of the shipped DCN-v2 is exported with
``rayemb export --checkpoint``; the exported model's scores equal the model's own forward on the validation
rows. DeepFM's module is copied into ``DIR/code``; neither model has a TorchScript form; a factory defined in
a script (``__main__``) is refused before anything is written; a model.json of an older export (no name, no
factory) still loads as the DLRM.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from _tiny_checkpoint import write_checkpoint

from rayemb.cli import main

MODELS = {
    "deepfm": {"factory": "examples.deepfm:deepfm", "args": {"hidden": [16, 8]}},
    "dcn_v2": {"name": "dcn_v2", "args": {"cross_layers": 2, "bottom_mlp": [8, 4], "deep_mlp": [16, 8]}},
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.synthetic import SyntheticSpec, generate

    out = str(tmp_path_factory.mktemp("user_export_data"))
    generate(SyntheticSpec(rows=600, num_tables=4, multi_hot=True, mean_pooling=3, seed=3, num_signal_tables=3,
                           cardinalities=[60, 50, 40, 45], valid_fraction=0.2), out)
    return out, DatasetSchema.load(out)


def _job(tmp_path, data, model):
    from rayemb.config import config_from_dict

    cfg = config_from_dict({"name": "user-export", "data": {"path": data},
                            "model": {"embedding_dim": 4, **MODELS[model]},
                            "tracking": {"output_dir": str(tmp_path / "runs"), "experiment": "user-export"}})
    (tmp_path / "job.yaml").write_text(cfg.to_yaml())
    return cfg


def _reference_logits(checkpoint, schema, model_cfg, rows):
    """The model its factory builds over a plain EBC, the checkpoint's tables and dense weights copied in by
    name (not through rayemb.serve), on the rows converted as training converts them."""
    import torch
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rayemb.checkpoint.export import unsharded_state
    from rayemb.data.batching import BatchConverter
    from rayemb.contract.model import Embeddings
    from rayemb.contract.factory import SHIPPED_MODELS, ModelSpec
    from rayemb.contract.tables import table_configs

    state = unsharded_state(checkpoint)
    ebc = EmbeddingBagCollection(table_configs(schema, model_cfg["embedding_dim"]))
    spec = ModelSpec(model_cfg["factory"] or SHIPPED_MODELS[model_cfg["name"]], model_cfg["args"], "ref")
    model, _ = spec.build(Embeddings(pooled=ebc, features=tuple(schema.sparse_names), dim=4), schema)
    with torch.no_grad():
        for name, table in ebc.embedding_bags.items():
            table.weight.copy_(state["tables"][name]["weight"])
        for key, value in model.state_dict().items():
            if not key.startswith("embedding."):
                value.copy_(state["dense"][key])
        b = BatchConverter(schema, "error")(rows)
        return model.eval()(b.dense, b.sparse).numpy()


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_factory_model_exports_and_scores_as_its_own_forward(model, dataset, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel, model_config, sigmoid

    data, schema = dataset
    cfg = _job(tmp_path, data, model)
    mcfg = model_config(cfg)
    checkpoint = write_checkpoint(str(tmp_path / "ckpt"), schema, mcfg, seed=3)
    monkeypatch.chdir(tmp_path)  # nothing MLflow writes may land in the repository
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading the export puts its code/ on the path
    out = tmp_path / "model"
    assert main(["export", "--checkpoint", checkpoint, "--config", str(tmp_path / "job.yaml"), "--out", str(out),
                 "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]) == 0

    info = json.loads((out / "model.json").read_text())
    assert {k: info["model"][k] for k in ("name", "factory", "args")} == {
        "name": cfg.model.name, "factory": cfg.model.factory, "args": MODELS[model]["args"]}
    assert info["torchscript"] is None and "DLRM only" in info["torchscript_skipped"]
    if model == "deepfm":  # not installed: its module travels with the export
        assert info["code"] == {"dir": "code", "module": "examples.deepfm", "files": ["examples/deepfm.py"]}
        assert (out / "code" / "examples" / "deepfm.py").read_text().startswith('"""DeepFM')
    else:  # rayemb's own
        assert info["code"] is None and not (out / "code").exists()

    valid = pq.read_table(parquet_files(data, "valid"))
    want = _reference_logits(checkpoint, schema, mcfg, valid)
    loaded = InferenceModel.load(str(out))
    assert loaded.paths == {"pooled": "embedding"} and not loaded.sequence
    np.testing.assert_allclose(loaded.logits(valid), want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(loaded.predict(valid), sigmoid(want), rtol=0, atol=1e-6)
    assert want.std() > 1e-3  # the rows get different scores


def test_a_factory_of_a_script_is_refused_before_anything_is_written(dataset, tmp_path, capsys):
    from rayemb.config import config_from_dict
    from rayemb.serve.model import model_config

    data, schema = dataset
    cfg = _job(tmp_path, data, "deepfm")
    checkpoint = write_checkpoint(str(tmp_path / "ckpt"), schema, model_config(cfg))
    d = cfg.to_dict()
    d["model"]["factory"] = "__main__:deepfm"
    (tmp_path / "script.yaml").write_text(config_from_dict(d).to_yaml())
    out = tmp_path / "model"
    assert main(["export", "--checkpoint", checkpoint, "--config", str(tmp_path / "script.yaml"), "--out", str(out),
                 "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]) == 2
    err = capsys.readouterr().err
    assert "__main__:deepfm" in err and "module file" in err and "--config" in err
    assert not out.exists() and not list(tmp_path.glob("model.partial*"))


def test_an_older_model_json_without_name_or_factory_is_the_dlrm(dataset, tmp_path):
    import pyarrow.parquet as pq
    import torch

    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel, build_dlrm

    data, schema = dataset
    mcfg = {"embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1]}
    torch.manual_seed(0)
    model = InferenceModel.from_state(build_dlrm(schema, mcfg).state_dict(), schema, mcfg)
    model.save(str(tmp_path / "m"))
    info = json.loads((tmp_path / "m" / "model.json").read_text())
    assert info["torchscript"] == "model.torchscript.pt" and info["code"] is None
    info.pop("code")
    (tmp_path / "m" / "model.json").write_text(json.dumps(info))
    valid = pq.read_table(parquet_files(data, "valid"))
    loaded = InferenceModel.load(str(tmp_path / "m"))
    assert type(loaded.model).__name__ == "DLRM"
    np.testing.assert_array_equal(loaded.logits(valid), model.logits(valid))
