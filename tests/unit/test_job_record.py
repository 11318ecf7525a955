"""A job's record decides what a rerun does: continue the unfinished run, return the finished one, or refuse."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rayemb.config import load_config
from rayemb.data.schema import load_checked
from rayemb.errors import ConfigError
from rayemb.train.driver.job_record import LEASE_S, Heartbeat, JobRecord, claim, read_record, record_path, write_record

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def job(tiny_data, tmp_path):
    def cfg(*extra):
        return load_config(str(REPO / "jobs" / "configs" / "synth_small.yaml"),
                           [f"data.path={tiny_data}", f"tracking.output_dir={tmp_path}", "name=nightly", *extra])

    return cfg, load_checked(tiny_data), str(tmp_path)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _record(out: str, cfg, schema, **fields) -> JobRecord:
    attempt = claim(cfg, schema, out)
    rec = attempt.record
    for k, v in fields.items():
        setattr(rec, k, v)
    write_record(out, rec)
    return rec


def test_a_first_run_is_new_and_writes_nothing_until_it_starts(job):
    cfg, schema, out = job
    first = claim(cfg(), schema, out)
    assert (first.attempt, first.run_id, first.finished) == (1, None, None)
    assert first.job_id.startswith("nightly-") and read_record(out, "nightly") is None  # a bad input leaves nothing
    beat = Heartbeat(out, first).start()
    assert read_record(out, "nightly").status == "RUNNING"
    beat.set_run_id("abc123")
    beat.stop("FINISHED", {"run_id": "abc123", "metrics": {"valid_auc": 0.9}})
    rec = read_record(out, "nightly")
    assert (rec.status, rec.run_id, rec.result["metrics"]) == ("FINISHED", "abc123", {"valid_auc": 0.9})
    again = claim(cfg(), schema, out)  # finished: returned as it is, nothing to train
    assert again.finished is not None and again.finished.job_id == first.job_id
    other = claim(cfg(), schema, out, new_run=True)
    assert other.finished is None and other.attempt == 1 and other.run_id is None


def test_an_unfinished_run_whose_driver_died_is_continued(job):
    cfg, schema, out = job
    rec = _record(out, cfg(), schema, run_id="r1", pid=_dead_pid(), host=socket.gethostname())
    nxt = claim(cfg("train.epochs=5", "scaling.num_workers=1"), schema, out)  # epochs, world: may change
    assert (nxt.attempt, nxt.job_id, nxt.run_id) == (2, rec.job_id, "r1")
    failed = _record(out, cfg(), schema, status="FAILED", pid=0)  # a failed run is continued too
    assert claim(cfg(), schema, out).job_id == failed.job_id


def test_a_driver_alive_on_this_host_is_never_taken_over(job):
    cfg, schema, out = job
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _record(out, cfg(), schema, pid=alive.pid, host=socket.gethostname())
        with pytest.raises(ConfigError, match=f"running in process {alive.pid}") as e:
            claim(cfg(), schema, out)
        assert "--new-run" in e.value.message
    finally:
        alive.kill()
        alive.wait()


def test_a_driver_on_another_host_is_waited_for_until_its_lease_ends(job):
    cfg, schema, out = job
    _record(out, cfg(), schema, pid=1, host="old-head-pod", heartbeat=1000.0)
    clock, slept = [1000.0 + 10], []

    def sleep(s):
        slept.append(s)
        clock[0] += s

    nxt = claim(cfg(), schema, out, now=lambda: clock[0], sleep=sleep)
    assert nxt.attempt == 2 and slept == [LEASE_S - 10]
    # a stale heartbeat: no wait
    _record(out, cfg(), schema, pid=1, host="old-head-pod", heartbeat=0.0)
    slept.clear()
    assert claim(cfg(), schema, out, now=lambda: clock[0], sleep=sleep).attempt >= 2 and slept == []


def test_a_config_that_changed_what_checkpoints_hold_is_refused_naming_the_keys(job):
    cfg, schema, out = job
    _record(out, cfg(), schema, pid=_dead_pid(), host=socket.gethostname())
    wider = ("model.embedding_dim=32", "model.bottom_mlp=[64,32]")
    with pytest.raises(ConfigError, match=r"model.bottom_mlp: .*model.embedding_dim: 16 -> 32") as e:
        claim(cfg(*wider), schema, out)
    assert e.value.category == "job_changed" and "--new-run" in e.value.message
    assert claim(cfg(*wider), schema, out, new_run=True).attempt == 1
    assert claim(cfg(*wider, f"train.resume_from={out}/x"), schema, out).attempt == 1  # an explicit resume: new


def test_a_damaged_record_is_an_error_naming_it(job):
    cfg, schema, out = job
    path = record_path(out, "nightly")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Path(path).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ConfigError, match="nightly.json is damaged"):
        claim(cfg(), schema, out)


def test_a_run_that_trained_every_epoch_before_its_driver_died_ends_finished(job):
    from tests._tiny_checkpoint import write_checkpoint

    from rayemb.train.driver.attempt import claim_attempt
    from rayemb.train.driver.trainer import check_inputs

    cfg, schema, out = job
    rec = _record(out, cfg(), schema, pid=_dead_pid(), host=socket.gethostname())
    # an epoch-end checkpoint of epoch 1 (of 1) in the run's own folder, as the dead driver's workers left it
    ckpt = write_checkpoint(os.path.join(out, "ray_results", rec.job_id, "checkpoint_000000"), schema,
                            cfg().to_dict()["model"])
    more = claim_attempt(check_inputs(cfg("train.epochs=2")), False)  # a second epoch asked for: trained from it
    assert more.attempt.finished is None and more.resume[0] == ckpt and more.attempt.attempt == 2
    done = claim_attempt(check_inputs(cfg("train.epochs=1")), False)
    assert done.attempt.finished is not None and done.attempt.finished.result["last_checkpoint"] == ckpt
    assert read_record(out, "nightly").status == "FINISHED"
