"""A stopped trial's MLflow run holds every validation it reported to Tune, whichever of Tune's end of the trial and
the sweep's end settles it first (a real MLflow sqlite store)."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from rayemb.sweep.engine import TrialRuns, _make_callback, record_stop
from rayemb.sweep.trial import trial_job_name
from rayemb.tracking import ensure_store
from rayemb.tracking.store import artifact_location

REASON = "asha: valid_auc=0.8847 below the median of the trials at validation 2 (epoch 1)"
#: what the trial reported to Tune: its run's writer sent the first only before its process ended
REPORTED = [{"step": 4, "valid_auc": 0.8512, "valid_logloss": 0.41},
            {"step": 8, "valid_auc": 0.8847, "valid_logloss": 0.39}]


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    ensure_store(uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("sweep", artifact_location=artifact_location(uri, "sweep"))
    parent = client.create_run(exp, run_name="sweep", tags={"rayemb.kind": "sweep"}).info.run_id
    run = client.create_run(exp, tags={"mlflow.parentRunId": parent,
                                       "rayemb.job_name": trial_job_name("job", "t_00001")}).info.run_id
    client.log_metric(run, "valid_auc", 0.8512, step=4)
    client.log_metric(run, "valid_logloss", 0.41, step=4)
    # the job ends its own run when its aborted Ray Train run raises
    client.set_tag(run, "rayemb.failure_reason", "RayActorError: The actor died")
    client.set_terminated(run, "FAILED")
    stopped = str(tmp_path / "stopped.json")
    record_stop(stopped, "t_00001", REASON)
    return TrialRuns(uri, parent, "job", stopped), client, run


def _history(client, run, key):
    return [(m.step, m.value) for m in client.get_metric_history(run, key)]


def _check(client, run):
    got = client.get_run(run)
    assert got.info.status == "KILLED" and got.data.tags["rayemb.stopped_reason"] == REASON
    assert "rayemb.failure_reason" not in got.data.tags
    assert got.data.tags["rayemb.sweep.trial_id"] == "t_00001"
    assert _history(client, run, "valid_auc") == [(4, 0.8512), (8, 0.8847)]
    assert _history(client, run, "valid_logloss") == [(4, 0.41), (8, 0.39)]


def test_settled_first_with_nothing_then_with_what_was_reported(store):
    runs, client, run = store
    assert runs.settle("t_00001").info.status == "KILLED"
    assert runs.settle("t_00001", REPORTED).data.metrics["valid_auc"] == 0.8847
    _check(client, run)


def test_settled_first_with_what_was_reported_then_again(store):
    runs, client, run = store
    runs.settle("t_00001", REPORTED)
    runs.settle("t_00001", REPORTED)
    runs.settle("t_00001")
    _check(client, run)  # nothing logged twice


def test_tunes_end_of_the_trial_settles_it_with_every_result_it_saw(store):
    runs, client, run = store
    callback = _make_callback(runs)

    class Trial:
        trial_id = "t_00001"

    for r in REPORTED:
        callback.on_trial_result(0, [], Trial(), {**r, "training_iteration": 1, "trial_id": "t_00001"})
    callback.on_trial_complete(0, [], Trial())
    _check(client, run)
