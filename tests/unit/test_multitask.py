"""Several label columns: the schema, the generated second label, the batches, the loss and the metrics per task."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rayemb.data.schema import DatasetSchema
from rayemb.errors import ConfigError

SCHEMA = {"label": ["click", "like"], "dense": ["I1"], "sparse": [{"name": "C1", "num_embeddings": 10}]}


def test_schema_yaml_lists_one_label_per_task_and_reads_back():
    s = DatasetSchema.from_dict(SCHEMA)
    assert s.labels == ["click", "like"] and s.label == "click" and s.extra_labels == ("like",)
    assert DatasetSchema.from_dict(s.to_dict()) == s
    single = DatasetSchema.from_dict({**SCHEMA, "label": "click"})
    assert single.labels == ["click"] and single.to_dict()["label"] == "click"  # one task: written as before


def test_a_second_label_leaves_the_data_without_it_byte_identical_and_is_its_own_task(tmp_path):
    from rayemb.data.synthetic import SyntheticSpec, generate

    args = dict(rows=20_000, num_tables=8, seed=3, num_signal_tables=3, valid_fraction=0.1)
    plain = generate(SyntheticSpec(**args), str(tmp_path / "plain"))
    two = generate(SyntheticSpec(**args, second_label=True), str(tmp_path / "two"))
    assert plain.labels == ["label"] and two.labels == ["label", "like"]
    a = pq.read_table(tmp_path / "plain" / "train" / "part-00000.parquet")
    b = pq.read_table(tmp_path / "two" / "train" / "part-00000.parquet")
    assert b.drop(["like"]).equals(a)
    y1, y2 = a["label"].to_numpy(), b["like"].to_numpy()
    assert 0.1 < y2.mean() < 0.6
    assert abs(np.corrcoef(y1, y2)[0, 1]) <= 0.5
    # `like` follows tables C4..C6 (after the first label's C1..C3): its rate differs across C4's frequent ids
    c4 = b["C4"].to_numpy()
    top = np.bincount(c4).argsort()[::-1][:5]
    rates = [y2[c4 == t].mean() for t in top]
    assert max(rates) - min(rates) > 0.1, rates


def test_second_label_needs_tables_of_its_own():
    from rayemb.data.synthetic import SyntheticSpec
    from rayemb.errors import DataError

    with pytest.raises(DataError, match="second_label needs tables beyond"):
        SyntheticSpec(rows=10, num_tables=3, num_signal_tables=3, second_label=True)


def test_batches_carry_one_label_column_per_task():
    from rayemb.data.batching import BatchConverter

    s = DatasetSchema.from_dict(SCHEMA)
    t = pa.table({"click": pa.array([1.0, 0.0, 1.0], pa.float32()), "like": pa.array([0.0, 0.0, 1.0], pa.float32()),
                  "I1": pa.array([1.0, 2.0, 3.0], pa.float32()), "C1": pa.array([1, 2, 3], pa.int64())})
    b = BatchConverter(s)(t)
    assert b.labels.tolist() == [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    padded = BatchConverter(s)(t, pad_to=5)
    assert padded.labels.shape == (5, 2) and padded.mask.tolist() == [True] * 3 + [False] * 2
    assert BatchConverter(s).padding(4).labels.shape == (4, 2)


def test_the_loss_weighs_each_tasks_cross_entropy():
    from rayemb.train.worker.losses import TaskLoss

    out, y = torch.tensor([[0.5, -1.0], [2.0, 0.3]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    got = TaskLoss(["click", "like"], {"like": 3.0})(out, y)
    assert torch.allclose(got, bce(out[:, 0], y[:, 0]) + 3.0 * bce(out[:, 1], y[:, 1]))
    one = TaskLoss(["click"])
    assert torch.equal(one(out[:, 0], y[:, 0]), bce(out[:, 0], y[:, 0]))
    with pytest.raises(ConfigError, match=r"need \(B, 2\) logits, one column per label") as e:
        TaskLoss(["click", "like"])(out[:, 0], y)
    assert e.value.category == "bad_model_output"
    mine = TaskLoss(["click", "like"], user_loss=lambda o, t: (o - t).abs().sum())
    assert float(mine(out, y)) == pytest.approx(float((out - y).abs().sum()))


def test_a_task_the_config_names_must_be_a_label_column():
    from rayemb.train.worker.losses import check_tasks

    check_tasks(["click", "like"], {"like": 2.0}, "like")
    with pytest.raises(ConfigError, match=r"train.task_weights.share='share': no such label column.*\['click', "
                                          r"'like'\]") as e:
        check_tasks(["click", "like"], {"share": 1.0}, None)
    assert e.value.category == "unknown_task"
    with pytest.raises(ConfigError, match="train.early_stopping_task='ctr'"):
        check_tasks(["click"], {}, "ctr")


def test_validation_reports_every_task_and_the_chosen_one_as_valid_auc():
    from rayemb.train.worker.metrics import auc, validation_metrics

    rng = np.random.default_rng(0)
    y = (rng.random((400, 2)) < 0.4).astype(np.float32)
    z = np.stack([y[:, 0] + rng.normal(0, 1, 400), y[:, 1] + rng.normal(0, 3, 400)], axis=1)
    m = validation_metrics(y, z, ["click", "like"], primary="like")
    assert m["valid_auc.click"] == pytest.approx(auc(y[:, 0], z[:, 0]))
    assert m["valid_auc.like"] == pytest.approx(auc(y[:, 1], z[:, 1])) and m["valid_auc.click"] > m["valid_auc.like"]
    assert m["valid_auc"] == m["valid_auc.like"] and m["valid_logloss"] == m["valid_logloss.like"]
    assert m["valid_rows"] == 400
    assert set(validation_metrics(y[:, 0], z[:, 0], ["click"])) == {"valid_auc", "valid_logloss", "valid_ne",
                                                                    "valid_calibration", "valid_rows"}


@pytest.mark.parametrize("name", ["dlrm", "dcn_v2"])
def test_shipped_models_give_one_logit_per_label(name):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rayemb.config import config_from_dict
    from rayemb.contract.factory import model_spec
    from rayemb.train.sharding import build_model

    cfg = config_from_dict({"name": "t", "data": {"path": "d"}, "model": {"name": name, "embedding_dim": 4,
                                                                          "bottom_mlp": [4], "top_mlp": [8, 1]}})
    cpu = torch.device("cpu")
    model, _, _ = build_model(cfg, DatasetSchema.from_dict(SCHEMA), {}, {}, cpu, cpu, model=model_spec(cfg.model))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["C1"], values=torch.tensor([1, 2, 3]),
                                              lengths=torch.ones(3, dtype=torch.int32))
    assert model(torch.rand(3, 1), kjt).shape == (3, 2)
