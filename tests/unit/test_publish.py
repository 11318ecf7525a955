"""Outputs published to a bucket (moto's S3 server on 127.0.0.1) and read back through ``resolve``.

A remote output is a version under ``<out>/_v/`` that only ``<out>/_PUBLISHED.json`` makes visible:
read back whole; an overwrite leaves the old version readable until the marker flips, and stored for the
grace period after; a writer killed with SIGKILL mid-upload leaves the previous output what readers get and
nothing that reads as complete; an output written before versioning is still read, with a warning; and
training, export and predict read datasets and models through it. Racing publishers: test_publish_concurrent.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from _tiny_checkpoint import write_checkpoint
from test_convert import criteo_rows, run, write_tsv
from test_storage import BUCKET, moto_server, s3  # noqa: F401  (moto's server and its environment: fixtures)

from rayemb import publish, storage
from rayemb.cli import main
from rayemb.data.schema import load_checked, parquet_files
from rayemb.constants import PUBLISH_GRACE_ENV_VAR
from rayemb.errors import ConfigError, DataError
from rayemb.publish import MARKER, cleanup, has_output, publish_dir, read_marker, resolve, resolve_dataset

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: the test's own child: `rayemb` run with every upload counted, and SIGKILL sent to itself after N of them
KILLED_CHILD = """
import os, signal, sys, threading
from rayemb import storage
after, real, lock, done = int(os.environ["TEST_KILL_AFTER_UPLOADS"]), storage.upload_file, threading.Lock(), [0]
def upload_then_maybe_die(src, dest):
    out = real(src, dest)
    with lock:
        done[0] += 1
        if done[0] >= after:
            os.kill(os.getpid(), signal.SIGKILL)
    return out
storage.upload_file = upload_then_maybe_die
from rayemb.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _stage(root, files):
    os.makedirs(root)
    for rel, data in files.items():
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return str(root)


def _read_all(root):
    with storage.local_copy(root) as local:
        out = {}
        for dirpath, _, names in os.walk(local):
            for n in names:
                with open(os.path.join(dirpath, n), "rb") as f:
                    out[os.path.relpath(os.path.join(dirpath, n), local).replace(os.sep, "/")] = f.read()
        return out


def _key(uri):
    return uri[len(f"s3://{BUCKET}/"):]


def _rows(data_dir, split="train"):
    paths, fs = storage.for_ray_data(parquet_files(data_dir, split))  # what training hands to ray.data.read_parquet
    return pq.read_table(paths, filesystem=fs).to_pylist()


def _kill_midway(tmp_path, env, after, *argv):
    script = tmp_path / "killed_child.py"
    script.write_text(KILLED_CHILD)
    p = subprocess.run([sys.executable, str(script), *map(str, argv)], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env={**os.environ, **env, "TEST_KILL_AFTER_UPLOADS": str(after)})
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-3000:])


# ---- (1) PUBLISH, THEN READ BACK ---- #


def test_published_output_reads_back_through_resolve(s3, tmp_path):
    files = {"schema.yaml": b"label: y\n", "train/part-00000.parquet": os.urandom(5000),
             "train/part-00001.parquet": b"x" * 10, "valid/part-00000.parquet": b"v" * 7}
    staging = _stage(tmp_path / "stage", files)
    out = f"s3://{BUCKET}/one/out"
    target = publish_dir(staging, out)
    assert not os.path.exists(staging)
    marker = read_marker(out)
    assert target == f"{out}/{marker['version']}" and marker["version"].startswith("_v/")
    assert marker["files"] == {k: len(v) for k, v in files.items()} and marker["bytes"] == sum(map(len, files.values()))
    assert resolve(out) == target and _read_all(resolve(out)) == files
    assert s3.keys(BUCKET, "one/out/") == sorted([f"one/out/{MARKER}"] + [f"one/out/{marker['version']}/{k}"
                                                                           for k in files])
    # a path under the output reads the same path of the published version
    assert resolve(f"{out}/train") == f"{target}/train"
    assert resolve(f"{out}/valid/part-00000.parquet") == f"{target}/valid/part-00000.parquet"
    assert resolve(f"{out}/nothing/here") == f"{target}/nothing/here"
    assert has_output(out) and not has_output(f"s3://{BUCKET}/one/elsewhere")

    # a local output is renamed into place: no marker, read as it is
    local = str(tmp_path / "local_out")
    assert publish_dir(_stage(tmp_path / "stage2", files), local) == local
    assert resolve(local) == local and _read_all(local) == files and MARKER not in os.listdir(local)


