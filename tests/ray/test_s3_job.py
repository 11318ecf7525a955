"""A job whose data, outputs and checkpoints live on a real S3-compatible server (moto on 127.0.0.1).

The data is uploaded to the bucket, the job reads it there (schema, footers, the statistics
pass, its splits; this small dataset through the driver, and Ray Data's read tasks read the bucket when
`rayemb predict` scores it), writes plan.json/stats.json and its checkpoints there (Ray Train uploads them),
keeps MLflow in a local sqlite file. A real failure: one worker process SIGKILLs itself mid-epoch;
Ray Train restarts the group, which resumes from the newest checkpoint in the bucket and redoes only
the steps after it. A second job resumes from that same checkpoint by its s3:// URI and must end with
the killed job's weights, bit for bit. Its model is exported to the bucket and scores the bucket's
validation split into it. The fake secret key reaches the driver and the workers only through the
environment, and appears in no output, Ray log or MLflow record. (A damaged newest checkpoint under a
restarted group is tests/unit/test_checkpoint_retry.py; a node removed under an elastic job is
tests/cluster/test_elastic_node_loss.py.)
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from _servers import FAKE_SECRET_ACCESS_KEY, MotoS3Server
from _shared_ray import SharedRay
from mlflow.tracking import MlflowClient
from sklearn.metrics import roc_auc_score

from rayemb import storage
from rayemb.checkpoint.export import unsharded_state
from rayemb.checkpoint.reader import checkpoints_newest_first
from rayemb.publish import resolve
from rayemb.cli import main as rayemb_main
from rayemb.config import load_config
from rayemb.serve.model import InferenceModel

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BUCKET = "rayemb-jobs"
#: checkpoints every EVERY steps of the 40-step epoch; the first job's worker kills itself at KILL_AT
EVERY, KILL_AT = 20, 30
REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def s3_ray(tmp_path_factory):
    """moto's S3 server, its credentials in this module's environment, and a local 2-CPU Ray that inherits them.

    The workers get the credentials as the driver does: from the environment their node's Ray
    started in, never from the job config. Not through runtime_env env_vars either: Ray 2.60's
    runtime_env_agent.log records every env var of a runtime env, values included (docs/storage.md).
    """
    import ray

    server = MotoS3Server().start()
    server.create_bucket(BUCKET)
    workspace = tmp_path_factory.mktemp("workspace")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in server.env.items():
            mp.setenv(k, v)
        mp.setenv("RAYEMB_WORKSPACE", str(workspace))  # the local side of the remote output_dir
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        if ray.is_initialized():
            ray.shutdown()
        ray.init(**{**SharedRay.ARGS, "runtime_env": {  # the shared Ray's settings, started in this environment
            "env_vars": {"PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}}})
        session_dir = ray._private.worker._global_node.get_session_dir_path()
        try:
            yield server, session_dir, workspace
        finally:
            ray.shutdown()
            server.stop()


def _cfg(tmp_path, *extra):
    return load_config("jobs/configs/synth_small.yaml", [
        f"data.path=s3://{BUCKET}/data", f"tracking.output_dir=s3://{BUCKET}/runs",
        f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db", "tracking.experiment=s3",
        "data.batch_size=256", "train.epochs=1", "train.max_steps_per_epoch=40", "train.log_every_n_steps=10",
        "planner.calibrate=false", "data.in_memory=true", f"train.checkpoint_every_n_steps={EVERY}",
        "scaling.max_failures=2", *extra])


def _texts(root: Path):
    for p in root.rglob("*"):
        if p.is_file():
            try:
                yield p, p.read_bytes()
            except OSError:  # a socket or a file removed meanwhile
                continue


def _logged_steps(result):
    steps = [r["step"] for r in result.reports if "train_loss" in r]
    return {s: steps.count(s) for s in sorted(set(steps))}


def test_job_reads_writes_survives_a_killed_worker_and_resumes_on_s3(s3_ray, tiny_data, tmp_path, capfd, caplog,
                                                                     monkeypatch):
    from rayemb.constants import FAULT_INJECTION_ENV_VAR
    from rayemb.train.driver.trainer import run_training

    server, session_dir, workspace = s3_ray
    captured = []

    def take():
        c = capfd.readouterr()
        captured.append(c.out + c.err)
        return c

    storage.upload_dir(tiny_data, f"s3://{BUCKET}/data")

    marker = tmp_path / "killed"
    monkeypatch.setenv(FAULT_INJECTION_ENV_VAR, f"{KILL_AT}:{marker}:kill")
    first = run_training(_cfg(tmp_path))
    monkeypatch.delenv(FAULT_INJECTION_ENV_VAR)
    assert marker.exists() and first.status == "FINISHED" and first.metrics["valid_auc"] > 0.6, first.metrics
    assert first.tracking_uri == f"sqlite:///{tmp_path}/mlflow.db"
    # attempt 1 logged 10 and 20 and died at 30 (after the step-20 checkpoint); attempt 2 redid 21..40 only
    assert _logged_steps(first) == {10: 1, 20: 1, 30: 1, 40: 1}, _logged_steps(first)
    end = [r for r in first.reports if r.get("epoch_end")]
    assert [(r["step"], r["resumed_at_step"]) for r in end] == [(40, EVERY)]

    # checkpoints (meta.json + one .distcp per rank) are in the bucket, named by their s3:// URI
    last = first.last_checkpoint
    prefix = f"s3://{BUCKET}/runs/ray_results/"
    assert last.startswith(prefix), last
    key = last[len(f"s3://{BUCKET}/"):]
    keys = server.keys(BUCKET, key + "/")
    assert {f"{key}/meta.json", f"{key}/.metadata", f"{key}/__0_0.distcp", f"{key}/__1_0.distcp"} <= set(keys), keys
    meta = json.loads(storage.read_text(last + "/meta.json"))
    assert meta["step"] == 40 and meta["epoch"] == 0 and meta["world_size"] == 2
    # the job's files are there too, and the run's tags name the remote checkpoint
    client = MlflowClient(first.tracking_uri)
    run = client.get_run(first.run_id)
    job_id = run.data.tags["rayemb.last_checkpoint"][len(prefix):].split("/")[0]
    assert run.data.tags["rayemb.last_checkpoint"] == last
    job_keys = server.keys(BUCKET, f"runs/jobs/{job_id}/")
    assert {f"runs/jobs/{job_id}/{f}" for f in ("plan.json", "stats.json", "split.json")} <= set(job_keys), job_keys
    stats = json.loads(storage.read_text(f"s3://{BUCKET}/runs/jobs/{job_id}/stats.json"))
    assert stats["rows"] == 36_000 and stats["data_dir"] == f"s3://{BUCKET}/data"
    assert (workspace / "runs" / "jobs" / job_id / "plan.json").is_file()  # the local copy MLflow logged

    # the checkpoint commands take the URI
    assert rayemb_main(["checkpoint", "show", "--checkpoint", last]) == 0
    out = take().out
    start = out.index("{\n")
    shown = json.loads(out[start:out.index("\n}", start) + 2])
    assert shown["step"] == 40 and shown["world_size"] == 2 and shown["tables"] == 8
    out_file = tmp_path / "model.pt"
    assert rayemb_main(["checkpoint", "export", "--checkpoint", last, "--out", str(out_file)]) == 0
    model = torch.load(out_file, weights_only=True)
    assert model["meta"]["step"] == 40 and len(model["tables"]) == 8
    assert model["tables"]["C1"]["weight"].shape == (meta["tables"]["C1"]["num_embeddings"], 16)

    # a second job resumes from the checkpoint the restarted group resumed from, by its s3:// URI, reusing the
    # first job's s3:// stats.json (same data): a clean resume ends with the killed job's weights
    by_step = {json.loads(storage.read_text(c + "/meta.json"))["step"]: c
               for c in checkpoints_newest_first(last.rsplit("/", 1)[0])}
    assert {EVERY, 40} <= set(by_step), sorted(by_step)
    stats_uri = f"s3://{BUCKET}/runs/jobs/{job_id}/stats.json"
    with caplog.at_level(logging.INFO, logger="rayemb.data.stats_io"):
        second = run_training(_cfg(tmp_path, f"train.resume_from={by_step[EVERY]}", f"data.stats_path={stats_uri}"))
    assert f"reusing {stats_uri}" in caplog.text
    assert second.status == "FINISHED" and second.metrics["resumed_at_step"] == EVERY, second.metrics
    assert second.last_checkpoint.startswith(prefix) and second.last_checkpoint != last
    killed_state, clean_state = unsharded_state(last), unsharded_state(second.last_checkpoint)
    assert killed_state["meta"]["step"] == clean_state["meta"]["step"] == 40
    for name, states in killed_state["tables"].items():
        for state, tensor in states.items():
            assert torch.equal(tensor, clean_state["tables"][name][state]), (name, state)
    for key, tensor in killed_state["dense"].items():
        assert torch.equal(tensor, clean_state["dense"][key]), key

    # the model goes to the bucket and scores data there: export by run id, predict from and to s3://
    model_uri, preds = f"s3://{BUCKET}/models/synth", f"s3://{BUCKET}/preds"
    assert rayemb_main(["export", "--run-id", second.run_id, "--tracking-uri", second.tracking_uri,
                        "--checkpoint-kind", "last", "--out", model_uri]) == 0
    assert {"model.json", "model.pt"} <= set(storage.listdir(resolve(model_uri)))  # the version its marker names
    assert rayemb_main(["predict", "--model", model_uri, "--data", f"s3://{BUCKET}/data/valid", "--out", preds]) == 0
    with storage.local_copy(resolve(preds)) as local:
        scored = pq.read_table(local)
    valid = pq.read_table(os.path.join(tiny_data, "valid"))
    assert scored.num_rows == valid.num_rows and scored.column("label").equals(valid.column("label"))
    with storage.local_copy(resolve(model_uri)) as local:  # the same rows scored by the model read back from the bucket
        expected = InferenceModel.load(local).predict(valid)
    np.testing.assert_allclose(scored.column("prediction").to_numpy(), expected, rtol=0, atol=1e-6)
    assert roc_auc_score(valid.column("label").to_numpy(), expected) > 0.6
    assert not [k for k in server.keys(BUCKET) if "partial" in k]

    # the secret is nowhere: job output, the Ray session's logs, MLflow's records and artifacts
    take()
    everything = "\n".join(captured)
    assert "rayemb: MLflow run" in everything and f"s3://{BUCKET}/data" in everything  # the capture works
    assert FAKE_SECRET_ACCESS_KEY not in everything
    leaks = [str(p) for p, data in _texts(Path(session_dir) / "logs") if FAKE_SECRET_ACCESS_KEY.encode() in data]
    assert not leaks, leaks
    for result in (first, second):
        run = client.get_run(result.run_id)
        records = json.dumps({"params": run.data.params, "tags": run.data.tags})
        assert f"s3://{BUCKET}/data" in records and FAKE_SECRET_ACCESS_KEY not in records
        artifacts = Path(client.download_artifacts(result.run_id, "", str(tmp_path / "artifacts" / result.run_id)))
        texts = list(_texts(artifacts))
        assert any(p.name == "config.yaml" for p, _ in texts)
        assert not [p for p, data in texts if FAKE_SECRET_ACCESS_KEY.encode() in data]
    assert FAKE_SECRET_ACCESS_KEY.encode() not in (tmp_path / "mlflow.db").read_bytes()
    assert not [p for p, data in _texts(workspace) if FAKE_SECRET_ACCESS_KEY.encode() in data]  # local copies
