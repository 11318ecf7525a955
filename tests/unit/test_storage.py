"""rayemb.storage on local paths and on a real S3-compatible server (moto, 127.0.0.1), and what uses it:
the dataset checks, stats.json, checkpoint integrity checks, job output places, and credential redaction."""

from __future__ import annotations

import hashlib
import json
import os

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from _servers import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, MotoS3Server, free_port

from rayemb import storage
from rayemb.checkpoint.reader import FORMAT, checkpoints_newest_first, read_meta, verify
from rayemb.config import load_config
from rayemb.data.fingerprint import dataset_fingerprint
from rayemb.data.schema import DatasetSchema, SparseFeature, count_rows, load_checked, parquet_files
from rayemb.data.stats_io import load_stats_json, write_stats_json
from rayemb.data.stats_types import DatasetStats
from rayemb.errors import ConfigError, DataError
from rayemb.logs import redact_text, redact_uri
from rayemb.train.driver.outputs import JobOutputs, local_output_dir, tracking_uri

BUCKET = "unit"


@pytest.fixture(scope="module")
def moto_server():
    server = MotoS3Server().start()
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture
def s3(moto_server, monkeypatch):
    """The server's credentials and endpoint in this test's environment only; a fresh prefix per test."""
    for k, v in moto_server.env.items():
        monkeypatch.setenv(k, v)
    return moto_server


def _prefix(request) -> str:
    return f"s3://{BUCKET}/{request.node.name.replace('[', '_').replace(']', '')}"


# ---- PATH ARITHMETIC ---- #


def test_join_dirname_basename_for_paths_and_uris():
    assert storage.join("/a/b", "c", "d.txt") == "/a/b/c/d.txt"
    assert storage.join("s3://bkt/data/", "train", "part.parquet") == "s3://bkt/data/train/part.parquet"
    assert storage.join("s3://bkt?endpoint_override=h:1", "x") == "s3://bkt/x?endpoint_override=h:1"
    assert storage.dirname("s3://bkt/data/train/p.parquet") == "s3://bkt/data/train"
    assert storage.basename("s3://bkt/data/train/") == "train" and storage.basename("/a/b.txt") == "b.txt"
    assert [storage.is_remote(p) for p in ("/a", "rel/a", "file:///a", "s3://b/a", "gs://b/a", "hdfs://h:1/a")] \
        == [False, False, False, True, True, True]
    assert storage.abspath("s3://b/x") == "s3://b/x" and storage.abspath("x") == os.path.abspath("x")


@pytest.mark.parametrize("uri", ["s3://unit", "s3://unit/", "s3://unit/a/b", "s3://unit/a/b/", "s3://K:S@unit/x",
                                 "s3://unit/a%20b/c"])
def test_path_on_the_filesystem_is_what_pyarrow_computes(s3, uri):
    assert storage._fs_path(uri) == pafs.FileSystem.from_uri(uri)[1]


def test_unsupported_schemes_are_config_errors():
    with pytest.raises(DataError) as e:
        storage.check_supported("http://host/data", "Data path")
    assert e.value.category == "bad_config" and "http://" in e.value.message
    with pytest.raises(ConfigError, match="data.path"):
        load_config("jobs/configs/synth_small.yaml", ["data.path=ftp://host/data"])
    with pytest.raises(ConfigError, match="tracking.output_dir"):
        load_config("jobs/configs/synth_small.yaml", ["tracking.output_dir=http://h/runs"])
    cfg = load_config("jobs/configs/synth_small.yaml", ["data.path=s3://b/data", "tracking.output_dir=gs://b/runs",
                                                        "train.resume_from=s3://b/runs/ckpt"])
    assert cfg.data.path == "s3://b/data" and cfg.tracking.output_dir == "gs://b/runs"


# ---- THE HELPERS, LOCAL AND ON S3 ---- #