def test_a_version_damaged_after_publishing_is_refused_not_read(s3, tmp_path, capsys):
    out = f"s3://{BUCKET}/damaged/out"
    target = publish_dir(_stage(tmp_path / "s", {"schema.yaml": b"s", "train/a.parquet": b"aaaa"}), out)
    s3.client().delete_object(Bucket=BUCKET, Key=_key(target) + "/train/a.parquet")
    with pytest.raises(DataError) as e:
        resolve(out)
    assert e.value.category == "bad_output" and "train/a.parquet" in e.value.message
    # what a user sees: one paragraph and exit code 2, before any work
    assert main(["predict", "--model", "unused", "--data", f"{out}/train", "--out", str(tmp_path / "p")]) == 2
    assert "is damaged" in capsys.readouterr().err


# ---- (2) OVERWRITE: OLD UNTIL THE MARKER FLIPS, KEPT FOR THE GRACE PERIOD AFTER ---- #


def test_overwrite_keeps_the_old_version_until_the_marker_flips(s3, tmp_path, monkeypatch):
    out = f"s3://{BUCKET}/two/out"
    old_files, new_files = {"data.txt": b"one", "sub/a.txt": b"1"}, {"data.txt": b"two-two", "sub/b.txt": b"22"}
    old = publish_dir(_stage(tmp_path / "s1", old_files), out)

    # without overwrite an existing output is refused, and the refused upload is not left behind
    with pytest.raises(DataError) as e:
        publish_dir(_stage(tmp_path / "s2", new_files), out)
    assert e.value.category == "output_exists"
    assert resolve(out) == old and storage.listdir(f"{out}/_v") == [old.rsplit("/", 1)[1]]

    seen = {}
    real = publish.write_marker

    def at_the_commit_point(dest, doc, *tag):
        new = storage.join(dest, doc["version"])
        seen["read"] = resolve(dest)
        seen["old"], seen["new"] = _read_all(seen["read"]), _read_all(new)  # the new version is all there...
        with pytest.raises(DataError) as refused:  # ...and not readable: no marker names it yet
            resolve(new)
        seen["refused"] = refused.value.category
        return real(dest, doc, *tag)

    monkeypatch.setattr(publish, "write_marker", at_the_commit_point)
    new = publish_dir(_stage(tmp_path / "s3", new_files), out, overwrite=True)
    assert seen == {"read": old, "old": old_files, "new": new_files, "refused": "unpublished_output"}
    assert resolve(out) == new != old and _read_all(new) == new_files
    marker = read_marker(out)
    assert marker["replaces"] == old[len(out) + 1:] and list(marker["retired"]) == [marker["replaces"]]
    assert _read_all(old) == old_files  # a job that resolved it before the switch reads it to the end
    assert cleanup(out) == [] and _read_all(old) == old_files  # younger than the grace period: kept
    assert cleanup(out, grace_s=0) == [marker["replaces"]]
    assert s3.keys(BUCKET, _key(old) + "/") == [] and storage.listdir(f"{out}/_v") == [new.rsplit("/", 1)[1]]
    assert resolve(out) == new and _read_all(new) == new_files


