"""A store that does not answer is not a missing or damaged checkpoint: reads are tried again with backoff,
then fail naming the checkpoint; a damaged checkpoint still falls back to the previous one.

Against moto's real S3-compatible server (a thread of this process, its state kept in the process), stopped
by its handle and started again on the same port.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
from _servers import MotoS3Server, free_port
from _tiny_checkpoint import tiny_model

from rayemb.batch_shape import BatchShape
from rayemb import storage
from rayemb.checkpoint import reader
from rayemb.checkpoint.reader import checkpoints_newest_first, read_meta, verify
from rayemb.checkpoint.store import save_logical
from rayemb.errors import DataError

BUCKET = "retry"
TABLES = {"t": (6, 4)}


class RestartableMotoS3Server(MotoS3Server):
    """moto's server on a fixed port that ``stop()`` closes (connections refused) and ``start()`` reopens."""

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()

    def start(self) -> "RestartableMotoS3Server":
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server._server.server_close()  # the listening socket too: clients get "connection refused"
            self._server = None

    @property
    def up(self) -> bool:
        return self._server is not None


class _StartOnFirstRetry(logging.Handler):
    """Starts the stopped server when rayemb announces its first retry: the store comes back mid-window."""

    def __init__(self, server: RestartableMotoS3Server) -> None:
        super().__init__(logging.WARNING)
        self.server, self.retries = server, 0

    def emit(self, record: logging.LogRecord) -> None:
        if "trying again" in record.getMessage():
            self.retries += 1
            if not self.server.up:
                self.server.start()


@pytest.fixture(scope="module")
def server():
    s = RestartableMotoS3Server().start()
    s.create_bucket(BUCKET)
    yield s
    s.stop()