def _roundtrip(root: str, local_scratch) -> None:
    """The same observable behaviour wherever ``root`` is."""
    assert not storage.exists(storage.join(root, "a.txt")) and not storage.isdir(root)
    storage.write_text(storage.join(root, "a.txt"), "hello")
    storage.write_bytes(storage.join(root, "sub", "b.bin"), b"\x00\x01" * 1000)
    storage.write_text(storage.join(root, "sub", "c.parquet"), "not really")
    assert storage.read_text(storage.join(root, "a.txt")) == "hello"
    assert storage.isdir(root) and storage.isdir(storage.join(root, "sub"))
    assert storage.isfile(storage.join(root, "a.txt")) and not storage.isfile(storage.join(root, "sub"))
    assert storage.listdir(root) == ["a.txt", "sub"]
    assert storage.list_files(storage.join(root, "sub"), ".parquet") == [storage.join(root, "sub", "c.parquet")]
    assert storage.list_files(storage.join(root, "none"), ".parquet") == []
    assert storage.size_and_mtime_ns(storage.join(root, "sub", "b.bin"))[0] == 2000
    assert storage.sha256(storage.join(root, "sub", "b.bin")) == hashlib.sha256(b"\x00\x01" * 1000).hexdigest()
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(storage.join(root, "missing.txt"))
    # whole directories both ways
    src = local_scratch / "src"
    (src / "deep" / "er").mkdir(parents=True)
    (src / "deep" / "er" / "x.bin").write_bytes(os.urandom(3000))
    (src / "top.txt").write_text("top")
    storage.upload_dir(str(src), storage.join(root, "tree"))
    back = storage.download_dir(storage.join(root, "tree"), str(local_scratch / "back"))
    assert (local_scratch / "back" / "deep" / "er" / "x.bin").read_bytes() == (src / "deep" / "er" / "x.bin").read_bytes()
    assert sorted(os.listdir(back)) == ["deep", "top.txt"]
    with storage.local_copy(storage.join(root, "tree")) as local:
        assert open(os.path.join(local, "top.txt")).read() == "top"
    # a file written through local_output appears only when the block succeeds
    target = storage.join(root, "out", "model.pt")
    with pytest.raises(RuntimeError):
        with storage.local_output(target) as local:
            open(local, "w").write("half")
            raise RuntimeError("writer failed")
    assert not storage.exists(target) and not storage.exists(storage.dirname(target) + "/model.pt.tmp")
    with storage.local_output(target) as local:
        open(local, "w").write("whole")
    assert storage.read_text(target) == "whole"


def test_helpers_on_local_paths(tmp_path):
    _roundtrip(str(tmp_path / "root"), tmp_path)
    # the atomic write leaves no temp file next to the target
    assert sorted(os.listdir(tmp_path / "root")) == ["a.txt", "out", "sub", "tree"]


def test_helpers_on_s3(s3, tmp_path, request):
    root = _prefix(request)
    _roundtrip(root, tmp_path)
    key_root = root.split("/", 3)[3]
    assert f"{key_root}/a.txt" in s3.keys(BUCKET, key_root)  # really on the server
    assert not [k for k in s3.keys(BUCKET, key_root) if ".tmp" in k]
    assert local_copy_leaves_nothing(root)


def local_copy_leaves_nothing(root: str) -> bool:
    with storage.local_copy(storage.join(root, "tree")) as local:
        pass
    return not os.path.exists(local)


def test_ray_data_gets_the_filesystem_and_bucket_paths(s3):
    paths, fs = storage.for_ray_data(["s3://unit/d/train/p0.parquet", "s3://unit/d/train/p1.parquet"])
    assert paths == ["unit/d/train/p0.parquet", "unit/d/train/p1.parquet"] and fs.type_name == "s3"
    assert storage.for_ray_data(["/a/p.parquet"]) == (["/a/p.parquet"], None)


def test_ranks_read_their_rows_of_an_in_memory_split_from_the_bucket(s3, request, tmp_path, monkeypatch):
    import pickle

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayemb.train.driver import outputs
    from rayemb.train.held_splits import FileSplit

    uris = []
    for i, n in enumerate((700, 333)):
        local = tmp_path / f"p{i}.parquet"
        pq.write_table(pa.table({"row": pa.array(range(i * 700, i * 700 + n), pa.int64())}), local, row_group_size=100)
        uris.append(f"{_prefix(request)}/train/p{i}.parquet")
        storage.upload_file(str(local), uris[-1])
    monkeypatch.setattr(outputs, "SMALL_SPLIT_MAX_ROWS", 10)
    split = outputs.read_splits(uris, uris[1:], rows={"train": 1_033, "valid": 333}, in_memory=True)["train"]
    assert isinstance(split, FileSplit) and split.file_rows == (700, 333)
    split = pickle.loads(pickle.dumps(split))  # as the ranks receive it
    assert split.shard(1, 2, equal=True).table.column("row").to_pylist() == list(range(516, 1_032))