def test_a_publish_deletes_what_was_retired_longer_ago_than_the_grace_period(s3, tmp_path, monkeypatch):
    out = f"s3://{BUCKET}/grace/out"
    first = publish_dir(_stage(tmp_path / "s1", {"a.txt": b"1"}), out)
    second = publish_dir(_stage(tmp_path / "s2", {"a.txt": b"22"}), out, overwrite=True)
    assert sorted(storage.listdir(f"{out}/_v")) == sorted(v.rsplit("/", 1)[1] for v in (first, second))

    monkeypatch.setenv(PUBLISH_GRACE_ENV_VAR, "soon")  # bad input: refused before anything is uploaded
    before = s3.keys(BUCKET, "grace/")
    with pytest.raises(ConfigError) as e:
        publish_dir(_stage(tmp_path / "s3", {"a.txt": b"333"}), out, overwrite=True)
    assert e.value.category == "bad_config" and PUBLISH_GRACE_ENV_VAR in e.value.message
    assert s3.keys(BUCKET, "grace/") == before

    monkeypatch.setenv(PUBLISH_GRACE_ENV_VAR, "0")
    third = publish_dir(_stage(tmp_path / "s4", {"a.txt": b"4444"}), out, overwrite=True)
    assert storage.listdir(f"{out}/_v") == [third.rsplit("/", 1)[1]] and _read_all(resolve(out)) == {"a.txt": b"4444"}
    assert sorted(read_marker(out)["retired"]) == [first[len(out) + 1:], second[len(out) + 1:]]
    fourth = publish_dir(_stage(tmp_path / "s5", {"a.txt": b"5"}), out, overwrite=True)
    assert list(read_marker(out)["retired"]) == [third[len(out) + 1:]]  # what is gone is no longer listed
    assert storage.listdir(f"{out}/_v") == [fourth.rsplit("/", 1)[1]]


def test_a_failed_upload_leaves_the_published_version_and_removes_its_own(s3, tmp_path, monkeypatch):
    out = f"s3://{BUCKET}/failed/out"
    old = publish_dir(_stage(tmp_path / "s1", {"a.txt": b"a"}), out)
    real, calls = storage.upload_file, []

    def fail_on_the_third(src, dest):
        calls.append(dest)
        if len(calls) == 3:
            raise DataError(f"Cannot write {dest!r} (injected).", category="storage")
        return real(src, dest)

    monkeypatch.setattr(storage, "upload_file", fail_on_the_third)
    with pytest.raises(DataError, match="injected"):
        publish_dir(_stage(tmp_path / "s2", {f"f{i}.txt": b"b" * i for i in range(6)}), out, overwrite=True)
    assert resolve(out) == old and _read_all(old) == {"a.txt": b"a"}
    assert storage.listdir(f"{out}/_v") == [old.rsplit("/", 1)[1]]


# ---- (3) KILL -9 IN THE MIDDLE OF AN UPLOAD ---- #


