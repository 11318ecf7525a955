"""``bucketize``: a dense column declared ``{bucketize: [b0, ..., bk]}`` becomes a sparse feature of its own.

The schema is rewritten where it is built (the column leaves ``dense``, a one-hot feature of ``k+1`` rows closes
``sparse``), so the converter, the statistics pass and the checkpoint entry see a plain sparse feature; the bucket
ids (``searchsorted(b, x, side='right')``, nulls read as 0) are equal on the numpy path and in the scripted module,
edge values included; a bad declaration is one ``DataError`` naming the column and the fix.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pytest

from rayemb.data.schema import DatasetSchema
from rayemb.data.transforms import DenseTransforms
from rayemb.errors import DataError

BOUNDS = [-1.0, 0.0, 2.5, 10.0]


def _schema(transforms=None, sparse=None, **keys):
    d = {"label": "label", "dense": ["a", "age", "b"], "sparse": sparse or [{"name": "C1", "num_embeddings": 10}],
         "dense_transforms": {"age": {"bucketize": BOUNDS}} if transforms is None else transforms, **keys}
    return DatasetSchema.from_dict(d)


def test_the_column_leaves_dense_and_closes_sparse_as_a_feature_of_k_plus_1_rows():
    schema = _schema({"age": {"bucketize": [18, 25, 35, 50], "embedding_dim": 8}, "a": "identity"})
    assert schema.dense == ("a", "b") and schema.sparse_names == ["C1", "age"] and schema.bucketized == ["age"]
    feat = schema.feature("age")
    assert (feat.num_embeddings, feat.multi_hot, feat.bucketize) == (5, False, (18.0, 25.0, 35.0, 50.0))
    assert schema.table_dims(4) == {"C1": 4, "age": 8} and schema.pooled_features == ["C1", "age"]
    assert [t.column for t in schema.dense_transforms] == ["a"]
    assert DenseTransforms.of(schema).columns == ("a", "b")
    # written back as schema.yaml says it, read back equal; rebuilding the rewritten schema changes nothing
    d = schema.to_dict()
    assert d["dense"] == ["a", "b", "age"] and d["sparse"] == [{"name": "C1", "num_embeddings": 10,
                                                                 "multi_hot": False}]
    assert d["dense_transforms"] == {"a": "identity", "age": {"bucketize": [18.0, 25.0, 35.0, 50.0],
                                                              "embedding_dim": 8}}
    assert DatasetSchema.from_dict(json.loads(json.dumps(d))) == schema
    assert dataclasses.replace(schema) == schema


def _table(age):
    n = len(age)
    return pa.table({"label": np.zeros(n, np.float32), "a": np.ones(n, np.float32), "age": pa.array(age, pa.float32()),
                     "b": np.zeros(n, np.float32), "C1": np.arange(n, dtype=np.int64) % 10})


def test_edge_values_fall_in_the_bucket_searchsorted_right_gives_on_both_paths():
    import torch

    from rayemb.data.batching import BatchConverter

    #       below b0, on b0, between, on b1, null (read as 0: on b1), on b2, on the last, above the last
    age = [-7.0, -1.0, -0.5, 0.0, None, 2.5, 10.0, 1e30]
    want = [0, 1, 1, 2, 2, 3, 4, 4]
    schema = _schema()
    conv = BatchConverter(schema)
    batch = conv(_table(age))
    assert batch.sparse.keys() == ["C1", "age"] and batch.dense.shape == (len(age), 2)
    got = batch.sparse["age"]
    assert got.values().tolist() == want and got.lengths().tolist() == [1] * len(age)

    scripted = torch.jit.script(conv.dense_transforms.module())
    raw = torch.tensor([[0.0 if x is None else x] for x in age], dtype=torch.float32)
    assert scripted.bucketize(raw)[:, 0].tolist() == want
    assert scripted.bucketize(torch.tensor([[float("inf")], [float("-inf")]]))[:, 0].tolist() == [4, 0]


def test_nan_in_a_bucketized_column_is_refused_naming_it():
    from rayemb.data.batching import BatchConverter

    with pytest.raises(DataError) as e:
        BatchConverter(_schema())(_table([1.0, float("nan")]))
    assert e.value.category == "invalid_values" and "'age'" in e.value.message and "NaN" in e.value.message


@pytest.mark.parametrize("transforms, sparse, words", [
    ({"age": {"bucketize": []}}, None, ["'age'", "non-empty list"]),
    ({"age": {"bucketize": 3}}, None, ["'age'", "non-empty list"]),
    ({"age": {"bucketize": [1, 1, 2]}}, None, ["'age'", "strictly increasing"]),
    ({"age": {"bucketize": [5, 2]}}, None, ["'age'", "strictly increasing"]),
    ({"age": {"bucketize": [1, "x"]}}, None, ["'age'", "finite number"]),
    ({"age": {"bucketize": [1, True]}}, None, ["'age'", "finite number"]),
    ({"age": {"bucketize": [1, float("inf")]}}, None, ["'age'", "finite number"]),
    ({"age": {"bucketize": [1, 2], "dim": 8}}, None, ["'age'", "only embedding_dim"]),
    ({"age": {"bucketize": [1, 2], "embedding_dim": 6}}, None, ["'age'", "multiple of 4"]),
    ({"zz": {"bucketize": [1, 2]}}, None, ["'zz'", "not a dense column"]),
    ({"age": {"bucketize": [1, 2]}}, [{"name": "C1", "num_embeddings": 10}, {"name": "age", "num_embeddings": 4}],
     ["'age'", "also a sparse feature", "Drop 'age' from the sparse list"]),
])
def test_a_bad_bucketize_names_the_column_and_the_fix(transforms, sparse, words):
    with pytest.raises(DataError) as e:
        _schema(transforms, sparse)
    assert e.value.category == "invalid_schema"
    for w in words:
        assert w in e.value.message


def test_bucketize_as_the_default_of_every_column_is_refused():
    with pytest.raises(DataError) as e:
        _schema({}, dense_transform={"bucketize": [1, 2]})
    assert e.value.category == "invalid_schema" and "per column" in e.value.message


def test_a_bucketize_entry_in_the_sparse_list_is_refused():
    with pytest.raises(DataError) as e:
        _schema({}, [{"name": "C1", "num_embeddings": 10}, {"name": "x", "num_embeddings": 3, "bucketize": [1, 2]}])
    assert "unknown key" in e.value.message and "bucketize" in e.value.message


def test_the_statistics_count_bucket_ids_and_the_checkpoint_records_the_boundaries(tmp_path):
    import pyarrow.parquet as pq

    from rayemb.data.schema import load_checked
    from rayemb.data.stats import compute_stats
    from rayemb.data.transforms import checkpoint_entry, transforms_of_checkpoint

    schema = _schema()
    rng = np.random.default_rng(0)
    for split, n in (("train", 400), ("valid", 100)):
        (tmp_path / split).mkdir()
        age = rng.normal(3.0, 6.0, n).astype(np.float32)  # every bucket, nulls (read as 0) too
        table = _table([None if i % 10 == 0 else float(x) for i, x in enumerate(age)])
        pq.write_table(table, tmp_path / split / "part-00000.parquet")
    schema.save(str(tmp_path))
    assert load_checked(str(tmp_path)) == schema  # a float32 column passes as the bucketized feature's
    stats = compute_stats(str(tmp_path), in_process=True, exact=True)
    t = stats.tables["age"]
    train = pq.read_table(tmp_path / "train")
    ids = np.searchsorted(np.float32(BOUNDS), np.nan_to_num(train.column("age").to_numpy(zero_copy_only=False)
                                                            .astype(np.float32)), side="right")
    assert (t.num_embeddings, t.values, t.nulls, t.invalid, t.min_id, t.max_id) == (5, 400, 0, 0, 0, 4)
    assert dict(t.heavy_hitters.tolist()) == {i: int((ids == i).sum()) for i in range(5)}

    entry = checkpoint_entry(schema)
    assert entry["dense_transforms"]["age"] == {"bucketize": BOUNDS}
    assert set(transforms_of_checkpoint(entry, schema.dense, {"age": BOUNDS})) == {"a", "b"}
    with pytest.raises(DataError) as e:
        transforms_of_checkpoint(entry, schema.dense, {"age": [-1.0, 0.0, 2.5, 11.0]})
    assert e.value.category == "bad_checkpoint" and "'age'" in e.value.message


def test_an_inferred_schema_with_a_bucketized_column_writes_and_reads_back():
    import yaml

    from rayemb.data.infer import ColumnDecision, InferredSchema
    from rayemb.data.schema import SparseFeature
    from rayemb.data.transforms import DenseTransform

    # built as `schema infer` builds its schema, with a transform it never proposes itself
    schema = DatasetSchema(label="label", dense=("a", "age"), sparse=(SparseFeature("C1", 10),),
                           dense_transforms=(DenseTransform("age", "bucketize", boundaries=(1.0, 2.0)),))
    assert schema.dense == ("a",) and schema.feature("age").num_embeddings == 3
    columns = [ColumnDecision(c, "dense", "by hand") for c in ("a", "age")]
    text = InferredSchema(schema, columns, {"train": 3}, []).yaml_text()
    assert DatasetSchema.from_dict(yaml.safe_load(text)) == schema
