"""RMSE, MAE and the weighted metrics (AUC included) over 2 and 3 gloo ranks (rayemb.train.worker.dist_metrics)
equal a numpy reference of every row on one process, to 1e-6.

The shares are unequal (one rank holds none) and one task is binary, one regression. Last, the job's
``evaluate`` carries the weight column from the valid split's batches (padded, and padding-only on a rank with
no rows) to the same weighted metrics.
"""

from __future__ import annotations

import numpy as np
import pytest
from _table_shard import TableShard

from rayemb.multiprocess import run_multiprocess

SHARES = {2: (650, 351), 3: (700, 0, 301)}
TASKS = ["click", "rating"]
KINDS = ["binary", "regression"]


def _rows():
    rng = np.random.default_rng(13)
    n = 1001
    logits = np.round(rng.normal(size=(n, 2)), 1)  # ties
    labels = np.stack([(rng.random(n) < 1 / (1 + np.exp(-logits[:, 0]))).astype(np.float32),
                       (logits[:, 1] + rng.normal(scale=0.7, size=n)).astype(np.float32)], 1)
    weights = rng.random(n) * 4
    weights[::17] = 0.0
    return labels, logits, weights


def _rank(rank: int, world_size: int):
    from rayemb.train.worker.dist_metrics import distributed_validation_metrics

    lo = sum(SHARES[world_size][:rank])
    mine = slice(lo, lo + SHARES[world_size][rank])
    labels, logits, weights = _rows()
    return {
        "plain": distributed_validation_metrics(labels[mine], logits[mine], TASKS, "rating", task_types=KINDS),
        "weighted": distributed_validation_metrics(labels[mine], logits[mine], TASKS, "rating", task_types=KINDS,
                                                   weights=weights[mine]),
        "single": distributed_validation_metrics(labels[mine, 1], logits[mine, 1], ["rating"],
                                                 task_types=["regression"], weights=weights[mine]),
    }


def _reference(labels: np.ndarray, logits: np.ndarray, w: np.ndarray):
    """The definitions written out over every row."""
    y, z = labels.astype(np.float64), logits.astype(np.float64)
    p = 1 / (1 + np.exp(-z[:, 0]))
    loss = np.sum(w * -(y[:, 0] * np.log(p) + (1 - y[:, 0]) * np.log(1 - p))) / w.sum()
    rate = np.sum(w * y[:, 0]) / w.sum()
    err = z[:, 1] - y[:, 1]
    positive, negative = y[:, 0] == 1, y[:, 0] == 0
    wins = (z[positive, 0][:, None] > z[negative, 0][None, :]) + 0.5 * (z[positive, 0][:, None]
                                                                        == z[negative, 0][None, :])
    pair_w = w[positive][:, None] * w[negative][None, :]
    return {"valid_auc.click": np.sum(wins * pair_w) / np.sum(pair_w), "valid_logloss.click": loss,
            "valid_ne.click": loss / -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate)),
            "valid_calibration.click": np.sum(w * p) / np.sum(w * y[:, 0]),
            "valid_rmse.rating": np.sqrt(np.sum(w * err ** 2) / w.sum()),
            "valid_mae.rating": np.sum(w * np.abs(err)) / w.sum()}


@pytest.mark.parametrize("world", [2, 3])
def test_rmse_mae_and_weighted_metrics_equal_the_reference_of_every_row(world):
    labels, logits, weights = _rows()
    want = {"plain": _reference(labels, logits, np.ones(len(labels))), "weighted": _reference(labels, logits, weights)}
    for key in ("valid_rmse.rating", "valid_auc.click"):
        assert abs(want["plain"][key] - want["weighted"][key]) > 1e-4  # the weights matter
    for got in run_multiprocess(_rank, world):
        for case, reference in want.items():
            for key, value in reference.items():
                assert abs(got[case][key] - value) <= 1e-6, (world, case, key, got[case][key], value)
            assert got[case]["valid_rmse"] == got[case]["valid_rmse.rating"] and "valid_auc.rating" not in got[case]
            assert got[case]["valid_rows"] == len(labels)
        single = got["single"]
        assert abs(single["valid_rmse"] - want["weighted"]["valid_rmse.rating"]) <= 1e-6
        assert abs(single["valid_mae"] - want["weighted"]["valid_mae.rating"]) <= 1e-6 and "valid_auc" not in single


def _valid_table():
    import pyarrow as pa

    rng = np.random.default_rng(6)
    n = 40
    score = rng.normal(size=n)
    rating = score + rng.normal(scale=0.5, size=n)
    return pa.table({"rating": pa.array(rating.astype(np.float32)), "I1": pa.array(score.astype(np.float32)),
                     "C1": pa.array(np.zeros(n, np.int64)), "w": pa.array(rng.random(n) * 2)})


def _evaluate_rank(rank: int, world_size: int):
    import functools

    import torch

    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import DatasetSchema
    from rayemb.train.worker.data_loader import RankBatches
    from rayemb.train.worker.validation import evaluate

    class Output(torch.nn.Module):  # the dense value is the output: the reference needs no model
        def forward(self, dense, sparse):
            return dense[:, 0]

    schema = DatasetSchema.from_dict({"label": "rating", "task_types": {"rating": "regression"}, "weight": "w",
                                      "dense": ["I1"], "dense_transform": "identity",
                                      "sparse": [{"name": "C1", "num_embeddings": 2}]})
    convert = BatchConverter(schema)
    out = {}
    for case, shares in {"uneven": (23, 17), "one_sided": (40, 0)}.items():
        mine = _valid_table().slice(sum(shares[:rank]), shares[rank])
        data = RankBatches(TableShard(mine), 8, functools.partial(convert, pad_to=8), in_memory=True,
                           first_batch_timeout_s=60.0, split="valid", rank=rank, shuffle=False, drop_last=False)
        out[case] = evaluate(Output(), data, torch.device("cpu"), padding=lambda: convert.padding(8),
                             tasks=schema.labels, task_types=schema.task_kinds)
    return out


def test_evaluate_carries_the_weight_column_to_the_weighted_metrics():
    table = _valid_table()
    y, z = table["rating"].to_numpy().astype(np.float64), table["I1"].to_numpy().astype(np.float64)
    w = table["w"].to_numpy()
    err = z - y
    rmse, mae = np.sqrt(np.sum(w * err ** 2) / w.sum()), np.sum(w * np.abs(err)) / w.sum()
    assert abs(rmse - np.sqrt(np.mean(err ** 2))) > 1e-4  # the weights matter
    for ranks in run_multiprocess(_evaluate_rank, 2):
        for case, got in ranks.items():
            assert got["valid_rows"] == 40, (case, got)
            assert abs(got["valid_rmse"] - rmse) <= 1e-6 and abs(got["valid_mae"] - mae) <= 1e-6, (case, got)