def test_a_writer_killed_mid_upload_leaves_the_previous_output(s3, tmp_path):
    day0 = write_tsv(tmp_path / "day_0", criteo_rows())
    out, fresh = f"s3://{BUCKET}/killed/criteo", f"s3://{BUCKET}/killed/fresh"
    assert run("criteo", "--input", day0, "--out", out, "--hash-buckets", 97) == 0
    first = resolve_dataset(out)
    first_rows = _rows(first)
    assert len(first_rows) > 100

    # the overwrite (many small parts) dies after 4 of its uploads
    _kill_midway(tmp_path, s3.env, 4, "convert", "criteo", "--input", day0, "--out", out, "--hash-buckets", 5,
                 "--rows-per-file", 10, "--overwrite")
    versions = storage.listdir(f"{out}/_v")
    partial = [v for v in versions if f"{out}/_v/{v}" != first]
    assert len(versions) == 2 and len(partial) == 1
    uploaded = s3.keys(BUCKET, f"killed/criteo/_v/{partial[0]}/")
    assert len(uploaded) >= 4
    assert resolve_dataset(out) == first and _rows(first) == first_rows
    assert load_checked(resolve_dataset(out)).sparse[0].num_embeddings == 97
    for inside in (f"{out}/_v/{partial[0]}", f"{out}/_v/{partial[0]}/train"):  # never read, even when named
        with pytest.raises(DataError) as e:
            resolve_dataset(inside)
        assert e.value.category == "unpublished_output"

    # a first write killed the same way leaves nothing that reads as an output
    _kill_midway(tmp_path, s3.env, 4, "convert", "criteo", "--input", day0, "--out", fresh, "--hash-buckets", 5,
                 "--rows-per-file", 10)
    assert s3.keys(BUCKET, "killed/fresh/") and not has_output(fresh)
    with pytest.raises(DataError) as e:
        resolve_dataset(fresh)
    assert e.value.category == "unpublished_output" and "interrupted" in e.value.message
    assert run("criteo", "--input", day0, "--out", fresh, "--hash-buckets", 5) == 0  # no --overwrite needed
    assert len(storage.listdir(f"{fresh}/_v")) == 2 and _rows(resolve_dataset(fresh))  # the killed one: not read

    # rerunning the killed overwrite publishes it and clears what the killed one left
    assert run("criteo", "--input", day0, "--out", out, "--hash-buckets", 5, "--rows-per-file", 10,
               "--overwrite") == 0
    final = resolve_dataset(out)
    assert len(storage.listdir(f"{out}/_v")) == 3 and partial[0] not in final
    assert len(uploaded) < len(read_marker(out)["files"])  # the killed upload really was partial
    assert load_checked(final).sparse[0].num_embeddings == 5 and len(_rows(final)) == len(first_rows)
    # a cleanup past the grace period removes the replaced version and the killed one, never the published one
    assert sorted(cleanup(out, grace_s=0)) == sorted([first[len(out) + 1:], f"_v/{partial[0]}"])
    assert storage.listdir(f"{out}/_v") == [final.rsplit("/", 1)[1]] and resolve_dataset(out) == final


# ---- (4) AN OUTPUT WRITTEN BEFORE VERSIONING ---- #


def test_an_output_without_a_marker_still_loads_with_a_warning(s3, tmp_path, caplog):
    day0 = write_tsv(tmp_path / "day_0", criteo_rows())
    local = str(tmp_path / "local")
    assert run("criteo", "--input", day0, "--out", local, "--hash-buckets", 97) == 0
    out = f"s3://{BUCKET}/old/criteo"
    storage.upload_dir(local, out)  # how a dataset reached a bucket before versioned publishing
    with caplog.at_level(logging.WARNING, logger="rayemb.publish"):
        assert resolve_dataset(out) == out
    assert MARKER in caplog.text and "before versioned publishing" in caplog.text
    assert load_checked(out).sparse[0].num_embeddings == 97 and _rows(out) == _rows(local)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rayemb.publish"):
        assert resolve(f"{out}/valid") == f"{out}/valid"  # plain parquet input (predict --data): no warning
    assert not caplog.text

    # an overwrite publishes a version; the old files are retired by its marker, removed after the grace period
    assert run("criteo", "--input", day0, "--out", out, "--hash-buckets", 5, "--overwrite") == 0
    version = read_marker(out)["version"]
    old_names = {"convert_summary.json", "schema.yaml", "train", "valid"}
    assert set(read_marker(out)["retired"]) == old_names and load_checked(out).sparse[0].num_embeddings == 97
    assert sorted(cleanup(out, grace_s=0)) == sorted(old_names)
    left = [k for k in s3.keys(BUCKET, "old/criteo/") if k != "old/criteo/"]  # pyarrow's directory marker
    assert {k.split("/", 3)[2] for k in left} == {MARKER, "_v"}
    assert all(k.startswith(f"old/criteo/{version}/") for k in s3.keys(BUCKET, "old/criteo/_v/"))
    assert load_checked(resolve_dataset(out)).sparse[0].num_embeddings == 5