def test_an_unreachable_store_is_a_storage_error_without_the_secret(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    uri = f"s3://{FAKE_ACCESS_KEY_ID}:{FAKE_SECRET_ACCESS_KEY}@nowhere/data/schema.yaml"
    with pytest.raises(DataError) as e:
        storage.read_text(uri)
    assert e.value.category == "storage" and "s3://***@nowhere/data/schema.yaml" in e.value.message
    assert FAKE_SECRET_ACCESS_KEY not in e.value.message and FAKE_ACCESS_KEY_ID not in e.value.message
    assert "AWS_ENDPOINT_URL" in e.value.message  # says what to check


# ---- THE DATASET CONTRACT ON S3 ---- #


def _dataset(root, table, sparse):
    os.makedirs(os.path.join(root, "train"))
    os.makedirs(os.path.join(root, "valid"))
    pq.write_table(table, os.path.join(root, "train", "part-00000.parquet"))
    pq.write_table(table, os.path.join(root, "valid", "part-00000.parquet"))
    DatasetSchema("label", ("I1",), tuple(sparse)).save(root)
    return root


def _table():
    return pa.table({"label": pa.array([0.0, 1.0, 1.0]), "I1": pa.array([0.5, 1.5, 2.5], pa.float32()),
                     "C1": pa.array([1, 2, 3], pa.int64())})


def test_load_checked_on_s3_matches_local(s3, tiny_data, request):
    root = _prefix(request)
    storage.upload_dir(tiny_data, root)
    assert load_checked(root) == load_checked(tiny_data)
    assert count_rows(root, "train") == count_rows(tiny_data, "train") == 36_000
    assert [storage.basename(p) for p in parquet_files(root)] == [os.path.basename(p) for p in parquet_files(tiny_data)]
    assert parquet_files(root)[0].startswith(root + "/train/")
    # the fingerprint is stable, and changes when a file is rewritten with other content
    fp = dataset_fingerprint(root)
    assert fp == dataset_fingerprint(root) and fp.startswith("sha256:")
    storage.write_bytes(parquet_files(root)[0], storage.read_bytes(parquet_files(tiny_data, "valid")[0]))
    assert dataset_fingerprint(root) != fp


@pytest.mark.parametrize("case", ["no_schema", "missing_column", "wrong_type", "corrupt", "no_dir"])
def test_dataset_errors_on_s3_are_the_local_ones(s3, tmp_path, request, case):
    local = _dataset(str(tmp_path / "ds"), _table(), [SparseFeature("C1", 5)])
    if case == "no_schema":
        os.remove(os.path.join(local, "schema.yaml"))
    elif case == "missing_column":
        DatasetSchema("label", ("I1",), (SparseFeature("C1", 5), SparseFeature("C2", 5))).save(local)
    elif case == "wrong_type":
        pq.write_table(_table().set_column(2, "C1", pa.array(["a", "b", "c"])),
                       os.path.join(local, "valid", "part-00000.parquet"))
    elif case == "corrupt":
        path = os.path.join(local, "valid", "part-00000.parquet")
        open(path, "r+b").truncate(100)
    root = _prefix(request)
    storage.upload_dir(local, root)
    if case == "no_dir":
        local, root = str(tmp_path / "absent"), root + "/absent"
    with pytest.raises(DataError) as want:
        load_checked(local)
    with pytest.raises(DataError) as got:
        load_checked(root)
    assert got.value.category == want.value.category
    assert got.value.message.replace(root, "DIR").split(" (")[0] == want.value.message.replace(local, "DIR").split(" (")[0]


def test_stats_json_round_trips_through_s3(s3, request):
    stats = DatasetStats(rows=3, fingerprint="sha256:abc", data_dir="s3://unit/data", split="train", tables={})
    path = storage.join(_prefix(request), "stats", "stats.json")
    assert write_stats_json(stats, path) == path
    assert load_stats_json(path).to_dict() == stats.to_dict()
    with pytest.raises(DataError, match="does not exist"):
        load_stats_json(storage.join(_prefix(request), "none.json"))


# ---- CHECKPOINTS ON S3 ---- #


def _checkpoint(path, step):
    path.mkdir(parents=True)
    listed = {}
    for name in ("__0_0.distcp", "__1_0.distcp", ".metadata"):
        payload = (name * 50).encode()
        (path / name).write_bytes(payload)
        listed[name] = {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    (path / "meta.json").write_text(json.dumps({"format": FORMAT, "world_size": 2, "step": step, "epoch": 0,
                                                "files": listed, "tables": {}}))


def test_remote_checkpoints_are_listed_and_verified(s3, tmp_path, request):
    for name, step in (("checkpoint_b", 20), ("checkpoint_a", 30), ("checkpoint_c", 10)):
        _checkpoint(tmp_path / "job" / name, step)
    (tmp_path / "job" / "checkpoint_partial").mkdir()
    (tmp_path / "job" / "checkpoint_partial" / "__0_0.distcp").write_bytes(b"x")  # no meta.json yet
    root = storage.join(_prefix(request), "job")
    storage.upload_dir(str(tmp_path / "job"), root)
    newest = checkpoints_newest_first(root)
    assert [storage.basename(p) for p in newest] == ["checkpoint_a", "checkpoint_b", "checkpoint_c"]
    assert newest[0] == root + "/checkpoint_a"
    assert verify(newest[0])["step"] == 30 and read_meta(newest[0])["step"] == 30
    # a flipped byte on the server: sizes agree, the streamed hash does not
    bad = newest[1] + "/__0_0.distcp"
    raw = bytearray(storage.read_bytes(bad))
    raw[3] ^= 0xFF
    storage.write_bytes(bad, bytes(raw))
    assert verify(newest[1], hashes=False)["step"] == 20
    with pytest.raises(DataError) as e:
        verify(newest[1])
    assert e.value.category == "bad_checkpoint" and "__0_0.distcp is corrupt" in e.value.message
    assert newest[1] in e.value.message
    with pytest.raises(DataError, match="does not exist"):
        verify(root + "/checkpoint_none")


# ---- WHERE A JOB'S OUTPUTS GO ---- #


def test_outputs_of_a_local_and_a_remote_output_dir(s3, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAYEMB_WORKSPACE", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    local = JobOutputs.of(str(tmp_path / "out"), "job-1")
    assert local.local_dir == str(tmp_path / "out") and local.checkpoint_root == str(tmp_path / "out/ray_results/job-1")
    assert local.run_config_storage() == {"storage_path": str(tmp_path / "out/ray_results")}
    assert local.checkpoint_uri("/x/checkpoint_1") == "/x/checkpoint_1"
    remote = JobOutputs.of("s3://unit/runs", "job-1")
    assert remote.local_dir == local_output_dir("s3://unit/runs") == str(tmp_path / "runs")
    assert remote.remote_job_dir == "s3://unit/runs/jobs/job-1"
    assert remote.checkpoint_root == "s3://unit/runs/ray_results/job-1"
    ray_storage = remote.run_config_storage()
    assert ray_storage["storage_path"] == "unit/runs/ray_results" and ray_storage["storage_filesystem"].type_name == "s3"
    assert remote.checkpoint_uri("unit/runs/ray_results/job-1/checkpoint_000") == \
        "s3://unit/runs/ray_results/job-1/checkpoint_000"
    # MLflow stays local, and the job says where
    uri = tracking_uri(None, "s3://unit/runs")
    assert uri == f"sqlite:///{tmp_path}/runs/mlflow.db"
    assert "the MLflow store stays local" in capsys.readouterr().out
    assert tracking_uri("http://mlflow:5000", "s3://unit/runs") == "http://mlflow:5000"
    # the job folder goes up next to the checkpoints
    os.makedirs(remote.job_dir)
    open(os.path.join(remote.job_dir, "plan.json"), "w").write("{}")
    remote.publish()
    assert storage.read_text("s3://unit/runs/jobs/job-1/plan.json") == "{}"


# ---- CREDENTIALS ---- #


def test_storage_uris_with_credentials_are_redacted(monkeypatch):
    assert redact_uri("s3://AKIAXYZ:s3cr3t@bucket/data") == "s3://***@bucket/data"
    assert redact_uri("gs://user:pw@bucket/x") == "gs://***@bucket/x"
    assert redact_uri("s3://bucket/x?access_key=AK&secret_key=SK&region=eu") == \
        "s3://bucket/x?access_key=%2A%2A%2A&secret_key=%2A%2A%2A&region=eu"
    assert redact_uri("s3://bucket/data") == "s3://bucket/data"
    text = "reading s3://AKIAXYZ:s3cr3t@bucket/data/train failed"
    assert redact_text(text) == "reading s3://***@bucket/data/train failed"
    # the secret of the environment never shows, even outside a URI
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET_ACCESS_KEY)
    assert redact_text(f"error: signature for {FAKE_SECRET_ACCESS_KEY} mismatch") == "error: signature for *** mismatch"
    assert redact_uri(f"x{FAKE_SECRET_ACCESS_KEY}") == "x***"


def test_credentials_in_a_data_uri_are_redacted_in_dataset_errors(s3, request):
    root = _prefix(request).replace("s3://", f"s3://{FAKE_ACCESS_KEY_ID}:{FAKE_SECRET_ACCESS_KEY}@")
    storage.write_text(root + "/schema.yaml", "label: [unclosed")
    with pytest.raises(DataError) as e:
        load_checked(root)
    assert e.value.category == "invalid_schema" and "s3://***@unit/" in e.value.message
    assert FAKE_SECRET_ACCESS_KEY not in e.value.message and FAKE_ACCESS_KEY_ID not in e.value.message


def test_a_restore_downloads_a_remote_checkpoint_once_per_node_and_removes_it(s3, tmp_path, request):
    from types import SimpleNamespace

    from rayemb.train.worker.resume import _checkpoint_uri, _node_copy, _remove_node_copy

    _checkpoint(tmp_path / "ckpt", 7)
    uri = storage.join(_prefix(request), "ray_results", "job", "checkpoint_1")
    storage.upload_dir(str(tmp_path / "ckpt"), uri)
    # Ray names a checkpoint by its path on the bucket's filesystem: back to the URI the job prints
    ray_ckpt = SimpleNamespace(path=storage.filesystem(uri)[1], filesystem=storage.filesystem(uri)[0])
    assert _checkpoint_uri(ray_ckpt, storage.dirname(uri)) == uri
    assert _checkpoint_uri(ray_ckpt, None) == uri  # from the filesystem's kind alone
    local = _node_copy(uri, "t1")
    assert verify(local, shown=uri)["step"] == 7
    mtime = os.path.getmtime(os.path.join(local, "meta.json"))
    assert _node_copy(uri, "t1") == local and os.path.getmtime(os.path.join(local, "meta.json")) == mtime  # shared
    _remove_node_copy(uri, local)
    assert not os.path.exists(local) and not os.path.exists(local + ".lock")
    assert _node_copy(str(tmp_path / "ckpt"), "t2") == str(tmp_path / "ckpt")  # local: used in place


def test_a_read_never_sees_part_of_an_object_rewritten_beside_it(s3, request):
    """An object rewritten while it is read (a job record the driver updates as another process polls it): every
    read returns one whole version. (pyarrow's S3 reader asks the size first, then reads that many bytes: the
    first bytes of a longer version written in between would be a torn read.)"""
    import threading

    path = _prefix(request) + "/record.json"
    versions = [json.dumps({"v": i, "pad": "x" * (100 + 700 * (i % 2))}).encode() for i in range(2)]
    storage.write_bytes(path, versions[0])
    stop, errors = threading.Event(), []

    def rewrite():
        i = 0
        while not stop.is_set():
            i += 1
            try:
                storage.write_bytes(path, versions[i % 2])
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(e)
                return

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    try:
        seen = [storage.read_bytes(path) for _ in range(300)]
    finally:
        stop.set()
        writer.join(timeout=10)
    assert not errors, errors
    torn = [s for s in seen if s not in versions]
    assert not torn, f"{len(torn)} of {len(seen)} reads were torn, e.g. {torn[0][:80]!r}... ({len(torn[0])} bytes)"
    assert set(seen) == set(versions)  # both versions were read: the writer really ran beside the reads
