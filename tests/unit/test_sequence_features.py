"""Sequence features in the job: schema entries, the synthetic history column, the batch KJT, the DLRM and its plan.

The distributed equality of the sharded EmbeddingCollection is tests/dist/test_sequence_equivalence.py;
the whole job (Ray, 2 gloo workers) is tests/ray/test_sequence_job.py; AUC with and without the tower is
jobs/bench/sequence_auc.py.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rayemb.config import ModelConfig
from rayemb.data.batching import BatchConverter
from rayemb.data.schema import DatasetSchema, SparseFeature, check_parquet_columns
from rayemb.data.synthetic import HISTORY_CATEGORIES, SyntheticSpec, generate
from rayemb.errors import ConfigError, DataError


def _schema_dict(**history):
    h = {"name": "H1", "num_embeddings": 10, "sequence": True, "max_length": 3, "target": "C1", **history}
    return {"label": "label", "dense": ["I1"],
            "sparse": [{"name": "C1", "num_embeddings": 10, "multi_hot": False}, h]}


# ---- schema ---- #


def test_schema_keeps_sequence_features_apart_and_round_trips():
    s = DatasetSchema.from_dict(_schema_dict())
    assert s.sparse_names == ["C1"] and s.sequence_names == ["H1"]
    assert (s.sequence[0].max_length, s.sequence[0].target) == (3, "C1")
    again = DatasetSchema.from_dict(s.to_dict())
    assert again == s
    # a pooled entry keeps exactly its three keys (schema.yaml of existing datasets stays the same)
    assert s.to_dict()["sparse"][0] == {"name": "C1", "num_embeddings": 10, "multi_hot": False}


@pytest.mark.parametrize("change, words", [
    ({"max_length": None}, "needs max_length"),
    ({"max_length": 0}, "needs max_length"),
    ({"multi_hot": True}, "both multi_hot and sequence"),
    ({"target": "C9"}, "not a pooled sparse feature"),
    ({"target": "H1"}, "names itself"),
    ({"sequence": False}, "but not sequence: true"),
    ({"window": 4}, "unknown key"),
])
def test_schema_rejects_bad_sequence_entries_with_the_fix(change, words):
    d = _schema_dict(**change)
    d["sparse"][1] = {k: v for k, v in d["sparse"][1].items() if v is not None}
    with pytest.raises(DataError, match=words):
        DatasetSchema.from_dict(d)


def test_parquet_check_wants_a_list_column_for_a_sequence(tmp_path):
    s = DatasetSchema.from_dict(_schema_dict())
    os.makedirs(tmp_path / "train")
    base = {"label": pa.array([1.0]), "I1": pa.array([1.0]), "C1": pa.array([1], pa.int64())}
    pq.write_table(pa.table({**base, "H1": pa.array([1], pa.int64())}), tmp_path / "train" / "part-0.parquet")
    with pytest.raises(DataError, match=r"'H1'.*list<int64> \(sequence: true\)"):
        check_parquet_columns(s, str(tmp_path), "train")
    pq.write_table(pa.table({**base, "H1": pa.array([[1, 2]], pa.list_(pa.int64()))}),
                   tmp_path / "train" / "part-0.parquet")
    check_parquet_columns(s, str(tmp_path), "train")


# ---- synthetic history ---- #


def _digest(directory: str) -> str:
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(directory)):
        for f in sorted(files):
            h.update(f.encode())
            h.update(open(os.path.join(root, f), "rb").read())
    return h.hexdigest()


@pytest.fixture(scope="module")
def history_data(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hist"))
    spec = SyntheticSpec(rows=30_000, num_tables=4, seed=3, sequence_length=6, chunk_rows=10_000)
    generate(spec, out)
    return spec, out


def test_generator_adds_a_history_column_deterministically(history_data, tmp_path):
    spec, out = history_data
    schema = DatasetSchema.load(out)
    assert schema.sparse_names == ["C1", "C2", "C3", "C4"] and schema.sequence_names == ["H1"]
    h1 = schema.sequence[0]
    assert (h1.num_embeddings, h1.max_length, h1.target) == (schema.feature("C1").num_embeddings, 6, "C1")
    t = pq.read_table(os.path.join(out, "train"))
    assert t.schema.field("H1").type == pa.list_(pa.int64())
    lengths = np.array([len(x) for x in t.column("H1").to_pylist()])
    ids = np.concatenate([np.asarray(x) for x in t.column("H1").to_pylist() if x])
    assert lengths.min() == 0 and lengths.max() == 9 and (lengths > 6).mean() > 0.2  # some are cut by max_length
    assert ids.min() >= 0 and ids.max() < h1.num_embeddings
    generate(spec, str(tmp_path / "again"))
    assert _digest(str(tmp_path / "again")) == _digest(out)


def test_generator_without_history_is_unchanged_by_the_option_code(tmp_path):
    """sequence_length=0 writes what the generator wrote before the option (sha256 of the files, pinned)."""
    generate(SyntheticSpec(rows=3000, num_tables=3, seed=11, chunk_rows=1000), str(tmp_path))
    got = {f: hashlib.sha256(open(tmp_path / "train" / f, "rb").read()).hexdigest()[:16]
           for f in sorted(os.listdir(tmp_path / "train"))}
    assert "H1" not in open(tmp_path / "schema.yaml").read()
    assert got == PINNED_NO_HISTORY, got


#: sha256[:16] of SyntheticSpec(rows=3000, num_tables=3, seed=11, chunk_rows=1000)'s train parts, written by the
#: generator at the commit before the history option (checked against `git show f6a3c1a:rayemb/data/synthetic.py`)
PINNED_NO_HISTORY = {'part-00000.parquet': 'f5b8bf5084faf6ce', 'part-00001.parquet': '9701be2c6db45821',
                     'part-00002.parquet': '3e34799b9f81e06f'}


def test_history_carries_label_signal_that_c1_alone_does_not(history_data):
    _, out = history_data
    t = pq.read_table(os.path.join(out, "train"))
    y = t.column("label").to_numpy()
    c1 = t.column("C1").to_numpy() % HISTORY_CATEGORIES
    hist = t.column("H1").to_pylist()
    # the share of the 6 most recent history items in C1's category (what the label's extra term uses)
    share = np.array([np.mean(np.asarray(h[-6:]) % HISTORY_CATEGORIES == c) if h else np.nan
                      for h, c in zip(hist, c1)])
    matched, unmatched = y[share > 0.5].mean(), y[share < 0.25].mean()
    assert matched - unmatched > 0.25, (matched, unmatched)
    # the extra term says nothing about C1's category alone: its mean share is alike for every category
    # (C1's own hidden per-id weights still make some categories click more, as every signal table does)
    by_category = [np.nanmean(share[c1 == k]) for k in range(HISTORY_CATEGORIES)]
    assert max(by_category) - min(by_category) < 0.05, by_category


def test_generator_rejects_history_with_multi_hot():
    with pytest.raises(DataError, match="drop --multi-hot or --sequence-length"):
        SyntheticSpec(rows=10, multi_hot=True, sequence_length=4)


# ---- batch ---- #


def _batch_table():
    return pa.table({
        "label": pa.array([1.0, 0.0, 1.0], pa.float32()), "I1": pa.array([1.0, 2.0, 3.0], pa.float32()),
        "C1": pa.array([4, 9, 0], pa.int64()),
        "H1": pa.array([[1, 2, 3, 4, 5], [], None], pa.list_(pa.int64())),
    })


def test_batch_builds_a_separate_truncated_sequence_kjt():
    s = DatasetSchema.from_dict(_schema_dict())
    b = BatchConverter(s, sequence=True)(_batch_table())
    assert b.sparse.keys() == ["C1"] and b.sparse.values().tolist() == [4, 9, 0]
    assert b.sequence.keys() == ["H1"]
    assert b.sequence.lengths().tolist() == [3, 0, 0]  # latest 3 kept; empty and null lists are empty
    assert b.sequence.values().tolist() == [3, 4, 5]
    assert BatchConverter(s)(_batch_table()).sequence is None


def test_batch_applies_the_id_policy_to_sequences():
    s = DatasetSchema.from_dict(_schema_dict())
    t = _batch_table().set_column(3, "H1", pa.array([[1, 12], [], [3]], pa.list_(pa.int64())))
    with pytest.raises(DataError, match=r"'H1'.*outside \[0, 10\)"):
        BatchConverter(s, sequence=True)(t)
    assert BatchConverter(s, "hash", sequence=True)(t).sequence.values().tolist() == [1, 2, 3]


def test_batch_without_sequence_features_refuses_a_sequence_request():
    s = DatasetSchema(label="label", dense=("I1",), sparse=(SparseFeature("C1", 10),))
    with pytest.raises(DataError, match="sequence_tower: none"):
        BatchConverter(s, sequence=True)


# ---- model and plan ---- #


def test_model_config_checks_the_tower():
    assert ModelConfig().sequence_tower == "none"
    with pytest.raises(ConfigError, match="model.sequence_tower"):
        ModelConfig(sequence_tower="max")


@pytest.mark.parametrize("tower", ["mean", "attention"])
def test_dlrm_with_a_history_tower_feeds_one_more_vector(tower):
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rayemb.contract.tables import sequence_features, sequence_module, table_configs
    from rayemb.models.dlrm import DLRM

    s = DatasetSchema.from_dict(_schema_dict())
    cfg = ModelConfig(embedding_dim=8, bottom_mlp=(8,), top_mlp=(4, 1), sequence_tower=tower)
    torch.manual_seed(0)
    model = DLRM(EmbeddingBagCollection(tables=table_configs(s, 8)), ["C1"], 1, [8], [4, 1],
                 sequence=sequence_module(cfg, s), sequence_features=sequence_features(cfg, s),
                 sequence_targets={"H1": "C1"}, sequence_tower=tower)
    assert "sequence.embeddings.H1.weight" in model.state_dict()
    assert model.over_arch.model[0]._mlp[0]._linear.in_features == 8 + 3  # 2 vectors + dense: 3 pairwise/self dots
    b = BatchConverter(s, sequence=True)(_batch_table())
    out = model(b.dense, b.sparse, b.sequence)
    assert out.shape == (3,) and torch.isfinite(out).all()
    out.sum().backward()
    grad = model.sequence.embeddings["H1"].weight.grad
    assert grad[[3, 4, 5]].abs().sum() > 0 and grad[[0, 1, 2]].abs().sum() == 0  # truncated ids get no gradient
    with pytest.raises(ValueError, match="pass their KJT"):
        model(b.dense, b.sparse)


def test_sequence_features_explain_missing_pieces():
    from rayemb.contract.tables import sequence_features

    plain = DatasetSchema(label="label", dense=("I1",), sparse=(SparseFeature("C1", 10),))
    with pytest.raises(ConfigError, match="declares no sequence feature"):
        sequence_features(ModelConfig(sequence_tower="mean"), plain)
    d = _schema_dict()
    del d["sparse"][1]["target"]
    untargeted = DatasetSchema.from_dict(d)
    with pytest.raises(ConfigError, match="declare no `target:`"):
        sequence_features(ModelConfig(sequence_tower="attention"), untargeted)
    assert [f.name for f in sequence_features(ModelConfig(sequence_tower="mean"), untargeted)] == ["H1"]
    assert sequence_features(ModelConfig(), untargeted) == []


@pytest.mark.parametrize("rows, dim", [(10, 16), (2_000_000, 64)])
def test_sequence_plan_uses_allowed_types_and_equal_width_column_shards(rows, dim):
    from rayemb.config import load_config
    from rayemb.planner.topology import described_topology
    from rayemb.train.sharding import SEQUENCE_SHARDING_TYPES, sequence_plan, sequence_summary

    d = _schema_dict(num_embeddings=rows)
    d["sparse"][0]["num_embeddings"] = rows
    s = DatasetSchema.from_dict(d)
    cfg = load_config("jobs/configs/synth_small.yaml", [f"model.embedding_dim={dim}", f"model.bottom_mlp=[{dim}]",
                                                        "model.sequence_tower=attention"])
    topo = described_topology(2, gpus_per_node=2, compute_device="cpu", ddr_gib=0.5)
    plan = sequence_plan(cfg, s, topo, 1024)
    summary = sequence_summary(plan)
    assert list(summary) == ["H1"]
    assert summary["H1"]["sharding_type"] in SEQUENCE_SHARDING_TYPES
    assert len(summary["H1"]["shard_widths"]) == 1  # every shard of the collection has one width
    if rows > 1000:  # 2M x 64 fp32 rows (+ state) do not fit one rank's 0.5 GiB: split across both ranks
        assert summary["H1"]["ranks"] == [0, 1] and summary["H1"]["sharding_type"] != "table_wise"
    plain = load_config("jobs/configs/synth_small.yaml", [])
    assert sequence_plan(plain, s, topo, 1024) is None
