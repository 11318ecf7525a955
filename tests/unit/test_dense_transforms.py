"""Dense transforms declared in schema.yaml: their maths, their parsing, their parameters, and that serving applies
what training applied.

Each kind's numpy apply is checked against its formula and the scripted torch module against the numpy apply;
a schema that declares none transforms exactly as before (``log1p(max(x, 0))``, bit for bit). The statistics
pass's moments merge exactly and fill ``standardize``'s parameters; a ``log1p`` column with negatives is a
warning; ``schema infer`` proposes ``standardize`` for it. A checkpoint of a model trained on a
``standardize`` column with negatives and a ``bucketize`` column, exported with ``rayemb export``, scores
(``InferenceModel``, the TorchScript form's ``forward_raw`` on raw values, the pyfunc model) what the model scores
on the training converter's batch, and every serving path computes the training batch's bucket ids exactly.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _dense import declare_transforms
from _tiny_checkpoint import write_checkpoint

from rayemb.data.schema import DatasetSchema
from rayemb.data.transforms import DenseTransform, DenseTransforms
from rayemb.errors import DataError

X = np.array([[3.0, -2.0, 7.5, -0.5, 0.25],
              [0.0, 4.0, -9.0, 2.0, 1.0],
              [-1.0, 10.0, 0.5, 0.0, 100.0]], np.float32)
COLUMNS = ["a", "b", "c", "d", "e"]


def _schema(**keys):
    d = {"label": "label", "dense": COLUMNS, "sparse": [{"name": "C1", "num_embeddings": 10}], **keys}
    return DatasetSchema.from_dict(d)


def test_each_kind_computes_its_formula():
    schema = _schema(dense_transforms={"b": {"standardize": {"mean": 4.0, "std": 2.0}}, "c": {"clip": [-1, 5]},
                                       "d": "identity", "e": {"standardize": {"mean": 3.0, "std": 0.0}}})
    got = DenseTransforms.of(schema).apply(X.copy())
    np.testing.assert_array_equal(got[:, 0], np.log1p(np.maximum(X[:, 0], 0)))  # the default
    np.testing.assert_allclose(got[:, 1], (X[:, 1] - 4.0) / 2.0, rtol=1e-6)
    np.testing.assert_array_equal(got[:, 2], np.clip(X[:, 2], -1, 5))
    np.testing.assert_array_equal(got[:, 3], X[:, 3])
    np.testing.assert_array_equal(got[:, 4], X[:, 4] - 3.0)  # a constant column (std 0) is only centred


def test_a_schema_naming_no_transform_is_log1p_of_the_clipped_value_as_before():
    schema = _schema()
    assert schema.to_dict() == {"schema_version": 1, "label": "label", "dense": COLUMNS,
                                "sparse": [{"name": "C1", "num_embeddings": 10, "multi_hot": False}]}
    np.testing.assert_array_equal(DenseTransforms.of(schema).apply(X.copy()), np.log1p(np.maximum(X, 0.0)))


def test_the_scripted_module_computes_what_numpy_computes():
    import torch

    schema = _schema(dense_transform="identity",
                     dense_transforms={"a": "log1p", "b": {"standardize": {"mean": 1.5, "std": 3.0}},
                                       "c": {"clip": [-1, 5]}})
    transforms = DenseTransforms.of(schema)
    scripted = torch.jit.script(transforms.module())
    np.testing.assert_allclose(scripted(torch.from_numpy(X.copy())).numpy(), transforms.apply(X.copy()),
                               rtol=1e-6, atol=1e-7)
    assert {n for n, _ in scripted.named_buffers()} == {"lo", "hi", "log", "shift", "scale", "boundaries",
                                                        "bucket_max"}


def test_the_transform_keys_round_trip_and_the_default_applies_to_unnamed_columns():
    schema = _schema(dense_transform="standardize", dense_transforms={"d": {"clip": [0, 1]}, "a": "log1p"})
    assert DatasetSchema.from_dict(schema.to_dict()) == schema
    assert [schema.dense_transform_of(c).kind for c in COLUMNS] == ["log1p", "standardize", "standardize", "clip",
                                                                   "standardize"]
    assert [t.column for t in schema.dense_transforms] == ["a", "d"]  # schema order


@pytest.mark.parametrize("keys, words", [
    ({"dense_transforms": {"a": "log"}}, ["'a'", "unknown kind", "standardize"]),
    ({"dense_transforms": {"a": {"clip": [5, 1]}}}, ["'a'", "lo must not exceed hi"]),
    ({"dense_transforms": {"a": {"clip": 3}}}, ["'a'", "two bounds"]),
    ({"dense_transforms": {"a": {"clip": [0, "x"]}}}, ["'a'", "finite number"]),
    ({"dense_transforms": {"a": {"standardize": {"mean": 1}}}}, ["'a'", "is not a transform"]),
    ({"dense_transforms": {"a": {"standardize": {"mean": 1, "std": -1}}}}, ["'a'", "std must be >= 0"]),
    ({"dense_transforms": {"zz": "identity"}}, ["['zz']", "not dense columns"]),
    ({"dense_transforms": ["a"]}, ["dense_transforms must map"]),
    ({"dense_transform": {"standardize": {"mean": 0, "std": 1}}}, ["per column", "dense_transforms"]),
])
def test_a_bad_declaration_names_the_column_and_the_fix(keys, words):
    with pytest.raises(DataError) as e:
        _schema(**keys)
    assert e.value.category == "invalid_schema"
    for w in words:
        assert w in e.value.message


def test_standardize_without_its_parameters_is_refused_before_any_batch():
    from rayemb.data.batching import BatchConverter

    with pytest.raises(DataError) as e:
        BatchConverter(_schema(dense_transforms={"b": "standardize"}))
    assert e.value.category == "invalid_schema" and "['b']" in e.value.message
    assert "with_dense_params" in e.value.message


def test_moments_merge_exactly_whatever_the_split_of_the_rows():
    from rayemb.data.checks import DenseMoments

    x = np.random.default_rng(0).normal(3.0, 2.0, 1001)
    merged = DenseMoments.of(x[:7]) + DenseMoments.of(x[7:500]) + DenseMoments() + DenseMoments.of(x[500:])
    assert merged.count == 1001 and merged.min == x.min() and merged.max == x.max()
    assert merged.mean == pytest.approx(x.mean(), rel=1e-12) and merged.std == pytest.approx(x.std(), rel=1e-12)
    assert DenseMoments.from_dict(json.loads(json.dumps(merged.to_dict()))) == merged


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A generated dataset whose I1 goes below 0 (standardize), I2 is clipped and I3 (integer counts, many on a
    boundary) bucketized; I4..I13 log1p by default."""
    from rayemb.data.synthetic import SyntheticSpec, generate

    out = str(tmp_path_factory.mktemp("dense_transforms"))
    generate(SyntheticSpec(rows=600, num_tables=3, multi_hot=False, seed=5, num_signal_tables=2,
                           cardinalities=[40, 30, 20], valid_fraction=0.25), out)
    return declare_transforms(out, {"I1": "standardize", "I2": {"clip": [0.0, 4.0]}, "I3": {"bucketize": [1, 3, 8]}},
                              {"I1": -5.0})


