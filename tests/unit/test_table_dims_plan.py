"""Tables of their own widths in the hot/cold split, a shared item table's logQ and DeepFM: each table's hot rows,
optimizer state and break-even priced at its own dim (:func:`rayemb.train.world_plan.plan_world`, as the driver
and ``rayemb plan`` call it); a retrieval loss's sampling probabilities from its item column's own counts, not the
union the split sees when a history column reads the item table; ``examples/deepfm.py`` over vectors of unequal
widths.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rayemb.config import load_config
from rayemb.data.schema import DatasetSchema
from rayemb.data.stats_types import DatasetStats, TableStats
from rayemb.planner.cost import DEFAULT_REPLICATED_FRACTION, optimizer_state_bytes
from rayemb.planner.step_time import DEFAULT_CALIBRATION, LinkCost, hot_threshold
from rayemb.planner.types import ClusterTopology
from rayemb.train.world_plan import plan_world

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "jobs" / "configs" / "synth_small.yaml")
LOCAL_BATCH = 512
DIMS = {"wide": 64, "narrow": 8}  # model.embedding_dim is 16: neither table's

# a calibration measured across 2 nodes (as tests/unit/test_calibrated_split.py's): per-occurrence id bytes and
# lookup cost make the break-even grow with the row's width
MEASURED = dataclasses.replace(
    DEFAULT_CALIBRATION, all_reduce=LinkCost(1.5e-4, 8.5e-8), all_to_all=LinkCost(0.0, 1.64e-7),
    replicated_elem_s=3.44e-7, lookup_s=3.36e-7, pool_s=9.0e-8, dense_lookup_s=1.07e-7,
    source="measured", world_size=2, num_nodes=2,
)


def _stats(rows: int = 100_000) -> DatasetStats:
    # two tables with the same Zipf-like counts: only their widths tell them apart
    counts = np.maximum((rows * 0.1 / np.arange(1, 4001) ** 1.1).astype(int), 1)
    hh = [[i, int(c)] for i, c in enumerate(counts)]
    table = TableStats(num_embeddings=50_000, values=rows, heavy_hitters=hh, error_bound=0)
    return DatasetStats(rows=rows, tables={"wide": table, "narrow": table})


def _cfg():
    return load_config(CONFIG, [f"data.batch_size={LOCAL_BATCH}"])


def test_the_calibrated_break_even_is_each_tables_own_a_wide_one_hot_from_more_occurrences():
    cfg = _cfg()
    split = plan_world(cfg, ClusterTopology(num_nodes=2, devices_per_node=1), _stats(), MEASURED,
                       table_dims=DIMS).split
    wide, narrow = split.tables["wide"], split.tables["narrow"]
    assert wide.threshold == pytest.approx(hot_threshold(MEASURED, 2, 64))
    assert narrow.threshold == pytest.approx(hot_threshold(MEASURED, 2, 8))
    assert wide.threshold > narrow.threshold
    assert 0 < wide.num_hot < narrow.num_hot
    assert split.params["threshold_per_batch"] == {"wide": wide.threshold, "narrow": narrow.threshold}
    # a table it does not name takes model.embedding_dim
    unnamed = plan_world(cfg, ClusterTopology(num_nodes=2, devices_per_node=1), _stats(), MEASURED,
                         table_dims={"wide": 64}).split
    assert unnamed.tables["narrow"].threshold == pytest.approx(hot_threshold(MEASURED, 2, cfg.model.embedding_dim))


def test_the_replicated_rows_fit_the_budget_at_each_tables_own_width():
    cfg = _cfg()
    roomy = ClusterTopology(num_nodes=1, devices_per_node=2, compute_device="cpu", reserved_fraction=0.0)
    wanted = plan_world(cfg, roomy, _stats(), table_dims=DIMS).split
    assert all(t.limited_by == "threshold" and t.num_hot > 0 for t in wanted.tables.values())

    def row_bytes(name: str) -> int:
        return width_bytes(DIMS[name])

    def width_bytes(dim: int) -> int:  # a replicated row: weights + its optimizer's state
        return dim * cfg.model.embedding_bytes_per_element + optimizer_state_bytes(cfg.train.embedding_optimizer, dim)

    want = sum(t.num_hot * row_bytes(n) for n, t in wanted.tables.items())
    # room for half the wanted rows at their real widths, and for all of them were both tables 16 wide
    budget = want // 2
    assert sum(t.num_hot for t in wanted.tables.values()) * width_bytes(cfg.model.embedding_dim) <= budget
    tight = dataclasses.replace(roomy, ddr_bytes=int(budget / DEFAULT_REPLICATED_FRACTION) + 1)
    split = plan_world(cfg, tight, _stats(), table_dims=DIMS).split
    assert sum(t.num_hot * row_bytes(n) for n, t in split.tables.items()) <= budget
    assert split.tables["wide"].limited_by == "memory"
    assert split.tables["wide"].num_hot < wanted.tables["wide"].num_hot


def test_a_per_table_input_missing_a_table_is_one_plan_error_naming_it():
    from rayemb.errors import PlanError
    from rayemb.planner.split import HugeCTRSplitRule

    with pytest.raises(PlanError, match=r"embedding_dim is given per table .*\['narrow'\]"):
        HugeCTRSplitRule(2, 1024, embedding_dim={"wide": 64}, memory_budget_bytes=1).split(_stats())


# ---- a shared item table's logQ ---- #


def _retrieval_data(tmp_path: Path) -> str:
    """An item column of ids 1-4 and a history column, reading the item table, of mostly id 9."""
    n = 200
    item = np.array([1, 2, 3, 4])[np.arange(n) % 4]
    history = [[9, 9, 1] if i % 2 else [9] for i in range(n)]
    t = pa.table({"y": pa.array(np.ones(n), pa.float32()), "user": pa.array(np.arange(n) % 10, pa.int64()),
                  "item": pa.array(item, pa.int64()), "history": pa.array(history, pa.list_(pa.int64()))})
    for split in ("train", "valid"):
        (tmp_path / split).mkdir(parents=True)
        pq.write_table(t, tmp_path / split / "part-00000.parquet")
    DatasetSchema.from_dict({"label": "y", "dense": [], "sparse": [
        {"name": "user", "num_embeddings": 10}, {"name": "item", "num_embeddings": 20},
        {"name": "history", "multi_hot": True, "table": "item"}]}).save(str(tmp_path))
    return str(tmp_path)


def test_the_logq_correction_counts_the_item_column_not_the_shared_tables_union(tmp_path):
    from rayemb.data.stats_io import keep_stats
    from rayemb.train.driver.trainer import check_inputs, compute_statistics
    from rayemb.train.worker.losses import job_loss

    data = _retrieval_data(tmp_path / "data")
    cfg = load_config(CONFIG, [f"data.path={data}", f"tracking.output_dir={tmp_path / 'runs'}",
                               "data.batch_size=32", "model.name=two_tower",
                               "model.args={item_feature: item, tower_mlp: [16]}"])
    inputs = check_inputs(cfg)
    first = compute_statistics(inputs)
    keep_stats(first, inputs.out_dir, inputs.data_dir)  # as the job keeps them for the next one on these files
    again = compute_statistics(check_inputs(cfg))
    for stats in (first, again):
        log_q = job_loss(inputs.schema, item_feature="item", table_stats=stats.tables)._log_q
        # the item column: ids 1-4 a quarter each; 9 (history only) no likelier than an unseen id
        assert np.exp(log_q[[1, 2, 3, 4]]) == pytest.approx(0.25, rel=1e-6)
        assert log_q[9] == pytest.approx(log_q[5])
        # while the split sees every lookup of the table: 9 is its most frequent id
        table = inputs.schema.table_stats(stats).tables["item"]
        assert int(table.heavy_hitters[0, 0]) == 9 and "history" not in inputs.schema.table_stats(stats).tables


# ---- examples/deepfm.py ---- #


def _embeddings(schema: DatasetSchema, dim: int):
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rayemb.contract.model import Embeddings
    from rayemb.contract.tables import table_configs

    return Embeddings(EmbeddingBagCollection(table_configs(schema, dim)), tuple(schema.pooled_features), dim,
                      dims=schema.feature_dims(dim))


def _deepfm_schema(item_dim=None) -> DatasetSchema:
    item = {"name": "item", "num_embeddings": 20, **({"embedding_dim": item_dim} if item_dim else {})}
    return DatasetSchema.from_dict({"label": "y", "dense": ["x"], "sparse": [
        item, {"name": "user", "num_embeddings": 10}, {"name": "history", "multi_hot": True, "table": "item"}]})


def _batch(schema: DatasetSchema):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = KeyedJaggedTensor.from_lengths_sync(keys=schema.pooled_features, values=torch.tensor([1, 2, 5, 3, 4, 1, 7]),
                                              lengths=torch.tensor([1, 1, 1, 2, 1, 1]))
    return torch.ones(2, 1), kjt


def test_deepfm_takes_tables_of_unequal_widths_and_is_unchanged_with_one_width():
    from examples.deepfm import deepfm

    torch.manual_seed(0)
    schema = _deepfm_schema(item_dim=8)
    model = deepfm(_embeddings(schema, 4), schema, hidden=[8])
    out = model(*_batch(schema))
    assert out.shape == (2,) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if not n.startswith("embedding"))
    assert sorted(model.to_fm_dim) == ["history", "item"]  # the 8-wide vectors, mapped to the FM's 4
    same = _deepfm_schema()
    equal = deepfm(_embeddings(same, 4), same, hidden=[8])
    assert not any(n.startswith("to_fm_dim") for n, _ in equal.named_parameters())
    assert equal.deep[0].in_features == 4 * 4
