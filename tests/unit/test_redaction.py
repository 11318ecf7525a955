"""A secret written into a URI (``s3://user:SECRET@bucket/...``) never leaves the process it was given to.

``rayemb convert`` and ``rayemb export`` run for real on moto's S3 server (127.0.0.1; it takes any
credentials, so the URI's are used as they are) with every input and output named by such a URI. The
secret must appear in none of: stdout, stderr, the log records, any object written to the bucket, any
file written locally (MLflow's store and artifacts included), and the MLflow run's params and tags.
"""

from __future__ import annotations

import json
import logging
import os

import pytest
from _tiny_checkpoint import write_checkpoint
from test_convert import _with_bad_lines, criteo_rows, write_lines, write_tsv
from test_storage import BUCKET, moto_server, s3  # noqa: F401  (moto's server and its environment: fixtures)

from rayemb import storage
from rayemb.cli import main
from rayemb.data.schema import DatasetSchema
from rayemb.publish import resolve, resolve_dataset

SECRET = "SECRETxyz"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _uri(key: str) -> str:
    return f"s3://user:{SECRET}@{BUCKET}/{key}"


def _bucket_objects(prefix: str, server):
    """Every object under ``prefix`` with its bytes (read through boto3, not rayemb)."""
    client = server.client()
    return {k: client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in server.keys(BUCKET, prefix)}


def _local_files(root):
    for dirpath, _, names in os.walk(root):
        for n in names:
            path = os.path.join(dirpath, n)
            with open(path, "rb") as f:
                yield path, f.read()


def _assert_nowhere(capfd, caplog, server, prefix, local_root=None, logs=True):
    out, err = capfd.readouterr()
    assert out or err, "nothing was captured: the check would pass vacuously"
    assert SECRET not in out and SECRET not in err, (out[-2000:], err[-2000:])
    assert caplog.records or not logs, "no log record was captured: the check would pass vacuously"
    assert not [r.getMessage() for r in caplog.records if SECRET in r.getMessage()]
    objects = _bucket_objects(prefix, server)
    assert objects and not [k for k, data in objects.items() if SECRET.encode() in data or SECRET in k]
    if local_root is not None:
        files = list(_local_files(local_root))
        assert files and not [p for p, data in files if SECRET.encode() in data]
    return out + err


def test_convert_never_shows_the_secret_of_a_uri(s3, tmp_path, capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="rayemb")
    lines, _ = _with_bad_lines(criteo_rows())
    src = write_lines(tmp_path / "day_0", lines)
    valid = write_tsv(tmp_path / "day_23", criteo_rows()[:60])
    storage.upload_file(src, f"s3://{BUCKET}/red/raw/day_0")
    storage.upload_file(valid, f"s3://{BUCKET}/red/raw/day_23")
    args = ["convert", "criteo", "--input", _uri("red/raw/day_0"), "--valid-input", _uri("red/raw/day_23"),
            "--hash-buckets", "97", "--max-bad-fraction", "0.5", "--progress-every", "0"]
    assert main([*args, "--out", _uri("red/criteo")]) == 0
    shown = _assert_nowhere(capfd, caplog, s3, "red/")
    assert f"s3://***@{BUCKET}/red/criteo" in shown and "day_0 line 11" in shown  # the URI, redacted, is shown
    assert any("convert criteo" in r.getMessage() for r in caplog.records)  # progress lines were logged
    summary = json.loads(storage.read_text(storage.join(resolve_dataset(f"s3://{BUCKET}/red/criteo"),
                                                        "convert_summary.json")))
    assert summary["inputs"] == [f"s3://***@{BUCKET}/red/raw/day_0"]
    assert summary["bad_lines"]["examples"][0]["file"] == f"s3://***@{BUCKET}/red/raw/day_0"

    # to a local folder from the same inputs; and an input that does not exist (exit 2, the paragraph redacted)
    assert main([*args, "--out", str(tmp_path / "local")]) == 0
    assert main(["convert", "criteo", "--input", _uri("red/raw/missing"), "--out", _uri("red/other"),
                 "--hash-buckets", "9"]) == 2
    capfd_out = _assert_nowhere(capfd, caplog, s3, "red/", tmp_path / "local")
    assert f"s3://***@{BUCKET}/red/raw/missing" in capfd_out and "do not exist" in capfd_out


def test_export_never_shows_the_secret_of_a_uri(s3, tmp_path, capfd, caplog, monkeypatch):
    from mlflow import MlflowClient

    from rayemb.config import load_config
    from rayemb.serve.model import model_config

    caplog.set_level(logging.DEBUG, logger="rayemb")
    inputs, work = tmp_path / "inputs", tmp_path / "work"  # inputs hold the secret on purpose; work must not
    inputs.mkdir()
    work.mkdir()
    monkeypatch.chdir(work)
    day0 = write_tsv(inputs / "day_0", criteo_rows())
    assert main(["convert", "criteo", "--input", day0, "--out", _uri("exp/criteo"), "--hash-buckets", "11"]) == 0
    db = f"sqlite:///{work}/runs/mlflow.db"
    cfg = load_config(os.path.join(REPO, "jobs", "configs", "synth_small.yaml"), [
        f"data.path={_uri('exp/criteo')}", f"tracking.output_dir={work}/runs", f"tracking.tracking_uri={db}",
        "tracking.experiment=redaction"])
    (inputs / "job.yaml").write_text(cfg.to_yaml())
    schema = DatasetSchema.load(resolve_dataset(f"s3://{BUCKET}/exp/criteo"))
    ckpt = write_checkpoint(str(inputs / "ckpt"), schema, model_config(cfg))
    storage.upload_dir(ckpt, _uri("exp/ckpt"))
    capfd.readouterr()
    caplog.clear()

    assert main(["export", "--checkpoint", _uri("exp/ckpt"), "--config", str(inputs / "job.yaml"),
                 "--out", _uri("exp/model")]) == 0
    shown = _assert_nowhere(capfd, caplog, s3, "exp/", work)
    assert f"s3://***@{BUCKET}/exp/model" in shown
    info = json.loads(storage.read_text(storage.join(resolve(f"s3://{BUCKET}/exp/model"), "model.json")))
    assert info["source"]["data_path"].startswith(f"s3://***@{BUCKET}/exp/criteo/_v/")
    assert info["source"]["checkpoint"] == f"s3://***@{BUCKET}/exp/ckpt"

    client = MlflowClient(db)
    runs = client.search_runs([client.get_experiment_by_name("redaction").experiment_id])
    assert len(runs) == 1
    records = json.dumps({"params": runs[0].data.params, "tags": runs[0].data.tags})
    assert f"s3://***@{BUCKET}/exp/ckpt" in records and SECRET not in records
    logged = client.download_artifacts(runs[0].info.run_id, "config.yaml", str(tmp_path / "dl"))
    with open(logged) as f:
        text = f.read()
    assert f"s3://***@{BUCKET}/exp/criteo" in text and SECRET not in text
    assert (work / "runs" / "mlflow.db").is_file()


@pytest.mark.parametrize("uri", [_uri("x/y"), f"s3://{BUCKET}/x/y?secret_key={SECRET}&region=us-east-1"])
def test_resolve_and_publish_errors_are_redacted(s3, uri):
    from rayemb.errors import DataError
    from rayemb.publish import MARKER

    key = "x/y/" + MARKER
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=b"{not json")
    try:
        with pytest.raises(DataError) as e:
            resolve(uri)
        assert SECRET not in e.value.message and (MARKER in e.value.message or "?" in uri), e.value.message
    finally:
        s3.client().delete_object(Bucket=BUCKET, Key=key)
