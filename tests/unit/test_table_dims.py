"""Per-table embedding dims and tables shared by two features: schema.yaml entries and their refusals, the
shared table's statistics (the union of its features' ids), its one TorchRec config, the planner's specs, the
hybrid module's pooled vectors and the shipped models over vectors of unequal widths.

Training, resharding 2 -> 3 and export of such a schema: tests/dist/test_table_dims_job.py.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from rayemb.config import ModelConfig
from rayemb.data.schema import DatasetSchema
from rayemb.errors import ConfigError, DataError

ITEM = {"name": "item", "num_embeddings": 20, "embedding_dim": 8}
USER = {"name": "user", "num_embeddings": 10}
HISTORY = {"name": "history", "multi_hot": True, "table": "item"}


def _schema(*sparse):
    return DatasetSchema.from_dict({"label": "y", "dense": ["x"], "sparse": list(sparse or (ITEM, USER, HISTORY))})


# ---- schema.yaml ---- #


def test_a_feature_reads_another_features_table_with_its_rows_and_dim():
    s = _schema()
    assert s.sparse_names == ["item", "user", "history"]
    assert s.table_names == ["item", "user"] and s.table_features("item") == ["item", "history"]
    assert s.table_of("history") == "item" and s.table_of("user") == "user"
    assert s.feature("history").num_embeddings == 20  # taken from its table's entry
    assert s.table_dims(4) == {"item": 8, "user": 4}
    assert s.pooled_features == ["item", "history", "user"] and s.feature_dims(4) == (8, 8, 4)
    written = s.to_dict()["sparse"]
    assert written[0]["embedding_dim"] == 8 and written[2]["table"] == "item" and "table" not in written[1]
    assert DatasetSchema.from_dict(yaml.safe_load(yaml.safe_dump(s.to_dict()))) == s


def test_a_schema_without_the_new_keys_writes_as_it_did():
    s = _schema(USER, {"name": "c", "num_embeddings": 5})
    assert s.to_dict()["sparse"] == [{"name": "user", "num_embeddings": 10, "multi_hot": False},
                                     {"name": "c", "num_embeddings": 5, "multi_hot": False}]
    assert s.pooled_features == s.sparse_names and s.table_names == s.sparse_names


@pytest.mark.parametrize("sparse, says", [
    ((ITEM, {"name": "h", "table": "nope", "num_embeddings": 20}),
     ["'h'", "table: 'nope'", "not a pooled sparse feature", "drop `table:`"]),
    ((ITEM, {"name": "b", "table": "item"}, {"name": "c", "table": "b"}),
     ["c -> b -> item", "Write `table: item` for 'c'"]),
    ((ITEM, {"name": "h", "table": "item", "embedding_dim": 16}),
     ["embedding_dim 16", "embedding_dim 8", "Set embedding_dim on 'item' only"]),
    ((USER, {"name": "h", "table": "user", "embedding_dim": 8}),
     ["embedding_dim 8", "model.embedding_dim", "Set embedding_dim on 'user' only"]),
    ((ITEM, {"name": "h", "table": "item", "num_embeddings": 30}),
     ["num_embeddings=30", "'item' 20", "one row count"]),
    (({"name": "a", "num_embeddings": 5, "embedding_dim": 6},),
     ["'a'", "embedding_dim: 6", "multiple of 4", "FBGEMM"]),
    (({"name": "a", "num_embeddings": 5, "embedding_dim": 0},), ["embedding_dim: 0", "positive multiple of 4"]),
    (({"name": "a", "num_embeddings": 5, "table": "a"},), ["table: 'a'", "another pooled feature"]),
    ((ITEM, {"name": "h", "num_embeddings": 20, "sequence": True, "max_length": 3, "table": "item"}),
     ["sequence: true", "multi_hot pooled column"]),
    ((ITEM, {"name": "u", "num_embeddings": 20, "ids": "raw", "table": "item"}), ["ids: raw", "encoded ids"]),
    (({"name": "u", "num_embeddings": 20, "ids": "raw"}, {"name": "h", "table": "u"}),
     ["'u'", "raw ids", "Drop `table:`"]),
    ((ITEM, {"name": "s", "num_embeddings": 20, "sequence": True, "max_length": 3},
      {"name": "h", "num_embeddings": 20, "table": "s"}), ["'s'", "a sequence feature"]),
], ids=["unknown", "chain", "dim-conflict", "dim-on-sharer-only", "rows-conflict", "dim-not-multiple-of-4",
        "dim-zero", "itself", "sequence-sharer", "raw-sharer", "raw-owner", "sequence-owner"])
def test_each_bad_table_entry_is_one_error_naming_it_and_the_fix(sparse, says):
    with pytest.raises(DataError) as e:
        _schema(*sparse)
    assert e.value.category == "invalid_schema" or "dim" in str(e.value)
    for s in says:
        assert s in str(e.value), (s, str(e.value))


def test_a_schema_yaml_with_a_bad_table_fails_on_load(tmp_path):
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({"label": "y", "dense": ["x"], "sparse": [
        ITEM, {"name": "b", "table": "item"}, {"name": "c", "table": "b"}]}))
    with pytest.raises(DataError, match="c -> b -> item"):
        DatasetSchema.load(str(tmp_path))


# ---- statistics: the union of a shared table's ids ---- #


def _dataset(tmp_path, item, history):
    train, valid = tmp_path / "train", tmp_path / "valid"
    train.mkdir(), valid.mkdir()
    n = len(item)
    t = pa.table({"y": pa.array(np.arange(n) % 2, pa.float32()), "x": pa.array(np.ones(n), pa.float32()),
                  "item": pa.array(item, pa.int64()), "user": pa.array(np.arange(n) % 10, pa.int64()),
                  "history": pa.array(history, pa.list_(pa.int64()))})
    pq.write_table(t, train / "part-00000.parquet")
    pq.write_table(t, valid / "part-00000.parquet")
    _schema().save(str(tmp_path))
    return str(tmp_path)


def test_a_shared_tables_statistics_count_the_union_of_its_features_ids(tmp_path):
    from rayemb.data.stats import compute_stats
    from rayemb.planner.split import HugeCTRSplitRule

    rng = np.random.default_rng(0)
    item = rng.choice([1, 2, 3, 4, 5], size=200, p=[0.4, 0.3, 0.1, 0.1, 0.1]).tolist()
    # the history mostly holds ids the item column seldom has: 7 is hot only over both columns
    history = [[7, 7, 1] if i % 2 else [7, 12] for i in range(200)]
    schema = DatasetSchema.load(_dataset(tmp_path, item, history))
    per_feature = compute_stats(str(tmp_path), exact=True, in_process=True)
    assert sorted(per_feature.tables) == ["history", "item", "user"]
    merged = schema.table_stats(per_feature)
    assert sorted(merged.tables) == ["item", "user"]
    assert merged.tables["user"] is per_feature.tables["user"]
    want = dict(zip(*np.unique(np.concatenate([item, [i for bag in history for i in bag]]), return_counts=True)))
    got = {int(i): int(c) for i, c in merged.tables["item"].heavy_hitters}
    assert got == {int(i): int(c) for i, c in want.items()}
    counts = merged.tables["item"].heavy_hitters[:, 1]
    assert (np.diff(counts) <= 0).all()  # count descending, as stats.json orders them
    assert merged.tables["item"].values == 200 + sum(len(b) for b in history)
    assert merged.tables["item"].pooling_mean == pytest.approx(1 + 2.5)
    assert schema.table_stats(merged).tables.keys() == merged.tables.keys()  # merging twice changes nothing
    # the split sees every lookup of the table: 7 (never in the item column) and 1 (in both) are hot
    split = HugeCTRSplitRule(2, 20, threshold=3.0).split(merged)
    assert sorted(split.tables) == ["item", "user"]
    assert {7, 1} <= set(split.hot_ids("item").tolist())
    assert 7 not in set(HugeCTRSplitRule(2, 20, threshold=3.0).split(per_feature).hot_ids("item").tolist())


def test_batches_key_the_features_table_by_table_as_the_pooled_modules_take_them(tmp_path):
    from rayemb.contract.tables import table_configs
    from rayemb.data.batching import BatchConverter
    from rayemb.embedding.compressed import CompressedEmbeddingBagCollection
    from rayemb.embedding.compression_math import CompressionSpec

    schema = DatasetSchema.load(_dataset(tmp_path, [1, 2, 3], [[4, 5], [], [6]]))
    batch = BatchConverter(schema, "error")(pq.read_table(tmp_path / "train"))
    assert batch.sparse.keys() == ["item", "history", "user"]
    assert batch.sparse["history"].lengths().tolist() == [2, 0, 1]
    # a compressed module takes its tables' features in table order only
    module = CompressedEmbeddingBagCollection(table_configs(schema, 4), {"item": CompressionSpec("qr", buckets=4)})
    assert module(batch.sparse).length_per_key() == [8, 8, 4]


# ---- tables, planner, hybrid module ---- #


def test_a_shared_table_is_one_torchrec_config_with_both_features_and_its_own_dim():
    from rayemb.contract.tables import table_configs

    cfgs = table_configs(_schema(), 4)
    assert [(c.name, c.embedding_dim, c.num_embeddings, c.feature_names) for c in cfgs] == [
        ("item", 8, 20, ["item", "history"]), ("user", 4, 10, ["user"])]


def test_the_planner_sizes_each_table_with_its_own_dim_and_lookups():
    from rayemb.planner.split import HugeCTRSplitRule
    from rayemb.planner.tables import tables_from_schema
    from rayemb.data.stats_types import DatasetStats, TableStats

    stats = DatasetStats(rows=100, tables={
        "item": TableStats(num_embeddings=20, values=100, pooling_mean=1.0, heavy_hitters=[[3, 60], [5, 20]]),
        "user": TableStats(num_embeddings=10, values=100, pooling_mean=1.0),
        "history": TableStats(num_embeddings=20, values=300, pooling_mean=3.0, heavy_hitters=[[3, 50]])})
    schema = _schema()
    split = HugeCTRSplitRule(2, 20, threshold=1.0).split(schema.table_stats(stats))
    specs = {t.name: t for t in tables_from_schema(schema, 4, stats=stats, split=split)}
    assert sorted(specs) == ["item", "user"]
    assert (specs["item"].dim, specs["user"].dim) == (8, 4)
    assert specs["item"].pooling_factor == pytest.approx(4.0)
    assert specs["item"].row_bytes == 2 * specs["user"].row_bytes
    assert specs["item"].hot_rows == 2 and specs["item"].hot_share == pytest.approx((110 + 20) / 400)


def test_the_hybrid_module_pools_every_feature_of_a_shared_table_as_a_plain_ebc_does():
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rayemb.contract.tables import table_configs
    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection

    cfgs = table_configs(_schema(), 4)
    torch.manual_seed(0)
    full = {"item": torch.randn(20, 8), "user": torch.randn(10, 4)}
    plain = EmbeddingBagCollection(cfgs)
    plain.load_state_dict({f"embedding_bags.{k}.weight": v for k, v in full.items()})
    hybrid = HybridEmbeddingBagCollection(cfgs, hot_ids={"item": np.array([1, 3])})
    hybrid.load_state_dict(hybrid.split_state_dict(full))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["item", "user", "history"],
                                              values=torch.tensor([1, 2, 5, 3, 4, 1, 7, 3]),
                                              lengths=torch.tensor([1, 1, 1, 1, 3, 1]))
    want, got = plain(kjt), hybrid(hybrid.remapper.remap(kjt))
    assert got.keys() == want.keys() == _schema().pooled_features
    assert got.length_per_key() == [8, 8, 4]
    torch.testing.assert_close(got.values(), want.values())
    # history's first bag [4, 1, 7] reads the rows of the item column's table
    torch.testing.assert_close(got["history"][0], full["item"][[4, 1, 7]].sum(0))


def test_a_hybrid_table_hot_in_every_row_takes_no_cold_sharding_type():
    """Over two features' ids a small shared table may be hot in every row; the planner then reports it
    data-parallel, which is no cold half's sharding type, and no cold half is there to shard."""
    from rayemb.contract.tables import table_configs
    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection

    cfgs = table_configs(_schema(), 4)
    every = HybridEmbeddingBagCollection(cfgs, hot_ids={"item": np.arange(20)})
    cons = every.parameter_constraints({"item": "data_parallel"})
    assert cons["item__hot"].sharding_types == ["data_parallel"] and "item__cold" not in cons
    some = HybridEmbeddingBagCollection(cfgs, hot_ids={"item": np.arange(5)})
    with pytest.raises(ConfigError, match="cold half of hybrid table 'item'"):
        some.parameter_constraints({"item": "data_parallel"})


