"""A multi-task model (schema.yaml ``label: [label, like]``) exports with one prediction column per task.

Checkpoints of a freshly initialised two-task DLRM and DCN-v2 (``tests/_task_exports.py``) go through
``rayemb export --checkpoint``: the exported model's ``predict`` is ``(N, 2)``, column t the sigmoid of the
factory's own model's logit t; the logged pyfunc model returns ``prediction_label`` and ``prediction_like``
and its signature names them. A single-task model keeps its one ``prediction`` column; a model whose output
has not one column per label is refused naming the shapes.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

MODELS = {
    "dlrm": {"bottom_mlp": [8, 4], "top_mlp": [8, 1]},
    "dcn_v2": {"name": "dcn_v2", "args": {"cross_layers": 2, "bottom_mlp": [8, 4], "deep_mlp": [16, 8]}},
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from tests._task_exports import two_task_data

    return two_task_data(str(tmp_path_factory.mktemp("two_task_data")))


@pytest.mark.parametrize("model", sorted(MODELS))
def test_each_task_gets_its_own_prediction_column(model, data, tmp_path, capsys):
    import mlflow
    import pyarrow.parquet as pq
    from mlflow import MlflowClient

    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel, sigmoid
    from tests._task_exports import export, reference_outputs

    out, uri, checkpoint = export(str(tmp_path), data, MODELS[model])
    assert "prediction column(s) prediction_label, prediction_like" in capsys.readouterr().out
    assert json.loads(open(os.path.join(out, "model.json")).read())["schema"]["label"] == ["label", "like"]
    valid = pq.read_table(parquet_files(data, "valid"))
    want = reference_outputs(checkpoint, data, MODELS[model], valid)
    assert want.shape == (valid.num_rows, 2) and want.std(axis=0).min() > 1e-3

    loaded = InferenceModel.load(out)
    np.testing.assert_allclose(loaded.logits(valid), want, rtol=0, atol=1e-5)
    probs = loaded.predict(valid)
    assert probs.shape == (valid.num_rows, 2) and probs.dtype == np.float64
    np.testing.assert_allclose(probs, sigmoid(want), rtol=0, atol=1e-6)
    assert loaded.predict(valid.slice(0, 0)).shape == (0, 2)

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("task-export").experiment_id])
    mlflow.set_tracking_uri(uri)
    try:
        pyfunc = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
        got = pyfunc.predict(valid.to_pandas())
    finally:
        mlflow.set_tracking_uri("")
    assert list(got.columns) == ["prediction_label", "prediction_like"]
    np.testing.assert_allclose(got.to_numpy(), probs, rtol=0, atol=1e-12)
    assert pyfunc.metadata.signature.outputs.input_names() == ["prediction_label", "prediction_like"]
    assert pyfunc.metadata.signature.params is None


def test_a_single_task_model_keeps_its_one_prediction_column():
    from rayemb.data.schema import DatasetSchema
    from rayemb.serve.columns import prediction_columns
    from rayemb.serve.mlflow_model import signature

    one = DatasetSchema.from_dict({"label": "click", "dense": ["I1"], "sparse": [{"name": "C1", "num_embeddings": 9}]})
    assert prediction_columns(one) == ["prediction"]
    assert signature(one).outputs.input_names() == ["prediction"] and signature(one).params is None
    two = DatasetSchema.from_dict({**one.to_dict(), "label": ["click", "like"]})
    assert prediction_columns(two) == ["prediction_click", "prediction_like"]


def test_a_model_without_one_logit_per_label_is_refused_naming_the_shapes(data):
    import pyarrow.parquet as pq

    from rayemb.data.schema import DatasetSchema, parquet_files
    from rayemb.errors import ConfigError
    from rayemb.serve.model import InferenceModel, build_dlrm

    two = DatasetSchema.load(data)
    one = DatasetSchema.from_dict({**two.to_dict(), "label": "label"})
    single = build_dlrm(one, {"embedding_dim": 4, **MODELS["dlrm"]})  # one logit per row
    with pytest.raises(ConfigError, match=r"shape \(120,\).*\['label', 'like'\].*\(B, 2\)") as e:
        InferenceModel(single, two).predict(pq.read_table(parquet_files(data, "valid")), batch_rows=200)
    assert e.value.category == "bad_model_output"
