"""RunLogger against real MLflow stores: embedded sqlite, and a real `mlflow server` that dies mid-run."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _servers import MlflowServer, free_port
from mlflow import MlflowClient

import rayemb
from rayemb.tracking import (
    TAG_FAILURE_REASON,
    TAG_GIT_COMMIT,
    TAG_PARENT_RUN_ID,
    TAG_VERSION,
    RunLogger,
    default_tracking_uri,
    ensure_store,
    standard_tags,
)
from rayemb.units import flatten


@pytest.fixture
def sqlite_uri(tmp_path: Path) -> str:
    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert uri.startswith("sqlite:////")
    ensure_store(uri)
    return uri


def _logger(uri: str, tmp_path: Path, **kw) -> RunLogger:
    kw.setdefault("flush_interval_s", 0.05)
    kw.setdefault("system_metrics_interval_s", None)
    return RunLogger(uri, kw.pop("experiment", "unit"), spill_dir=str(tmp_path / "spill"), **kw)


def test_default_tracking_uri_is_absolute_sqlite_unless_env(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_tracking_uri("out") == f"sqlite:///{tmp_path.resolve()}/out/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert default_tracking_uri("out") == "http://127.0.0.1:5000"


def test_ensure_store_creates_the_database_and_folder(tmp_path):
    uri = f"sqlite:///{tmp_path.resolve()}/nested/dir/mlflow.db"
    ensure_store(uri)
    assert (tmp_path / "nested" / "dir" / "mlflow.db").stat().st_size > 0
    ensure_store("http://127.0.0.1:1")  # servers: nothing to do, no network call


def test_standard_tags_name_the_version_and_commit():
    tags = standard_tags()
    assert tags[TAG_VERSION] == rayemb.__version__ == "0.1.0"
    commit = tags[TAG_GIT_COMMIT]
    assert commit == "unknown" or (len(commit) == 40 and int(commit, 16) >= 0)


def test_flatten_nested_config():
    assert flatten({"a": {"b": 1, "c": {"d": "x"}}, "e": [1, 2]}) == {"a.b": 1, "a.c.d": "x", "e": [1, 2]}


@pytest.mark.timeout(120)
def test_sqlite_run_holds_params_metrics_tags_and_artifacts(sqlite_uri, tmp_path):
    rl = _logger(sqlite_uri, tmp_path, run_name="r1", tags={"rayemb.cluster_shape": "1x2cpu"}).start()
    assert rl.run_id is not None
    rl.log_params({"train": {"epochs": 3, "dense_lr": 0.05, "optimizer": "adagrad"}, "hybrid": True,
                   "model": {"bottom_mlp": [64, 16]}})
    for step in range(25):
        rl.log_metrics({"loss": 1.0 / (step + 1), "auc": 0.5 + step / 100}, step=step)
    artifact = tmp_path / "plan.json"
    artifact.write_text('{"schema_version": 1}')
    rl.log_artifact(str(artifact))
    rl.log_text("train:\n  epochs: 3\n", "config.yaml")
    rl.set_tags({"rayemb.plan_fingerprint": "abc123"})
    assert rl.finish() is True

    client = MlflowClient(sqlite_uri)
    run = client.get_run(rl.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "r1"
    assert run.data.params == {"train.epochs": "3", "train.dense_lr": "0.05", "train.optimizer": "adagrad",
                               "hybrid": "True", "model.bottom_mlp": "[64, 16]"}
    # numeric settings are also metrics, so MLflow filters can compare them as numbers
    assert run.data.metrics["param.train.epochs"] == 3.0
    assert run.data.metrics["param.train.dense_lr"] == 0.05
    assert run.data.metrics["param.hybrid"] == 1.0
    assert "param.train.optimizer" not in run.data.metrics
    found = client.search_runs([run.info.experiment_id], "metrics.`param.train.epochs` > 2")
    assert [r.info.run_id for r in found] == [rl.run_id]
    hist = client.get_metric_history(rl.run_id, "loss")
    assert sorted((m.step, m.value) for m in hist) == [(s, 1.0 / (s + 1)) for s in range(25)]
    assert run.data.tags["rayemb.cluster_shape"] == "1x2cpu"
    assert run.data.tags["rayemb.plan_fingerprint"] == "abc123"
    assert run.data.tags[TAG_VERSION] == "0.1.0"
    assert TAG_FAILURE_REASON not in run.data.tags
    assert sorted(a.path for a in client.list_artifacts(rl.run_id)) == ["config.yaml", "plan.json"]
    # artifacts of the embedded store sit next to the database, not in the cwd's ./mlruns
    assert run.info.artifact_uri.startswith((tmp_path.resolve() / "mlartifacts").as_uri())
    assert not os.path.exists(rl.spill_path)


@pytest.mark.timeout(120)
def test_failed_run_records_reason_and_child_links_parent(sqlite_uri, tmp_path):
    parent = _logger(sqlite_uri, tmp_path, run_name="parent").start()
    child = _logger(sqlite_uri, tmp_path, run_name="child", parent_run_id=parent.run_id).start()
    child.log_metrics({"loss": 0.7}, step=0)
    assert child.finish("FAILED", reason="TrainingError: rank 1 ran out of memory") is True
    assert child.finish("FINISHED") is True  # idempotent: the first call decided
    assert parent.finish() is True
    client = MlflowClient(sqlite_uri)
    run = client.get_run(child.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[TAG_FAILURE_REASON] == "TrainingError: rank 1 ran out of memory"
    assert run.data.tags[TAG_PARENT_RUN_ID] == parent.run_id
    assert client.get_run(parent.run_id).info.status == "FINISHED"


@pytest.mark.timeout(120)
def test_driver_exiting_without_finish_flushes_and_fails_the_run(sqlite_uri, tmp_path):
    script = (
        "import sys\n"
        "from rayemb.tracking import RunLogger\n"
        f"rl = RunLogger({sqlite_uri!r}, 'unit', run_name='crash', flush_interval_s=60,\n"
        "               system_metrics_interval_s=None).start()\n"
        "for s in range(50):\n"
        "    rl.log_metrics({'loss': s / 10}, step=s)\n"
        "print(rl.run_id)\n"
        "raise SystemExit(3)  # no finish(): e.g. an uncaught error in the driver\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 3, proc.stderr
    run_id = proc.stdout.strip().splitlines()[-1]
    client = MlflowClient(sqlite_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert "exited without finishing" in run.data.tags[TAG_FAILURE_REASON]
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == list(range(50))


@pytest.mark.timeout(120)
def test_bad_input_is_cleaned_or_dropped_never_raised(sqlite_uri, tmp_path, caplog):
    rl = _logger(sqlite_uri, tmp_path).start()
    rl.log_params({"lr": 0.1})
    rl.log_params({"lr": 0.2})  # MLflow params are immutable: the store rejects this one
    rl.log_metrics({"loss@rank{0}": 0.5, "not_a_number": "abc", "ok": 1}, step=3)
    rl.log_artifact(str(tmp_path / "missing.json"))
    rl.log_metrics(None, step=0)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="rayemb.tracking.run_logger"):
        assert rl.finish() is True
    run = MlflowClient(sqlite_uri).get_run(rl.run_id)
    assert run.data.params == {"lr": "0.1"}
    assert run.data.metrics["loss_rank_0_"] == 0.5
    assert run.data.metrics["ok"] == 1.0
    assert "not_a_number" not in run.data.metrics
    assert rl.dropped == 1
    assert run.info.status == "FINISHED"


@pytest.mark.timing
@pytest.mark.timeout(60)
def test_unreachable_server_spills_everything_and_buffer_stays_bounded(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    rl = _logger(uri, tmp_path, max_buffer=10)
    t0 = time.perf_counter()
    rl.start()
    assert rl.run_id is None
    for step in range(100):
        rl.log_metrics({"loss": float(step)}, step=step)
        assert len(rl._buf) <= 10
    rl.log_text("hello", "note.txt")
    cpu0 = time.process_time()
    assert rl.finish(timeout_s=1.0) is False
    assert time.process_time() - cpu0 < 0.5  # waiting for the server sleeps between retries, no busy loop
    assert time.perf_counter() - t0 < 15
    recs = [json.loads(line) for line in Path(rl.spill_path).read_text().splitlines()]
    metrics = sorted((r["step"], r["v"]) for r in recs if r["k"] == "m")
    assert metrics == [(s, float(s)) for s in range(100)]
    assert [r["text"] for r in recs if r["k"] == "x"] == ["hello"]


# ---- a real tracking server that dies mid-run ---- #


@pytest.mark.timing
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_server_outage_mid_run_loses_nothing_and_never_blocks_the_loop(tmp_path, caplog):
    root = tmp_path / "server"
    root.mkdir()
    server = MlflowServer(root, free_port())
    step_s, call_s, wall_ms = [], [], []

    def train_step(rl: RunLogger, step: int) -> None:
        t0 = time.perf_counter()
        before = int(time.time() * 1000)
        time.sleep(0.01)  # the "training step"
        t1 = time.perf_counter()
        rl.log_metrics({"loss": 1.0 / (step + 1), "auc": step / 1e4, "samples_per_s": 1000.0 + step}, step=step)
        call_s.append(time.perf_counter() - t1)
        wall_ms.append((before, int(time.time() * 1000)))
        step_s.append(time.perf_counter() - t0)

    try:
        server.start()
        server.wait_healthy()
        with caplog.at_level(logging.INFO, logger="rayemb.tracking.run_logger"):
            rl = _logger(server.uri, tmp_path, experiment="outage", run_name="outage", max_buffer=300,
                         flush_interval_s=0.1).start()
            assert rl.run_id is not None
            rl.log_params({"train": {"epochs": 1}})
            step = 0
            for _ in range(100):
                train_step(rl, step)
                step += 1
            time.sleep(0.3)  # let the writer deliver the healthy phase
            server.kill()
            outage_from = step
            for _ in range(150):  # server dead: 450 records > max_buffer, so the caller spills too
                train_step(rl, step)
                step += 1
            rl.log_text("written during the outage", "outage.txt")
            server.start()  # same port, same store; keep training while it boots (~15 s)
            while not server.healthy():
                assert server.proc.poll() is None, "restarted mlflow server exited"
                train_step(rl, step)
                step += 1
            outage_to = step
            for _ in range(100):
                train_step(rl, step)
                step += 1
            assert rl.finish(timeout_s=90) is True
        messages = [r.getMessage() for r in caplog.records]
        assert any("unreachable" in m for m in messages)
        assert any("reachable again" in m for m in messages)

        client = MlflowClient(server.uri)
        run = client.get_run(rl.run_id)
        assert run.info.status == "FINISHED"
        assert run.data.params == {"train.epochs": "1"}
        for key, fn in (("loss", lambda s: 1.0 / (s + 1)), ("auc", lambda s: s / 1e4),
                        ("samples_per_s", lambda s: 1000.0 + s)):
            hist = sorted(client.get_metric_history(rl.run_id, key), key=lambda m: m.step)
            assert [m.step for m in hist] == list(range(step)), key
            assert [m.value for m in hist] == pytest.approx([fn(s) for s in range(step)]), key
            # each point keeps the time it was logged at, not the time it was replayed
            assert all(wall_ms[m.step][0] <= m.timestamp <= wall_ms[m.step][1] for m in hist), key
        assert [a.path for a in client.list_artifacts(rl.run_id)] == ["outage.txt"]

        # The loop's own log. The direct check: log_metrics returns at once while the server is dead
        # or booting. The step-time check compares medians: the restarting server and other work on a
        # shared 2-core box stretch a few sleeps by tens of ms in either phase, which is scheduler
        # noise, while a step blocked on MLflow would wait for a timeout or a retry backoff (>= 1 s).
        healthy, outage = step_s[:outage_from], step_s[outage_from:outage_to]
        calls = call_s[outage_from:outage_to]

        def pct(xs, q):
            return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]

        print(f"step ms: healthy p50 {1e3 * pct(healthy, .5):.2f} p95 {1e3 * pct(healthy, .95):.2f} "
              f"max {1e3 * max(healthy):.2f}; outage ({len(outage)} steps) p50 {1e3 * pct(outage, .5):.2f} "
              f"p95 {1e3 * pct(outage, .95):.2f} max {1e3 * max(outage):.2f}; log_metrics during outage "
              f"p50 {1e3 * pct(calls, .5):.3f} p99 {1e3 * pct(calls, .99):.3f} max {1e3 * max(calls):.2f}")
        assert len(outage) > 150
        assert pct(calls, 0.99) < 0.005 and max(calls) < 0.05
        assert pct(outage, 0.5) < pct(healthy, 0.5) + 0.002
        assert max(outage) < 1.0
    finally:
        server.kill()
