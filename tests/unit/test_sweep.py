"""Sweeps make one child run per value under one parent run (real MLflow sqlite store)."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from rayemb.errors import ConfigError
from rayemb.tracking import TAG_FAILURE_REASON, TAG_KIND, TAG_PARENT_RUN_ID, RunLogger, ensure_store
from rayemb.tracking.sweep import parse_sweep, run_sweep


def test_parse_sweep():
    assert parse_sweep("model.embedding_dim=8,16") == ("model.embedding_dim", ["8", "16"])
    assert parse_sweep(" train.dense_lr = 0.1, 0.01 ") == ("train.dense_lr", ["0.1", "0.01"])
    assert parse_sweep("model.bottom_mlp=[64,16],[32,16]") == ("model.bottom_mlp", ["[64,16]", "[32,16]"])
    assert parse_sweep("tag='a,b',c") == ("tag", ["'a,b'", "c"])
    for bad in ("model.embedding_dim", "=1,2", "k=1,,2", "k=", "k=1,1"):
        with pytest.raises(ConfigError) as e:
            parse_sweep(bad)
        assert e.value.category == "invalid_sweep"


def _uri(tmp_path):
    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    ensure_store(uri)
    return uri


@pytest.mark.timeout(120)
def test_sweep_over_two_values_makes_two_children_under_one_parent(tmp_path):
    uri = _uri(tmp_path)
    calls = []

    def run_one(overrides, parent_run_id):
        calls.append((list(overrides), parent_run_id))
        child = RunLogger(uri, "sweepexp", run_name=f"child{len(calls)}", parent_run_id=parent_run_id,
                          flush_interval_s=0.05, system_metrics_interval_s=None).start()
        child.log_params(dict(o.split("=", 1) for o in overrides))
        child.log_metrics({"auc": 0.6 + 0.1 * len(calls)}, step=0)
        return 0 if child.finish() else 1

    rc = run_sweep(["train.epochs=1"], ["model.embedding_dim=8,16"], run_one, uri, "sweepexp")
    assert rc == 0
    assert [o for o, _ in calls] == [["train.epochs=1", "model.embedding_dim=8"],
                                     ["train.epochs=1", "model.embedding_dim=16"]]
    parent_id = calls[0][1]
    assert parent_id is not None and calls[1][1] == parent_id

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("sweepexp")
    children = client.search_runs([exp.experiment_id], f"tags.`{TAG_PARENT_RUN_ID}` = '{parent_id}'",
                                  order_by=["attributes.start_time ASC"])
    assert [r.data.params["model.embedding_dim"] for r in children] == ["8", "16"]
    assert all(r.info.status == "FINISHED" for r in children)
    parent = client.get_run(parent_id)
    assert parent.data.tags[TAG_KIND] == "sweep"
    assert parent.info.status == "FINISHED"
    assert parent.data.params["sweep.model.embedding_dim"] == "8,16"
    assert parent.data.metrics["sweep.jobs_done"] == 2.0
    assert len(client.search_runs([exp.experiment_id])) == 3


@pytest.mark.timeout(120)
def test_sweep_grid_keeps_going_after_a_failed_job_and_fails_the_parent(tmp_path):
    uri = _uri(tmp_path)
    seen = []

    def run_one(overrides, parent_run_id):
        seen.append(overrides[-2:])
        return 3 if overrides[-1] == "train.dense_lr=0.5" and overrides[-2] == "model.embedding_dim=8" else 0

    rc = run_sweep([], ["model.embedding_dim=8,16", "train.dense_lr=0.1,0.5"], run_one, uri, "grid")
    assert rc == 3
    assert seen == [["model.embedding_dim=8", "train.dense_lr=0.1"], ["model.embedding_dim=8", "train.dense_lr=0.5"],
                    ["model.embedding_dim=16", "train.dense_lr=0.1"], ["model.embedding_dim=16", "train.dense_lr=0.5"]]
    client = MlflowClient(uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("grid").experiment_id])
    assert parent.info.status == "FAILED"
    assert parent.data.tags[TAG_FAILURE_REASON] == (
        "1 of 4 sweep jobs failed: model.embedding_dim=8 train.dense_lr=0.5 (exit 3)")
    assert parent.data.metrics["sweep.jobs_failed"] == 1.0

    with pytest.raises(ConfigError):
        run_sweep([], ["a=1,2", "a=3"], run_one, uri, "grid")