# ---- (5) TRAINING, EXPORT AND PREDICT READ THROUGH RESOLVE ---- #


def test_training_export_and_predict_read_the_published_version(s3, tmp_path):
    import mlflow

    from rayemb.config import load_config
    from rayemb.serve.mlflow_model import local_model_dir
    from rayemb.serve.model import InferenceModel, model_config
    from rayemb.serve.predict import input_files
    from rayemb.train.driver.trainer import check_inputs

    day0 = write_tsv(tmp_path / "day_0", criteo_rows())
    out = f"s3://{BUCKET}/readers/criteo"
    assert run("criteo", "--input", day0, "--out", out, "--hash-buckets", 97) == 0
    assert run("criteo", "--input", day0, "--out", out, "--hash-buckets", 5, "--rows-per-file", 40,
               "--overwrite") == 0
    local = str(tmp_path / "local")
    assert run("criteo", "--input", day0, "--out", local, "--hash-buckets", 5) == 0
    published = resolve_dataset(out)
    assert published.startswith(f"{out}/_v/")

    # training: check_inputs reads the published version; its files are the ones Ray Data is given
    db = f"sqlite:///{tmp_path}/runs/mlflow.db"
    overrides = [f"data.path={out}", f"tracking.output_dir={tmp_path}/runs", f"tracking.tracking_uri={db}",
                 "data.batch_size=8", "scaling.num_workers=1", "tracking.experiment=readers"]
    cfg = load_config(os.path.join(REPO, "jobs", "configs", "synth_small.yaml"), overrides)
    inputs = check_inputs(cfg)
    assert inputs.data_dir == published and [f.num_embeddings for f in inputs.schema.sparse] == [5] * 26
    for split in ("train", "valid"):
        assert _rows(inputs.data_dir, split) == pq.read_table(os.path.join(local, split)).to_pylist()
    assert inputs.train_rows == len(_rows(local))

    # export: the dataset at data.path through resolve; the model published into the bucket
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), load_checked(published), model_config(cfg))
    (tmp_path / "job.yaml").write_text(cfg.to_yaml())
    model_uri = f"s3://{BUCKET}/readers/model"
    argv = ["export", "--checkpoint", ckpt, "--config", str(tmp_path / "job.yaml"), "--out", model_uri]
    assert main(argv) == 0
    info = json.loads(storage.read_text(storage.join(resolve(model_uri), "model.json")))
    assert info["source"]["data_path"] == published and read_marker(model_uri)["files"].keys() >= {"model.json",
                                                                                                   "model.pt"}
    assert main(argv) == 2  # an exported model is never overwritten

    # predict: the model and the data through resolve, the same scores as the MLflow pyfunc model
    model_dir, where = local_model_dir(model_uri, None, str(tmp_path / "scratch"))
    assert where == model_uri and sorted(os.listdir(model_dir)) >= ["model.json", "model.pt"]
    files = input_files(f"{out}/valid")
    assert files == parquet_files(published, "valid") and all(f.startswith(published) for f in files)
    valid = pq.read_table(os.path.join(local, "valid")).slice(0, 6)
    scores = InferenceModel.load(model_dir).predict(valid)
    run_id = mlflow.MlflowClient(db).search_runs([mlflow.MlflowClient(db).get_experiment_by_name("readers")
                                                  .experiment_id])[0].info.run_id
    mlflow.set_tracking_uri(db)
    try:
        pyfunc = mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(valid.to_pandas())
    finally:
        mlflow.set_tracking_uri("")
    assert np.isfinite(scores).all() and len(set(np.round(scores, 6))) > 1
    np.testing.assert_allclose(pyfunc["prediction"].to_numpy(), scores, rtol=0, atol=1e-6)
