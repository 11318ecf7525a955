"""A two-tower retrieval model exports pair scores, user vectors and item vectors, and its catalogue.

A checkpoint of a freshly initialised ``model.name: two_tower`` over a tiny MovieLens conversion
(``tests/_task_exports.py``) goes through ``rayemb export --checkpoint``. The exported model's pair scores,
user vectors and item vectors equal the factory's own model's ``(query . candidate, query, candidate)``; a
row's score is its user vector (computed without the item column) dotted with its item's catalogue vector;
``items.parquet`` holds one vector per id of the item table. The logged pyfunc model declares the
``output`` param and serves each output; wrong requests fail naming the input and the fix.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

MODEL = {"name": "two_tower", "args": {"item_feature": "item", "tower_mlp": [8, 4], "temperature": 0.2}}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from tests._task_exports import export, movielens

    root = str(tmp_path_factory.mktemp("retrieval_export"))
    data = movielens(root)
    out, uri, checkpoint = export(root, data, MODEL)
    return {"data": data, "out": out, "uri": uri, "checkpoint": checkpoint}


@pytest.fixture(scope="module")
def valid(exported):
    import pyarrow.parquet as pq

    from rayemb.data.schema import parquet_files

    return pq.read_table(parquet_files(exported["data"], "valid"))


def test_scores_and_vectors_are_the_two_towers(exported, valid):
    import pyarrow.parquet as pq

    from rayemb.serve.model import InferenceModel
    from tests._task_exports import reference_outputs

    query, candidate = reference_outputs(exported["checkpoint"], exported["data"], MODEL, valid)
    loaded = InferenceModel.load(exported["out"])
    assert loaded.item_feature == "item"
    scores = loaded.predict(valid)
    assert scores.dtype == np.float64 and scores.std() > 1e-3
    np.testing.assert_allclose(scores, (query.astype(np.float64) * candidate).sum(-1), rtol=0, atol=1e-5)
    np.testing.assert_array_equal(loaded.logits(valid), scores)
    users = loaded.user_embeddings(valid)
    np.testing.assert_allclose(users, query, rtol=0, atol=1e-6)
    # a user needs no item (the same tower on other input columns: equal up to float32 rounding of its kernels)
    np.testing.assert_allclose(loaded.user_embeddings(valid.drop(["item"])), users, rtol=0, atol=1e-6)

    items = loaded.item_embeddings()
    rows = loaded.schema.feature("item").num_embeddings
    assert items.shape == (rows, 4)
    ids = valid.column("item").to_numpy()
    np.testing.assert_allclose(items[ids], candidate, rtol=0, atol=1e-6)  # the candidate is the item's alone
    np.testing.assert_allclose(scores, (users.astype(np.float64) * items[ids]).sum(-1), rtol=0, atol=1e-5)
    # the item tower on 3 ids, not on all: equal up to the float32 rounding of its kernels at another batch size
    np.testing.assert_allclose(loaded.item_embeddings([3, 0, 3]), items[[3, 0, 3]], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(loaded.item_ids(valid), ids)

    info = json.loads(open(os.path.join(exported["out"], "model.json")).read())
    assert info["retrieval"] == {"item_feature": "item", "items": "items.parquet", "rows": rows, "dim": 4}
    assert info["torchscript"] is None
    table = pq.read_table(os.path.join(exported["out"], "items.parquet"))
    assert table.column_names == ["item", "item_embedding"] and table.column("item").to_pylist() == list(range(rows))
    np.testing.assert_array_equal(np.array(table.column("item_embedding").to_pylist(), dtype=np.float32), items)


def test_the_pyfunc_model_takes_an_output_param(exported, valid):
    import mlflow
    import pandas
    from mlflow import MlflowClient

    from rayemb.serve.model import InferenceModel

    loaded = InferenceModel.load(exported["out"])
    client = MlflowClient(exported["uri"])
    (run,) = client.search_runs([client.get_experiment_by_name("task-export").experiment_id])
    mlflow.set_tracking_uri(exported["uri"])
    try:
        pyfunc = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
        df = valid.to_pandas()
        score = pyfunc.predict(df)
        users = pyfunc.predict(df.drop(columns=["item"]), params={"output": "user_embedding"})
        items = pyfunc.predict(pandas.DataFrame({"item": [5, 1]}), params={"output": "item_embedding"})
    finally:
        mlflow.set_tracking_uri("")
    sig = pyfunc.metadata.signature
    assert sig.params.to_dict() == [{"name": "output", "type": "string", "default": "score", "shape": None}]
    assert sig.outputs.input_names() == ["score", "user_embedding", "item_embedding"]
    assert list(score.columns) == ["score"] and list(users.columns) == ["user_embedding"]
    np.testing.assert_array_equal(score["score"].to_numpy(), loaded.predict(valid))
    assert isinstance(users["user_embedding"][0], list)  # a column of float lists
    np.testing.assert_array_equal(np.array(users["user_embedding"].tolist(), dtype=np.float32),
                                  loaded.user_embeddings(valid))
    np.testing.assert_array_equal(np.array(items["item_embedding"].tolist(), dtype=np.float32),
                                  loaded.item_embeddings([5, 1]))


def test_wrong_requests_name_the_input_and_the_fix(exported, valid):
    import pyarrow as pa

    from rayemb.errors import ConfigError, DataError
    from rayemb.serve.columns import check_output, output_table
    from rayemb.serve.model import InferenceModel

    loaded = InferenceModel.load(exported["out"])
    rows = loaded.schema.feature("item").num_embeddings
    with pytest.raises(ConfigError, match="retrieval models only.*Leave the output unset") as e:
        check_output("user_embedding", None)  # a ranking model
    assert e.value.category == "invalid_arguments"
    with pytest.raises(ConfigError, match=r"'vectors'.*\['score', 'user_embedding', 'item_embedding'\]"):
        output_table(loaded, valid, "vectors")
    with pytest.raises(DataError, match=r"lacks column\(s\) \['item'\]") as e:
        loaded.predict(valid.drop(["item"]))  # a pair score needs the item
    assert e.value.category == "missing_columns"
    with pytest.raises(DataError, match=rf"'item' has 1 id\(s\) outside \[0, {rows}\).*id_policy"):
        loaded.item_embeddings([0, rows])
    with pytest.raises(DataError, match="integers"):
        loaded.item_embeddings([1.5])
    with pytest.raises(DataError, match="'item' holds 1 null id"):
        output_table(loaded, pa.table({"item": pa.array([1, None], pa.int64())}), "item_embedding")
    nulled = valid.set_column(valid.column_names.index("item"), "item", pa.nulls(valid.num_rows, pa.int64()))
    with pytest.raises(DataError, match="'item' holds .* null id"):
        loaded.predict(nulled)
