"""Validation scores every row, on 2 gloo ranks, whatever the split's size (rayemb.train.worker.validation).

The job's own model code (``sharded_model`` with test_export_equivalence's plan: hybrid tables with row- and
column-wise cold halves, plain row-, column- and table-wise tables, a data-parallel table) trains a few steps;
then each rank scores its share of 37 validation rows with the job's ``evaluate`` and its ``RankBatches``
(last batch kept and padded, local batch 16), from shares that are even (19 / 18), uneven (34 / 3), one-sided
(37 / 0: one rank never has a batch) and a single row (1 / 0), in memory and streamed. ``valid_rows`` must
count every real row, and AUC and logloss must be sklearn's on all of those rows' (label, logit) pairs, the
logits taken from the same model in one unpadded 37-row forward on both ranks.

Also here: the converter's padding rows, and the driver's check that asks the valid split for one row, not
one global batch (an empty one is still a clear error, exit 2).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Dict, List, Tuple

import numpy as np
import pyarrow as pa
import pytest
from _table_shard import TableShard

from rayemb.multiprocess import run_multiprocess

pytestmark = pytest.mark.timeout(900)

LOCAL_BATCH = 16
VALID_ROWS = 37
TRAIN_STEPS = 4
#: case -> (rows of rank 0, rows of rank 1) out of the first VALID_ROWS validation rows, in order
SHARES: Dict[str, Tuple[int, int]] = {"even": (19, 18), "uneven": (34, 3), "one_sided": (37, 0),
                                      "single_row": (1, 0)}


def _score_rank(rank: int, world_size: int, cfg: Any, schema: Any) -> Dict[str, Any]:
    import pyarrow.parquet as pq
    import torch
    from test_export_equivalence import _job_plan

    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import parquet_files
    from rayemb.train.worker.data_loader import RankBatches
    from rayemb.train.worker.build import sharded_model
    from rayemb.train.worker.validation import evaluate

    torch.manual_seed(cfg.train.seed)
    model, optimizer, remapper = sharded_model(cfg, schema, _job_plan(cfg, schema, world_size), torch.device("cpu"))
    convert = BatchConverter(schema, cfg.data.id_policy, remap=remapper.remap)
    train = pq.read_table(parquet_files(cfg.data.path, "train"))
    for step in range(TRAIN_STEPS):  # a trained model, so that hot, cold and plain rows all hold learned values
        b = convert(train.slice((step * world_size + rank) * LOCAL_BATCH, LOCAL_BATCH))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(b.dense, b.sparse), b.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    valid = pq.read_table(parquet_files(cfg.data.path, "valid")).slice(0, VALID_ROWS)
    model.eval()
    with torch.no_grad():  # the reference: every row in one unpadded batch, the same on both ranks
        full = convert(valid)
        reference = model(full.dense, full.sparse).numpy().copy()
    model.train()

    results: Dict[str, Dict[str, float]] = {}
    for case, shares in SHARES.items():
        lo = sum(shares[:rank])
        mine = valid.slice(lo, shares[rank])
        for in_memory in (True, False):
            data = RankBatches(TableShard(mine), LOCAL_BATCH, functools.partial(convert, pad_to=LOCAL_BATCH),
                               in_memory=in_memory, first_batch_timeout_s=60.0, split="valid", rank=rank,
                               shuffle=False, drop_last=False)
            results[f"{case}/{'memory' if in_memory else 'streamed'}"] = evaluate(
                model, data, torch.device("cpu"), padding=lambda: convert.padding(LOCAL_BATCH))
    return {"reference": reference, "labels": full.labels.numpy().copy(), "results": results}


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> List[Dict[str, Any]]:
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from tests._export import small_dataset

    root = tmp_path_factory.mktemp("valid_rows")
    data = small_dataset(str(root / "data"), rows=600)
    cfg = config_from_dict({
        "name": "valid-rows", "data": {"path": data, "batch_size": LOCAL_BATCH},
        "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
        "train": {"dense_lr": 0.1, "embedding_lr": 0.1},
        "tracking": {"output_dir": str(root / "runs"), "experiment": "valid-rows"},
    })
    return run_multiprocess(_score_rank, 2, cfg=cfg, schema=DatasetSchema.load(data))


@pytest.mark.parametrize("mode", ["memory", "streamed"])
@pytest.mark.parametrize("case", list(SHARES))
def test_every_validation_row_is_scored(scored, case, mode):
    from sklearn.metrics import log_loss, roc_auc_score

    z = scored[0]["reference"].astype(np.float64)
    y = scored[0]["labels"]
    assert np.array_equal(scored[1]["reference"], scored[0]["reference"])
    rows = sum(SHARES[case])
    z, y = z[:rows], y[:rows]
    got = scored[0]["results"][f"{case}/{mode}"]
    np.testing.assert_equal(scored[1]["results"][f"{case}/{mode}"], got)  # both ranks: the gathered numbers
    assert got["valid_rows"] == rows
    assert got["valid_logloss"] == pytest.approx(log_loss(y, 1 / (1 + np.exp(-z)), labels=[0, 1]), abs=1e-6)
    if rows == 1:  # one class only: no AUC
        assert np.isnan(got["valid_auc"])
        return
    # padded or not, a row's logit moves only by float rounding: far too little to reorder these logits
    assert np.diff(np.sort(z)).min() > 1e-4 and 0 < y.sum() < rows
    assert got["valid_auc"] == pytest.approx(roc_auc_score(y, z), abs=1e-6)


def _schema(sequence: bool = False):
    from rayemb.data.schema import DatasetSchema, SparseFeature

    seq = (SparseFeature("H1", 6, sequence=True, max_length=2),) if sequence else ()
    return DatasetSchema(label="label", dense=("I1", "I2"),
                         sparse=(SparseFeature("C1", 10), SparseFeature("C2", 5, multi_hot=True)), sequence=seq)


def _table(sequence: bool = False) -> pa.Table:
    t = pa.table({"label": pa.array([1.0, 0.0, 1.0], pa.float32()), "I1": pa.array([1.0, 2.0, 3.0], pa.float32()),
                  "I2": pa.array([0.0, 4.0, 5.0], pa.float32()), "C1": pa.array([4, 9, 0], pa.int64()),
                  "C2": pa.array([[1, 2], [], [3]], pa.list_(pa.int64()))})
    return t.append_column("H1", pa.array([[1, 2, 3], [4], []], pa.list_(pa.int64()))) if sequence else t


def test_a_short_batch_is_padded_with_masked_empty_rows():
    from rayemb.data.batching import BatchConverter

    conv = BatchConverter(_schema(sequence=True), sequence=True)
    plain, padded = conv(_table(True)), conv(_table(True), pad_to=5)
    assert plain.mask is None and plain.rows == 3
    assert len(padded) == 5 and padded.rows == 3 and padded.mask.tolist() == [True] * 3 + [False] * 2
    # the real rows are untouched; padding rows are empty bags, zero dense, label 0
    assert padded.sparse.lengths().tolist() == [1, 1, 1, 0, 0, 2, 0, 1, 0, 0]
    assert padded.sparse.values().tolist() == plain.sparse.values().tolist() == [4, 9, 0, 1, 2, 3]
    assert padded.sequence.lengths().tolist() == [2, 1, 0, 0, 0]
    assert padded.sequence.values().tolist() == plain.sequence.values().tolist() == [2, 3, 4]
    assert padded.dense[:3].tolist() == plain.dense.tolist() and padded.dense[3:].abs().sum() == 0
    assert padded.labels.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert conv(_table(True), pad_to=3).mask is None  # a full batch needs no padding
    only = conv.padding(4)
    assert len(only) == 4 and only.rows == 0 and only.sparse.keys() == ["C1", "C2"]
    assert only.sparse.lengths().tolist() == [0] * 8 and only.sparse.values().numel() == 0
    assert only.sequence.keys() == ["H1"] and only.sequence.lengths().tolist() == [0] * 4
    with pytest.raises(ValueError):
        conv(_table(True), pad_to=2)


def test_validation_keeps_the_last_batch_training_drops_it():
    from rayemb.train.worker.data_loader import RankBatches

    table = pa.table({"x": list(range(37))})
    args = dict(in_memory=True, first_batch_timeout_s=5.0, rank=0, shuffle=False)
    train = RankBatches(TableShard(table), 16, lambda b: b.num_rows, split="train", **args)
    valid = RankBatches(TableShard(table), 16, lambda b: b.num_rows, split="valid", drop_last=False, **args)
    assert list(train.epoch(0)) == [16, 16] and list(valid.epoch(0)) == [16, 16, 5]


def _dataset_with_valid_rows(root, rows: int) -> str:
    import pyarrow.parquet as pq

    from rayemb.data.schema import parquet_files
    from rayemb.data.synthetic import SyntheticSpec, generate

    data = str(root / "data")
    generate(SyntheticSpec(rows=2400, num_tables=3, seed=1, valid_fraction=0.1), data)
    files = parquet_files(data, "valid")
    first = pq.read_table(files[0])
    for f in files[1:]:
        os.remove(f)
    pq.write_table(first.slice(0, rows), files[0])
    return data


def test_a_valid_split_smaller_than_one_global_batch_is_accepted(tmp_path):
    from rayemb.config import config_from_dict
    from rayemb.train.driver.trainer import check_inputs

    data = _dataset_with_valid_rows(tmp_path, 5)
    cfg = config_from_dict({"name": "small-valid", "data": {"path": data, "batch_size": 512},
                            "tracking": {"output_dir": str(tmp_path / "runs")}})
    inputs = check_inputs(cfg)  # 5 rows < one global batch of 1,024
    assert inputs.valid_rows == 5 and inputs.steps_per_epoch == 2160 // 1024


def test_an_empty_valid_split_is_a_clear_error(tmp_path, capsys):
    from rayemb.cli import main

    data = _dataset_with_valid_rows(tmp_path, 0)
    config = tmp_path / "job.yaml"
    config.write_text(f"name: empty-valid\ndata:\n  path: {data}\ntracking:\n  output_dir: {tmp_path / 'runs'}\n")
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "valid split" in err and "has no rows" in err and data in err and "valid/" in err
    assert not (tmp_path / "runs").exists()