def _one_attempt(filesystem):
    """``storage.filesystem`` whose S3 clients try each request once: pyarrow's client retries a refused
    connection for ~6 s by itself, and what is under test is rayemb's retry around it."""
    import pyarrow.fs as pafs

    def wrapped(uri):
        fs, path = filesystem(uri)
        if isinstance(fs, pafs.S3FileSystem):
            rebuild, (kwargs,) = fs.__reduce__()
            fs = rebuild({**kwargs, "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=1)})
        return fs, path

    return wrapped


@pytest.fixture
def s3(server, monkeypatch):
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(storage, "filesystem", _one_attempt(storage.filesystem))
    monkeypatch.setattr(reader, "STORAGE_RETRY_FIRST_S", 0.1)
    yield server
    if not server.up:
        server.start()


@pytest.fixture
def restart_on_retry(server):
    handler = _StartOnFirstRetry(server)
    logger = logging.getLogger("rayemb.checkpoint.reader")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def _root(request) -> str:
    return f"s3://{BUCKET}/{request.node.name}"


def _fake_checkpoint(path, step: int) -> None:
    import hashlib
    import json

    path.mkdir(parents=True)
    listed = {}
    for name in ("__0_0.distcp", ".metadata"):
        payload = (name * 40).encode()
        (path / name).write_bytes(payload)
        listed[name] = {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    (path / "meta.json").write_text(json.dumps({"format": reader.FORMAT, "world_size": 1, "step": step, "epoch": 0,
                                                "files": listed, "tables": {}}))


def test_reads_succeed_when_the_store_comes_back_within_the_retry_window(s3, restart_on_retry, tmp_path, request):
    for name, step in (("checkpoint_a", 10), ("checkpoint_b", 20)):
        _fake_checkpoint(tmp_path / "job" / name, step)
    root = storage.join(_root(request), "job")
    storage.upload_dir(str(tmp_path / "job"), root)
    reads = [
        (lambda: read_meta(root + "/checkpoint_b"), lambda got: got["step"] == 20),
        (lambda: checkpoints_newest_first(root), lambda got: got == [root + "/checkpoint_b", root + "/checkpoint_a"]),
        (lambda: verify(root + "/checkpoint_a"), lambda got: got["step"] == 10),  # sizes and streamed hashes
    ]
    for i, (read, expected) in enumerate(reads):
        s3.stop()
        got = read()
        assert restart_on_retry.retries == i + 1 and s3.up  # the first try failed, a retry read it
        assert expected(got), got


def test_a_store_that_stays_down_is_an_error_naming_the_checkpoint(s3, tmp_path, request, monkeypatch, capsys):
    from rayemb.cli import main
    from rayemb.config import load_config
    from rayemb.train.worker.resume import check_resume_from

    monkeypatch.setattr(reader, "STORAGE_TRIES", 2)
    _fake_checkpoint(tmp_path / "job" / "checkpoint_a", 10)
    root = storage.join(_root(request), "job")
    storage.upload_dir(str(tmp_path / "job"), root)
    ckpt = root + "/checkpoint_a"
    assert read_meta(ckpt)["step"] == 10
    s3.stop()
    for read, named in ((lambda: read_meta(ckpt), ckpt), (lambda: checkpoints_newest_first(root), root)):
        with pytest.raises(DataError) as e:  # not None, not []
            read()
        assert e.value.category == "storage" and e.value.exit_code == 2
        assert f"Checkpoint '{named}' could not be read" in e.value.message and "in 2 tries" in e.value.message
    cfg = load_config("jobs/configs/synth_small.yaml", [f"train.resume_from={ckpt}"])
    with pytest.raises(DataError) as e:
        check_resume_from(cfg, schema=None)
    assert e.value.category == "storage" and ckpt in e.value.message and "--resume-from" in e.value.message
    capsys.readouterr()
    assert main(["checkpoint", "show", "--checkpoint", ckpt]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rayemb: error:")]
    assert len(errors) == 1 and ckpt in errors[0] and "store did not answer" in errors[0]


# ---- RESUMING A JOB FROM THE STORE ---- #


def test_resume_falls_back_past_damaged_checkpoints_but_not_past_an_unreachable_store(
        s3, one_rank_group, tmp_path, request, monkeypatch, caplog):
    import ray.train

    from rayemb.train.worker.resume import restore

    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)  # a job's first start: Ray Train hands none
    monkeypatch.setattr(reader, "STORAGE_TRIES", 2)
    weights = {}
    for step in (10, 20, 30):
        model, opt = tiny_model(step)
        save_logical(str(tmp_path / "job" / f"checkpoint_{step}"), model, opt, None, TABLES, {"epoch": 0, "step": step})
        weights[step] = model.top.weight.detach().clone()
    (tmp_path / "job" / "checkpoint_20" / "meta.json").write_text('{"format": "rayemb-logical-v1", "st')  # torn
    distcp = tmp_path / "job" / "checkpoint_30" / "__0_0.distcp"
    raw = bytearray(distcp.read_bytes())
    raw[-1] ^= 0xFF  # same size, another hash
    distcp.write_bytes(bytes(raw))
    root = storage.join(_root(request), "job")
    storage.upload_dir(str(tmp_path / "job"), root)

    model, opt = tiny_model(0)
    with caplog.at_level(logging.WARNING):
        pos = restore(model, opt, None, TABLES, BatchShape(4, 1), checkpoint_root=root)
    assert (pos.step, pos.source) == (10, root + "/checkpoint_10")
    assert torch.equal(model.top.weight, weights[10])
    assert f"checkpoint {root}/checkpoint_30 is not usable" in caplog.text  # hash check failed: fell back

    caplog.clear()
    s3.stop()
    with caplog.at_level(logging.WARNING), pytest.raises(DataError) as e:
        restore(model, opt, None, TABLES, BatchShape(4, 1), checkpoint_root=root)
    assert e.value.category == "storage" and f"Checkpoint '{root}' could not be read" in e.value.message
    assert "starting from scratch" not in caplog.text


def test_a_restarted_group_handed_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(
        one_rank_group, tmp_path, monkeypatch, caplog):
    """Ray Train hands a restarted worker group its newest registered checkpoint; when a file of it was damaged
    after it was written, the job resumes from the newest intact one in the same folder, and says so."""
    import ray.train

    from rayemb.train.worker.resume import restore

    weights = {}
    for step in (20, 40):
        model, opt = tiny_model(step)
        save_logical(str(tmp_path / "job" / f"checkpoint_{step}"), model, opt, None, TABLES, {"epoch": 0, "step": step})
        weights[step] = model.top.weight.detach().clone()
    newest = tmp_path / "job" / "checkpoint_40"
    distcp = newest / "__0_0.distcp"
    raw = bytearray(distcp.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    distcp.write_bytes(bytes(raw))
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: ray.train.Checkpoint(str(newest)))

    model, opt = tiny_model(0)
    with caplog.at_level(logging.WARNING):
        pos = restore(model, opt, None, TABLES, BatchShape(4, 1), checkpoint_root=str(tmp_path / "job"))
    assert (pos.step, pos.source) == (20, str(tmp_path / "job" / "checkpoint_20"))
    assert torch.equal(model.top.weight, weights[20])
    assert f"checkpoint {newest} is not usable" in caplog.text and "resuming from the older checkpoint" in caplog.text
