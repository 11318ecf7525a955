"""What a training job does with raw-id features before and around the sharded model.

The batch conversion (int64 ids unchanged, strings hashed, no id policy), the statistics of raw values (any
int64, none invalid; distinct counts and heavy hitters of the raw ids) and the split (hot sets of raw values,
leaving the managed half 2 slots per rank), the hybrid remap and module (hot raw ids in fixed rows, the rest in
the managed-collision table), the pins (row-wise or hybrid: any other pin exits 2 before work starts, naming
what is allowed), the plan (raw tables row-wise, sized by their capacity, in their own module), and the model
contract (a model gets the pooled vectors of raw features as of encoded
ones). The sharded model, its checkpoints and its export: tests/dist/test_raw_id_job.py.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rayemb.data.schema import DatasetSchema, SparseFeature
from rayemb.embedding.raw_ids import hash_string, raw_ids_to_int64
from rayemb.errors import ConfigError, DataError, PlanError

BIG = 2 ** 63 - 1


def _schema() -> DatasetSchema:
    return DatasetSchema(label="label", dense=("I1",), sparse=(
        SparseFeature("C1", 10), SparseFeature("U1", 4, ids="raw"),
        SparseFeature("S1", 6, multi_hot=True, ids="raw", eviction="lfu")))


def _table() -> pa.Table:
    return pa.table({"label": [0.0, 1.0, 0.0, 1.0], "I1": [1.0, 2.0, 3.0, 4.0], "C1": [1, 12, 3, 0],
                     "U1": pa.array([BIG, -5, 123456789012345, None], pa.int64()),
                     "S1": pa.array([["a", "héllo"], [], None, ["a"]], pa.list_(pa.string()))})


# ---- batches ---- #


def test_converter_keeps_raw_int64_ids_hashes_strings_and_applies_the_policy_to_encoded_ids_only():
    from rayemb.data.batching import BatchConverter

    batch = BatchConverter(_schema(), id_policy="hash")(_table())
    got = batch.sparse.to_dict()
    assert batch.sparse.keys() == ["C1", "U1", "S1"]
    assert got["C1"].values().tolist() == [1, 2, 3, 0]  # 12 mod 10: the policy, for encoded ids
    assert got["U1"].values().tolist() == [BIG, -5, 123456789012345] and got["U1"].lengths().tolist() == [1, 1, 1, 0]
    assert got["S1"].values().tolist() == [hash_string("a"), hash_string("héllo"), hash_string("a")]
    assert got["S1"].lengths().tolist() == [2, 0, 0, 1]
    # an int64 column of string-looking data and a string column of the same ids agree: one hash, everywhere
    as_ids = raw_ids_to_int64(pa.array(["a", "héllo"]))
    assert as_ids.tolist() == got["S1"].values().tolist()[:2]


def test_the_remap_passes_raw_features_unchanged_after_every_encoded_part():
    from rayemb.data.batching import BatchConverter
    from rayemb.embedding.remap import HybridRemapper
    from rayemb.contract.tables import table_configs

    schema = _schema()
    remapper = HybridRemapper(table_configs(schema, 4), {"C1": np.array([1, 3])}, raw=schema.raw_names)
    batch = BatchConverter(schema, "hash", remap=remapper.remap)(_table())
    assert batch.sparse.keys() == ["C1__hot", "C1__cold", "U1", "S1"] and remapper.segments == [0, 1, 1, 2]
    assert batch.sparse["U1"].values().tolist() == [BIG, -5, 123456789012345]  # far above the capacity of 4


def test_a_hybrid_raw_table_sends_its_hot_ids_to_fixed_rows_and_the_rest_to_its_managed_slots():
    import torch

    from rayemb.data.batching import BatchConverter
    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
    from rayemb.contract.tables import table_configs

    schema = DatasetSchema(label="label", dense=("I1",), sparse=(
        SparseFeature("C1", 10), SparseFeature("U1", 6, ids="raw"),
        SparseFeature("S1", 6, multi_hot=True, ids="raw", eviction="lfu")))
    hot_s1 = raw_ids_to_int64(pa.array(["a"]))
    module = HybridEmbeddingBagCollection(table_configs(schema, 4), {"U1": np.array([-5, BIG]), "S1": hot_s1},
                                          raw=[f for f in schema.sparse if f.ids == "raw"])
    remapper = module.remapper
    batch = BatchConverter(schema, "hash", remap=remapper.remap)(_table())
    got = batch.sparse.to_dict()
    assert batch.sparse.keys() == ["C1", "U1__hot", "S1__hot", "U1", "S1"] and remapper.segments == [1, 2, 2]
    assert got["U1__hot"].values().tolist() == [1, 0] and got["U1__hot"].lengths().tolist() == [1, 1, 0, 0]
    assert got["U1"].values().tolist() == [123456789012345] and got["U1"].lengths().tolist() == [0, 0, 1, 0]
    assert got["S1__hot"].lengths().tolist() == [1, 0, 0, 1] and got["S1"].values().tolist() == [hash_string("héllo")]
    # the managed tables hold the rest of the capacity; the hot rows are never evicted (no managed slot of theirs)
    mcms = module.raw._managed_collision_collection._managed_collision_modules
    assert (mcms["U1"]._zch_size, mcms["S1"]._zch_size) == (4, 5)
    assert module.hot.embedding_bags["U1__hot"].weight.shape == (2, 4)
    out = module(batch.sparse).to_dict()
    hot_rows = module.hot.embedding_bags["U1__hot"].weight
    torch.testing.assert_close(out["U1"][0], hot_rows[1])  # BIG: hot row 1 (hot ids sorted), summed with nothing
    torch.testing.assert_close(out["U1"][1], hot_rows[0])
    with pytest.raises(ConfigError, match="'U1' holds raw ids and was given 5 hot ids.*capacity is 6 rows"):
        HybridEmbeddingBagCollection(table_configs(schema, 4), {"U1": np.arange(5)}, raw=[schema.sparse[1]])


def test_raw_columns_of_another_type_and_a_raw_retrieval_item_are_refused_by_name():
    from rayemb.data.batching import BatchConverter

    bad = _table().set_column(3, "U1", pa.array([1.5, 2.0, 3.0, 4.0]))
    with pytest.raises(DataError, match="Raw-id column 'U1' has type double"):
        BatchConverter(_schema(), id_policy="hash")(bad)
    with pytest.raises(DataError, match="'U1' holds raw ids .*retrieval model's item feature"):
        BatchConverter(_schema(), keep_ids="U1")


# ---- statistics and the split ---- #


def test_statistics_count_raw_ids_of_any_value_and_the_split_makes_heavy_hitters_hot_within_capacity():
    from rayemb.data.sketches import TableSummary
    from rayemb.data.stats_types import DatasetStats, TableStats
    from rayemb.planner.split import HugeCTRSplitRule

    rng = np.random.default_rng(0)
    vocab = rng.integers(-(2 ** 63), BIG, size=50, dtype=np.int64)
    ids = vocab[np.minimum(rng.zipf(1.3, size=4000) - 1, 49)]
    exact = TableSummary.from_values("U1", 8, ids, rows=ids.size, capacity=None, raw=True).to_stats()
    uniq, counts = np.unique(ids, return_counts=True)
    assert (exact.invalid, exact.distinct, exact.distinct_exact, exact.ids) == (0, uniq.size, True, "raw")
    assert exact.heavy_hitters[0].tolist() == [int(uniq[counts.argmax()]), int(counts.max())]
    assert (exact.min_id, exact.max_id) == (int(ids.min()), int(ids.max()))
    # approximate, merged from blocks: counters dropped, so HyperLogLog (never a bitmap of 8 rows) counts them
    halves = [TableSummary.from_values("U1", 8, b, rows=b.size, capacity=4, raw=True) for b in np.split(ids, 2)]
    merged = halves[0].merge(halves[1])
    approx = merged.to_stats()
    assert merged.bitmap is None and merged.hll is not None and approx.invalid == 0
    assert not approx.distinct_exact and abs(approx.distinct - uniq.size) <= 2
    assert approx.heavy_hitters[0, 0] == exact.heavy_hitters[0, 0]
    # the same values as an encoded table of 8 rows: nearly all invalid, as before
    assert TableSummary.from_values("U1", 8, ids, rows=ids.size, capacity=None).to_stats().invalid > 3900
    assert TableStats.from_dict(exact.to_dict()).ids == "raw" and "ids" not in TableStats().to_dict()
    stats = DatasetStats(rows=4000, tables={"U1": exact, "C1": TableStats(
        num_embeddings=10, rows=4000, values=4000, heavy_hitters=[[1, 3000], [2, 1000]])})
    split = HugeCTRSplitRule(world_size=2, global_batch_size=512).split(stats)
    # the hot set of a raw table: its heavy hitters' raw values, as many as its capacity leaves 2 slots per rank
    assert split.tables["U1"].num_hot == 4 and split.tables["U1"].limited_by == "capacity"
    assert split.hot_ids("U1").tolist() == exact.heavy_hitters[:4, 0].tolist()
    assert split.tables["U1"].complete and split.tables["C1"].num_hot == 2
    roomy = DatasetStats(rows=4000, tables={"U1": TableSummary.from_values(
        "U1", 64, ids, rows=ids.size, capacity=None, raw=True).to_stats()})
    wide = HugeCTRSplitRule(world_size=2, global_batch_size=512).split(roomy).tables["U1"]
    assert wide.limited_by == "threshold" and 0 < wide.num_hot <= 64 - 4 and wide.num_hot % 2 == 0


def test_a_string_column_is_counted_by_the_ids_training_uses(tmp_path):
    from rayemb.data.stats import compute_stats
    from tests._raw_data import raw_id_dataset

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    data = raw_id_dataset(str(tmp_path / "data"), rows=1000)
    stats = compute_stats(data, exact=True, in_process=True)
    s1 = stats.tables["S1"]
    counts = pc.value_counts(pq.read_table(f"{data}/train").column("S1")).to_pylist()
    top = max(counts, key=lambda c: c["counts"])
    assert s1.ids == "raw" and s1.invalid == 0 and s1.distinct == len(counts)
    assert s1.heavy_hitters[0].tolist() == [hash_string(top["values"]), top["counts"]]
    assert stats.tables["C1"].ids == "encoded" and stats.tables["U1"].distinct > stats.tables["U1"].num_embeddings // 8
    # a stats.json is reused for its data, unless it counted the raw tables as encoded ones (an older rayemb's)
    import json

    from rayemb.data.stats_io import load_or_compute_stats, write_stats_json

    path = str(tmp_path / "stats.json")
    write_stats_json(stats, path)
    doc = json.loads(open(path).read())
    doc["elapsed_s"] = -1.0
    json.dump(doc, open(path, "w"))
    assert load_or_compute_stats(data, path).elapsed_s == -1.0
    for t in doc["tables"].values():
        t.pop("ids", None)
    json.dump(doc, open(path, "w"))
    assert load_or_compute_stats(data, path).tables["U1"].ids == "raw"


# ---- pins and the plan ---- #


def _cfg(data: str, model: str = "dlrm", **planner):
    from rayemb.config import config_from_dict

    return config_from_dict({"name": "raw", "data": {"path": data, "batch_size": 64},
                             "model": {"name": model, "embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
                             "planner": planner})


@pytest.mark.parametrize("pin, asked", [
    ({"sharding": "table_wise"}, "sharding: table_wise"),
    ({"sharding": "column_wise", "hybrid": False}, "sharding: column_wise"),
    ({"compression": "qr"}, "compression: qr"),
])
def test_a_raw_table_pinned_to_anything_but_row_wise_or_hybrid_is_refused_naming_what_is_allowed(pin, asked):
    from rayemb.train.sharding import pins_of

    cfg = _cfg("/nowhere", tables={"U1": pin})
    with pytest.raises(PlanError, match=f"'U1' holds raw ids .*pinned {{{asked}}}.*placed row_wise or hybrid.*"
                                        r"Allowed pins: \{sharding: row_wise\}, \{sharding: hybrid\}") as e:
        pins_of(cfg, ["C1", "U1"], ["U1"])
    assert e.value.category == "invalid_pin" and e.value.exit_code == 2


class _Split:
    def __init__(self, **hot):
        self._hot = hot

    def hot_ids(self, name):
        return np.asarray(self._hot.get(name, []), dtype=np.int64)


@pytest.mark.parametrize("pin, planner_hybrid, hot, placed", [
    (None, True, [BIG, -5], "hybrid"),  # the default: hybrid when the split has hot ids...
    (None, True, [], "row_wise"),  # ...row-wise when it has none
    (None, False, [BIG], "row_wise"),  # planner.hybrid: false
    ({"sharding": "row_wise", "hybrid": False}, True, [BIG], "row_wise"),
    ({"hybrid": False}, True, [BIG], "row_wise"),
    ({"sharding": "hybrid"}, False, [BIG], "hybrid"),
    ({"hybrid": True, "compute_kernel": "fused_uvm_caching"}, True, [BIG], "hybrid"),
])
def test_a_raw_table_is_placed_hybrid_when_its_split_has_hot_ids_unless_pinned(pin, planner_hybrid, hot, placed):
    from rayemb.train.sharding import pins_of

    cfg = _cfg("/nowhere", hybrid=planner_hybrid, **({"tables": {"U1": pin}} if pin else {}))
    pins = pins_of(cfg, ["C1", "U1"], ["U1"], _Split(U1=hot))
    kernel = (pin or {}).get("compute_kernel", "fused")
    assert (pins["U1"].sharding.value, pins["U1"].hybrid, pins["U1"].compute_kernel) == (placed, placed == "hybrid",
                                                                                        kernel)
    assert ("C1" in pins) == (not planner_hybrid) and (not planner_hybrid) <= (pins.get("C1") is None
                                                                                or pins["C1"].hybrid is False)
    with pytest.raises(PlanError, match="contradicts itself"):
        pins_of(_cfg("/nowhere", tables={"U1": {"sharding": "row_wise", "hybrid": True}}), ["C1", "U1"], ["U1"])


def test_rayemb_train_exits_2_on_such_a_pin_before_any_work(tmp_path, capsys):
    import ray

    from rayemb.cli import main
    from tests._raw_data import raw_id_dataset

    data = raw_id_dataset(str(tmp_path / "data"), rows=500)
    rc = main(["train", "--config", "jobs/configs/synth_small.yaml", "--set", f"data.path={data}",
               "--set", f"tracking.output_dir={tmp_path / 'runs'}",
               "--set", "planner.tables={S1: {sharding: column_wise}}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "'S1' holds raw ids" in err and "Allowed pins: {sharding: row_wise}, {sharding: hybrid}" in err
    assert not ray.is_initialized() and not (tmp_path / "runs").exists()


def test_the_plan_puts_raw_tables_row_wise_sized_by_their_capacity(tmp_path):
    from rayemb.data.stats import compute_stats
    from rayemb.planner.cost import table_memory
    from rayemb.planner.tables import split_rule
    from rayemb.planner.types import ClusterTopology, Placement, TableSpec
    from rayemb.train.sharding import make_job_plan
    from tests._raw_data import raw_id_dataset

    data = raw_id_dataset(str(tmp_path / "data"), rows=2000, u1_capacity=4096)
    schema = DatasetSchema.load(data)
    stats = compute_stats(data, exact=True, in_process=True)
    topology = ClusterTopology(1, 2, compute_device="cpu")
    cfg = _cfg(data, hybrid=False)  # raw tables row-wise (the hybrid placement: tests/dist/test_raw_id_job.py)
    plan = make_job_plan(cfg, schema, stats, split_rule(topology, 128, 8).split(stats), topology)
    for name, rows in (("U1", 4096), ("S1", 128)):
        tp = plan.placements[name]
        assert (tp.placement, tp.sharding_type, tp.ranks, tp.hot_rows) == (Placement.ROW_WISE, "row_wise", (0, 1), 0)
        assert tp.memory_bytes == table_memory(TableSpec(name, rows=rows, dim=8), Placement.ROW_WISE, 2, 2).memory_bytes
        shards = plan.sharding_plan.plan["embedding.raw"][name].sharding_spec.shards
        assert [s.shard_sizes for s in shards] == [[rows // 2, 8], [rows // 2, 8]]
    assert not plan.hot_ids.keys() & {"U1", "S1"}
    assert not {"U1", "S1"} & set(plan.sharding_plan.plan.get("embedding.plain", {}))


# ---- the model contract ---- #


@pytest.mark.parametrize("name", ["dlrm", "dcn_v2"])
def test_a_model_gets_raw_features_pooled_like_encoded_ones(tmp_path, name):
    import pyarrow.parquet as pq
    import torch

    from rayemb.data.batching import BatchConverter
    from rayemb.planner.types import Placement, TablePlan
    from rayemb.train.sharding import build_model
    from tests._raw_data import raw_id_dataset

    data = raw_id_dataset(str(tmp_path / "data"), rows=400)
    schema = DatasetSchema.load(data)
    cfg = _cfg(data, model=name)
    placements = {n: TablePlan(n, Placement.ROW_WISE, "row_wise", (0,), 0, 0.0, 0, "fused")
                  for n in schema.sparse_names}
    cpu = torch.device("cpu")
    model, embeddings, paths = build_model(cfg, schema, placements, {}, cpu, cpu)
    batch = BatchConverter(schema, remap=embeddings.pooled.remapper.remap)(pq.read_table(f"{data}/train").slice(0, 16))
    pooled = embeddings.pooled(batch.sparse)
    assert pooled.keys() == ["C1", "C2", "U1", "S1"] and pooled.values().shape == (16, 4 * 8)
    assert paths["pooled"] and embeddings.pooled.raw is not None
    assert model(batch.dense, batch.sparse).shape == (16,)


def test_scoring_keeps_raw_string_ids_and_refuses_float_raw_ids():
    from rayemb.serve.columns import id_column

    schema = _schema()
    table = _table()
    assert id_column(table, schema.feature("S1")).type == pa.list_(pa.string())
    assert id_column(table.set_column(3, "U1", pa.array(["x", None, "y", "z"])), schema.feature("U1")).type == "string"
    floats = table.set_column(3, "U1", pa.array([1.0, None, 2.0, 3.0]))
    with pytest.raises(DataError, match="Raw-id column 'U1' is double: floats do not hold 64-bit ids exactly"):
        id_column(floats, schema.feature("U1"))
    assert id_column(floats, SparseFeature("U1", 4)).type == pa.int64()  # an encoded column casts, as before


def test_a_checkpoint_whose_tables_hold_other_ids_than_the_schema_says_is_refused():
    from rayemb.checkpoint.raw_files import check_id_kinds

    saved = {"C1": {"num_embeddings": 10, "dim": 8}, "U1": {"num_embeddings": 4, "dim": 8, "ids": "raw"}}
    check_id_kinds(saved, ["U1"], "ckpt")
    with pytest.raises(DataError, match="'ckpt' holds table 'U1' with raw ids; this job's schema gives it encoded"):
        check_id_kinds(saved, [], "ckpt")
    with pytest.raises(DataError, match="holds table 'C1' with encoded ids; this job's schema gives it raw") as e:
        check_id_kinds(saved, ["C1", "U1"], "ckpt")
    assert e.value.category == "bad_checkpoint"