def test_the_statistics_pass_gives_standardize_its_mean_and_std(dataset):
    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import parquet_files
    from rayemb.data.stats import compute_stats
    from rayemb.data.stats_types import DatasetStats

    stats = compute_stats(dataset, in_process=True)
    assert DatasetStats.from_dict(json.loads(json.dumps(stats.to_dict()))).to_dict() == stats.to_dict()
    train = pq.read_table(parquet_files(dataset, "train"))
    i1 = train.column("I1").to_numpy().astype(np.float64)
    m = stats.values.dense_moments["I1"]
    assert m.count == train.num_rows and m.min < 0 and m.mean == pytest.approx(i1.mean(), rel=1e-9)
    schema = DatasetSchema.load(dataset).with_dense_params(stats)
    t = schema.dense_transform_of("I1")
    assert (t.kind, t.mean, t.std) == ("standardize", m.mean, m.std)
    dense = BatchConverter(schema)(train).dense.numpy()
    assert abs(dense[:, 0].mean()) < 1e-5 and dense[:, 0].std() == pytest.approx(1.0, rel=1e-5)
    assert dense[:, 1].max() <= 4.0 and (dense[:, 1] == 4.0).any()


def test_a_log1p_column_with_negatives_is_a_warning_naming_it(dataset):
    from rayemb.data.checks import dense_transform_warnings
    from rayemb.data.stats import compute_stats

    stats = compute_stats(dataset, in_process=True)
    declared = DatasetSchema.load(dataset)
    assert dense_transform_warnings(stats.values, declared) == []
    (line,) = dense_transform_warnings(stats.values, _undeclared(declared))
    assert "'I1'" in line and "negative" in line and "standardize" in line