# ---- the contract and the shipped models ---- #


def _embeddings(schema, dim=4):
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rayemb.contract.model import Embeddings
    from rayemb.contract.tables import table_configs

    return Embeddings(EmbeddingBagCollection(table_configs(schema, dim)), tuple(schema.pooled_features), dim,
                      dims=schema.feature_dims(dim))


def _batch(schema):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = KeyedJaggedTensor.from_lengths_sync(keys=schema.sparse_names, values=torch.tensor([1, 2, 5, 3, 4, 1, 7]),
                                              lengths=torch.tensor([1, 1, 1, 1, 2, 1]))
    return torch.ones(2, 1), kjt


def test_embeddings_give_each_feature_its_tables_width():
    e = _embeddings(_schema())
    assert e.dims == (8, 8, 4) and e.dim_of("history") == 8 and e.pooled_width == 20
    from rayemb.contract.model import Embeddings

    assert Embeddings(e.pooled, ("a", "b"), 16).dims == (16, 16)  # one dim for all, as before
    with pytest.raises(ValueError, match="one dim per pooled feature"):
        Embeddings(e.pooled, ("a", "b"), 16, dims=(16,))


@pytest.mark.parametrize("name, args", [("dcn_v2", {"cross_layers": 1, "bottom_mlp": [4], "deep_mlp": [8]}),
                                        ("two_tower", {"item_feature": "item", "tower_mlp": [8]})])
