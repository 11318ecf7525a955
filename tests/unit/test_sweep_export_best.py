"""Exporting a sweep's best trial: chosen by the sweep's metric among finished and stopped trials, exported and
registered through `rayemb export --run-id`'s path, in a real MLflow sqlite store with a real checkpoint."""

from __future__ import annotations

import json
import sys

import pytest
from _tiny_checkpoint import write_checkpoint
from mlflow import MlflowClient

from rayemb.tracking import ensure_store
from rayemb.tracking.store import artifact_location

NAME = "sweep-best"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep of four trials; only the best scored one (stopped early) has a checkpoint and a config.yaml."""
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.synthetic import SyntheticSpec, generate
    from rayemb.serve.model import model_config

    root = tmp_path_factory.mktemp("sweep_best")
    data = str(root / "data")
    generate(SyntheticSpec(rows=120, num_tables=2, seed=1, cardinalities=[10, 20], valid_fraction=0.25), data)
    cfg = config_from_dict({"name": "sweep-best", "data": {"path": data},
                            "model": {"embedding_dim": 4, "bottom_mlp": [4], "top_mlp": [4, 1]},
                            "tracking": {"output_dir": str(root / "runs"), "experiment": "sweep-best"}})
    checkpoint = write_checkpoint(str(root / "ckpt"), DatasetSchema.load(data), model_config(cfg), seed=1)

    uri = f"sqlite:///{root.resolve()}/mlflow.db"
    ensure_store(uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("sweep-best", artifact_location=artifact_location(uri, "sweep-best"))
    parent = client.create_run(exp, run_name="sweep", tags={"rayemb.kind": "sweep"}).info.run_id
    for k, v in {"sweep.keys": "model.embedding_dim", "sweep.metric": "valid_auc", "sweep.mode": "max"}.items():
        client.log_param(parent, k, v)
    ids = {}
    # name -> (status, valid_auc at steps 1, 2, ...)
    for name, (status, aucs) in {"low": ("FINISHED", [0.60, 0.62]), "best": ("KILLED", [0.70, 0.71]),
                                 "failed": ("FAILED", [0.90]), "running": ("RUNNING", [0.95])}.items():
        run = client.create_run(exp, run_name=name, tags={"mlflow.parentRunId": parent,
                                                          "rayemb.sweep.trial_id": name}).info.run_id
        client.log_param(run, "model.embedding_dim", "4")
        for step, auc in enumerate(aucs, start=1):
            client.log_metric(run, "valid_auc", auc, step=step)
        if name == "best":
            client.log_metric(run, "valid_auc", 0.71, step=3)  # the checkpoint's step (tests/_tiny_checkpoint.py)
            client.set_tag(run, "rayemb.best_checkpoint", checkpoint)
            client.log_text(run, cfg.to_yaml(), "config.yaml")
        if status != "RUNNING":
            client.set_terminated(run, status)
        ids[name] = run
    return {"uri": uri, "parent": parent, "ids": ids, "root": root}


@pytest.mark.timeout(300)
def test_the_best_trial_is_exported_and_registered_as_rayemb_export_does(sweep, tmp_path, monkeypatch):
    from rayemb.sweep.best import best_trial, export_best

    monkeypatch.chdir(tmp_path)  # nothing MLflow writes may land in the repository
    monkeypatch.setattr(sys, "path", list(sys.path))
    uri, best = sweep["uri"], sweep["ids"]["best"]
    assert best_trial(sweep["parent"], uri) == best  # the failed and the running trials scored higher

    out = tmp_path / "model"
    summary = export_best(sweep["parent"], NAME, uri, out=str(out))
    assert (summary["run_id"], summary["registered"], str(summary["version"])) == (best, NAME, "1")
    assert summary["metrics"]["valid_auc"] == 0.71
    info = json.loads((out / "model.json").read_text())
    assert info["source"]["run_id"] == best and info["source"]["checkpoint_kind"] == "best"

    client = MlflowClient(uri)
    version = client.get_model_version(NAME, "1")
    assert version.run_id == best and version.source == summary["model_uri"]
    assert version.tags["rayemb.run_id"] == best
    assert client.get_run(best).data.tags["rayemb.model_uri"] == summary["model_uri"]

    again = export_best(sweep["parent"], NAME, uri)  # no out: only the logged and registered copy
    assert (again["run_id"], str(again["version"]), again["out"]) == (best, "2", None)
    assert client.get_model_version(NAME, "2").source == again["model_uri"] != summary["model_uri"]


def test_a_sweep_without_a_scored_trial_has_no_best(sweep, tmp_path):
    from rayemb.errors import TrackingError
    from rayemb.sweep.best import best_trial

    client = MlflowClient(sweep["uri"])
    exp = client.get_experiment_by_name("sweep-best").experiment_id
    parent = client.create_run(exp, run_name="sweep-failed", tags={"rayemb.kind": "sweep"}).info.run_id
    for k, v in {"sweep.keys": "model.embedding_dim", "sweep.metric": "valid_auc", "sweep.mode": "max"}.items():
        client.log_param(parent, k, v)
    run = client.create_run(exp, run_name="broke", tags={"mlflow.parentRunId": parent}).info.run_id
    client.log_metric(run, "valid_auc", 0.9, step=1)
    client.set_terminated(run, "FAILED")
    with pytest.raises(TrackingError) as e:
        best_trial(parent, sweep["uri"])
    assert e.value.category == "no_runs" and "FAILED" in str(e.value)