def _undeclared(schema):
    import dataclasses

    return dataclasses.replace(schema, dense_transforms=())


def test_schema_infer_proposes_standardize_for_a_negative_column_and_says_why(dataset, tmp_path):
    from rayemb.data.infer import infer_schema

    data = str(tmp_path / "mine")
    for split in ("train", "valid"):
        os.makedirs(os.path.join(data, split))
        table = pq.read_table(os.path.join(dataset, split))
        ratio = pa.array(np.linspace(0, 1, table.num_rows, dtype=np.float32))
        pq.write_table(table.append_column("ratio", ratio), os.path.join(data, split, "part-00000.parquet"))
    inferred = infer_schema(data)
    kinds = {c: inferred.schema.dense_transform_of(c).kind for c in inferred.schema.dense}
    assert kinds["I1"] == "standardize" and kinds["ratio"] == "identity" and kinds["I5"] == "log1p"
    rules = {c.name: c.rule for c in inferred.columns}
    assert "negatives: log1p would read them as 0 -> standardize" in rules["I1"]
    assert "heavy tail" in rules["I5"] and rules["ratio"].endswith("-> identity")
    written = DatasetSchema.from_dict(__import__("yaml").safe_load(inferred.yaml_text()))
    assert written == inferred.schema and set(inferred.schema.to_dict()["dense_transforms"]) == {"I1", "ratio"}


def test_a_checkpoint_without_the_entry_was_trained_on_log1p():
    from rayemb.data.transforms import checkpoint_entry, transforms_of_checkpoint

    schema = _schema(dense_transforms={"b": {"standardize": {"mean": 1.0, "std": 2.0}}})
    assert {c: t.kind for c, t in transforms_of_checkpoint({}, COLUMNS).items()} == dict.fromkeys(COLUMNS, "log1p")
    recorded = transforms_of_checkpoint(checkpoint_entry(schema), COLUMNS)
    assert recorded["b"] == DenseTransform("b", "standardize", mean=1.0, std=2.0)
    with pytest.raises(DataError) as e:
        transforms_of_checkpoint(checkpoint_entry(schema), COLUMNS[:3])
    assert e.value.category == "bad_checkpoint"


