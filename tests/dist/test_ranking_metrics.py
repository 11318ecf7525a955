"""NE, calibration and GAUC over 2 and 3 gloo ranks (rayemb.train.worker.dist_metrics) equal a numpy reference of
every row on one process, to 1e-6.

The shares are unequal (one rank holds none), the scores tie often, and each group's rows are spread over the
ranks (the exchange must bring every group whole to one rank). Last, the job's ``evaluate`` carries a string group
column from the valid split's batches (padded, and padding-only on a rank with no rows) to the same GAUC.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _table_shard import TableShard

from rayemb.multiprocess import run_multiprocess

SHARES = {2: (650, 351), 3: (700, 0, 301)}


def _rows(tasks: int):
    rng = np.random.default_rng(11)
    n = 1001
    logits = np.round(rng.normal(size=(n, tasks)), 1)  # about 60 distinct values: ties everywhere
    labels = (rng.random((n, tasks)) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    groups = rng.integers(-20, 60, size=n)  # negative ids too (hashed string groups)
    return labels, logits, groups


def _rank(rank: int, world_size: int):
    from rayemb.train.worker.dist_metrics import distributed_validation_metrics

    lo = sum(SHARES[world_size][:rank])
    mine = slice(lo, lo + SHARES[world_size][rank])
    out = {}
    for tasks in (1, 2):
        labels, logits, groups = _rows(tasks)
        names = (["click", "like"], "like") if tasks > 1 else (None, None)
        out[tasks] = distributed_validation_metrics(labels[mine], logits[mine], *names, groups=groups[mine])
    return out


def _reference(labels: np.ndarray, logits: np.ndarray, groups: np.ndarray):
    """The definitions written out, row by row and group by group."""
    y, z = labels.astype(np.float64), logits.astype(np.float64)
    p = 1 / (1 + np.exp(-z))
    rate = y.mean()
    loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    total = weight = 0.0
    for g in np.unique(groups):
        gy, gz = y[groups == g], z[groups == g]
        pos, neg = gz[gy == 1], gz[gy == 0]
        if pos.size and neg.size:
            wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
            total += gy.size * wins / (pos.size * neg.size)
            weight += gy.size
    return {"valid_ne": loss / -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate)),
            "valid_calibration": p.sum() / y.sum(), "valid_gauc": total / weight}


@pytest.mark.parametrize("world", [2, 3])
def test_ne_calibration_and_gauc_equal_the_reference_of_every_row(world):
    ranks = run_multiprocess(_rank, world)
    for tasks in (1, 2):
        labels, logits, groups = _rows(tasks)
        for i, task in enumerate(["click", "like"][:tasks]):
            want = _reference(labels[:, i], logits[:, i], groups)
            assert 0.5 < want["valid_ne"] < 1.0 and 0.55 < want["valid_gauc"] < 0.95
            for got in (r[tasks] for r in ranks):
                for key, value in want.items():
                    name = f"{key}.{task}" if tasks > 1 else key
                    assert abs(got[name] - value) <= 1e-6, (world, tasks, name, got[name], value)
                    if tasks > 1 and task == "like":
                        assert got[key] == got[name]


def _valid_table():
    import pyarrow as pa

    rng = np.random.default_rng(5)
    n = 40
    score = np.round(rng.normal(size=n), 1)
    label = (rng.random(n) < 1 / (1 + np.exp(-score))).astype(np.float32)
    users = np.array(["ann", "bob", "cyd", "dee"])[rng.integers(0, 4, size=n)]
    return pa.table({"label": pa.array(label), "I1": pa.array(score.astype(np.float32)),
                     "C1": pa.array(np.zeros(n, np.int64)), "user": pa.array(users)})


def _evaluate_rank(rank: int, world_size: int):
    import functools

    import torch

    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import DatasetSchema
    from rayemb.train.worker.data_loader import RankBatches
    from rayemb.train.worker.validation import evaluate

    class Logit(torch.nn.Module):  # the dense value is the logit: the reference needs no model
        def forward(self, dense, sparse):
            return dense[:, 0]

    schema = DatasetSchema.from_dict({"label": "label", "dense": ["I1"], "dense_transform": "identity",
                                      "group": "user", "sparse": [{"name": "C1", "num_embeddings": 2}]})
    convert = BatchConverter(schema, keep_groups=True)
    out = {}
    for case, shares in {"uneven": (23, 17), "one_sided": (40, 0)}.items():
        mine = _valid_table().slice(sum(shares[:rank]), shares[rank])
        data = RankBatches(TableShard(mine), 8, functools.partial(convert, pad_to=8), in_memory=True,
                           first_batch_timeout_s=60.0, split="valid", rank=rank, shuffle=False, drop_last=False)
        out[case] = evaluate(Logit(), data, torch.device("cpu"), padding=lambda: convert.padding(8))
    return out


def test_evaluate_carries_the_group_column_to_gauc():
    from rayemb.embedding.raw_ids import raw_ids_to_int64
    from rayemb.train.worker.metrics import gauc

    table = _valid_table()
    y, z = table["label"].to_numpy(), table["I1"].to_numpy().astype(np.float64)
    want = gauc(y, z, raw_ids_to_int64(table["user"].to_numpy(zero_copy_only=False)))
    assert 0.5 < want < 1.0
    for ranks in run_multiprocess(_evaluate_rank, 2):
        for case, got in ranks.items():
            assert got["valid_rows"] == 40 and abs(got["valid_gauc"] - want) <= 1e-6, (case, got, want)
            assert abs(got["valid_ne"] - _reference(y, z, np.zeros(40))["valid_ne"]) <= 1e-6