def test_concatenating_models_take_vectors_of_any_width(name, args):
    from rayemb.contract.factory import ModelSpec, SHIPPED_MODELS, check_table_dims

    schema = _schema()
    check_table_dims(ModelConfig(name=name, args=args), schema)  # nothing to refuse
    model, _ = ModelSpec(SHIPPED_MODELS[name], args, name).build(_embeddings(schema), schema)
    out = model(*_batch(schema))
    assert all(torch.isfinite(o).all() for o in (out if isinstance(out, tuple) else (out,)))


def test_the_dlrm_refuses_unequal_dims_naming_the_features_and_the_fix():
    from rayemb.contract.factory import ModelSpec, SHIPPED_MODELS, check_table_dims

    schema = _schema()
    cfg = ModelConfig(name="dlrm", embedding_dim=4, bottom_mlp=(8, 4))
    with pytest.raises(ConfigError) as e:
        check_table_dims(cfg, schema)  # the driver's check, before any work
    for s in ("'item': 8", "'history': 8", "bottom_mlp", "dcn_v2"):
        assert s in str(e.value)
    assert "'user'" not in str(e.value)
    with pytest.raises(ConfigError, match="'item': 8"):  # and the factory's own, where it is built
        ModelSpec(SHIPPED_MODELS["dlrm"], {"bottom_mlp": [8, 4]}, "dlrm").build(_embeddings(schema), schema)
    # every table at the bottom MLP's width: a shared table is no reason to refuse
    same = _schema({**ITEM, "embedding_dim": 4}, USER, HISTORY)
    check_table_dims(cfg, same)
    model, _ = ModelSpec(SHIPPED_MODELS["dlrm"], {"bottom_mlp": [8, 4], "top_mlp": [8, 1]}, "dlrm").build(
        _embeddings(same), same)
    assert model(*_batch(same)).shape == (2,)