def test_the_exported_model_scores_what_the_model_scores_on_the_training_batch(dataset, tmp_path, monkeypatch):
    import mlflow
    import torch

    from rayemb.checkpoint.export import unsharded_state
    from rayemb.cli import main
    from rayemb.config import config_from_dict
    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import parquet_files
    from rayemb.data.stats import compute_stats
    from rayemb.data.transforms import checkpoint_entry
    from rayemb.serve.model import InferenceModel, inference_state, model_config, sigmoid

    monkeypatch.chdir(tmp_path)
    cfg = config_from_dict({"name": "dense-export", "data": {"path": dataset},
                            "model": {"embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1]},
                            "tracking": {"output_dir": str(tmp_path / "runs"), "experiment": "dense-export"}})
    (tmp_path / "job.yaml").write_text(cfg.to_yaml())
    trained = DatasetSchema.load(dataset).with_dense_params(compute_stats(dataset, in_process=True))
    checkpoint = write_checkpoint(str(tmp_path / "ckpt"), trained, model_config(cfg), seed=1)
    meta_path = os.path.join(checkpoint, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    with open(meta_path, "w") as f:  # what the training loop records (meta.json is not among its hashed files)
        json.dump({**meta, **checkpoint_entry(trained)}, f)

    # the training side: the checkpoint's model on the batch the training converter makes
    model = InferenceModel.from_state(inference_state(unsharded_state(checkpoint), trained, model_config(cfg)),
                                      trained, model_config(cfg)).model
    valid = pq.read_table(parquet_files(dataset, "valid"))
    assert pa.compute.min(valid.column("I1")).as_py() < 0
    batch = BatchConverter(trained)(valid)
    with torch.no_grad():
        want = model(batch.dense, batch.sparse).numpy()
    assert want.std() > 1e-3
    assert trained.bucketized == ["I3"] and "I3" not in trained.dense and batch.sparse.keys()[-1] == "I3"
    ids = batch.sparse["I3"].values().numpy()
    i3 = valid.column("I3").to_numpy(zero_copy_only=False).astype(np.float32)
    np.testing.assert_array_equal(ids, np.searchsorted(np.float32([1, 3, 8]), i3, side="right"))
    assert set(ids.tolist()) == {0, 1, 2, 3} and np.isin(i3, [1, 3, 8]).any()  # every bucket, values on boundaries

    out = tmp_path / "model"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["export", "--checkpoint", checkpoint, "--config", str(tmp_path / "job.yaml"), "--out", str(out),
                 "--tracking-uri", uri, "--experiment", "dense-export"]) == 0
    info = json.loads((out / "model.json").read_text())
    assert info["schema"]["dense_transforms"]["I1"] == {
        "standardize": {"mean": trained.dense_transform_of("I1").mean, "std": trained.dense_transform_of("I1").std}}
    assert info["schema"]["dense_transforms"]["I3"] == {"bucketize": [1.0, 3.0, 8.0]}
    loaded = InferenceModel.load(str(out))
    np.testing.assert_allclose(loaded.predict(valid), sigmoid(want), rtol=0, atol=1e-6)
    # the serving converter (InferenceModel, the pyfunc, `rayemb predict`) buckets as training did, from pandas too
    assert loaded.schema == trained
    served = loaded.converter(loaded.rows(valid.to_pandas()))
    np.testing.assert_array_equal(served.sparse["I3"].values().numpy(), ids)

    import torchrec  # noqa: F401 - the KJT's FBGEMM ops, for the scripted form

    scripted = torch.jit.load(str(out / "model.torchscript.pt"))
    # forward_raw: the raw dense columns, then the bucketized ones; the KJT without the bucketized features
    raw = np.stack([valid.column(c).to_numpy().astype(np.float32) for c in [*trained.dense, *trained.bucketized]],
                   axis=1)
    others, _ = batch.sparse.split([len(trained.sparse) - 1, 1])
    with torch.no_grad():
        np.testing.assert_array_equal(scripted.dense_transform.bucketize(torch.from_numpy(raw[:, -1:]))[:, 0].numpy(),
                                      ids)
        np.testing.assert_allclose(scripted.forward_raw(torch.from_numpy(raw), others).numpy(), want,
                                   rtol=0, atol=1e-5)
        np.testing.assert_allclose(scripted(batch.dense, batch.sparse).numpy(), want, rtol=0, atol=1e-5)

    mlflow.set_tracking_uri(uri)
    try:
        client = mlflow.MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("dense-export").experiment_id])
        got = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model").predict(valid.to_pandas())
    finally:
        mlflow.set_tracking_uri("")
    np.testing.assert_allclose(got["prediction"].to_numpy(), sigmoid(want), rtol=0, atol=1e-6)
