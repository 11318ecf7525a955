"""Publishers racing for one output, on moto's S3 server on 127.0.0.1 and on local disk.

Two ``--overwrite`` publishes that read the same marker: the one that writes second is refused by the
conditional PUT, reads the winner's marker and commits on top of it, so the final marker names a version
whose every file is there, and the version a reader resolved before either stays readable. A publish whose
version another one retired as abandoned is refused instead of naming it. Local overwrites of one path take
turns. The publishers are ordered at :func:`rayemb.publish.write_marker`, the commit point, so each
interleaving happens every run.
"""

from __future__ import annotations

import fcntl
import os
import threading

from test_publish import _read_all, _stage
from test_storage import BUCKET, moto_server, s3  # noqa: F401  (moto's server and its environment: fixtures)

from rayemb import publish, storage
from rayemb.errors import DataError
from rayemb.publish import cleanup, publish_dir, read_marker, resolve

#: seconds a test thread waits for another before the test fails (a hang is a failure, not a timing assertion)
WAIT_S = 120


def _files(tag: str, n: int = 6):
    return {f"part-{i:05d}.bin": (tag * (40 + i)).encode() for i in range(n)}


def test_racing_overwrites_leave_a_complete_version_and_the_old_one_readable(s3, tmp_path, monkeypatch):
    out = f"s3://{BUCKET}/race/out"
    old_files = _files("0")
    publish_dir(_stage(tmp_path / "s0", old_files), out)
    reading = resolve(out)  # a job starts reading the published version...
    names = sorted(read_marker(out)["files"])
    got = {n: storage.read_bytes(storage.join(reading, n)) for n in names[:3]}

    real, lock, first_call = publish.write_marker, threading.Lock(), set()
    both_read, a_done = threading.Barrier(2, timeout=WAIT_S), threading.Event()

    def ordered(dest, doc, *tag):
        with lock:
            first = threading.current_thread().name not in first_call
            first_call.add(threading.current_thread().name)
        if first:
            both_read.wait()  # both publishers have read the same marker
            if threading.current_thread().name == "b":
                assert a_done.wait(WAIT_S)  # b writes once a's publish has returned
        return real(dest, doc, *tag)

    monkeypatch.setattr(publish, "write_marker", ordered)
    wrote, errors = {}, []

    def publisher(name):
        try:
            wrote[name] = publish_dir(_stage(tmp_path / name, _files(name)), out, overwrite=True)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)
        finally:
            if name == "a":
                a_done.set()

    threads = [threading.Thread(target=publisher, args=(n,), name=n) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not errors and sorted(wrote) == ["a", "b"]

    # ...and reads the rest of it after both publishes
    got.update({n: storage.read_bytes(storage.join(reading, n)) for n in names[3:]})
    assert got == old_files
    marker = read_marker(out)
    assert f"{out}/{marker['version']}" == wrote["b"] and marker["replaces"] == wrote["a"][len(out) + 1:]
    assert _read_all(resolve(out)) == _files("b")  # every file the marker lists is there, with its size
    assert set(marker["retired"]) == {reading[len(out) + 1:], wrote["a"][len(out) + 1:]}
    assert _read_all(wrote["a"]) == _files("a")  # the loser of the marker is retired, not lost
    assert sorted(storage.listdir(f"{out}/_v")) == sorted(p.rsplit("/", 1)[1] for p in (reading, *wrote.values()))


def test_a_publish_whose_version_was_retired_as_abandoned_is_refused(s3, tmp_path, monkeypatch):
    out = f"s3://{BUCKET}/abandoned/out"
    old = publish_dir(_stage(tmp_path / "s0", _files("0")), out)
    real, cleaned = publish.write_marker, []

    def cleaned_meanwhile(dest, doc, *tag):
        if threading.current_thread().name == "slow" and not cleaned:
            # another process cleans up with no grace period while this upload awaits its marker
            cleaner = threading.Thread(target=lambda: cleaned.append(cleanup(dest, grace_s=0)), name="cleaner")
            cleaner.start()
            cleaner.join(WAIT_S)
        return real(dest, doc, *tag)

    monkeypatch.setattr(publish, "write_marker", cleaned_meanwhile)
    refused = []

    def slow():
        try:
            publish_dir(_stage(tmp_path / "slow", _files("s")), out, overwrite=True)
        except DataError as e:
            refused.append(e)

    t = threading.Thread(target=slow, name="slow")
    t.start()
    t.join(WAIT_S)
    (e,) = refused
    assert e.category == "output_conflict" and "grace period" in e.message
    assert len(cleaned[0]) == 1 and cleaned[0][0].startswith("_v/")  # the slow version, never named
    assert resolve(out) == old and _read_all(old) == _files("0")
    assert storage.listdir(f"{out}/_v") == [old.rsplit("/", 1)[1]]


def test_local_overwrites_of_one_path_take_turns(tmp_path, monkeypatch):
    dest = str(tmp_path / "out")
    publish_dir(_stage(tmp_path / "first", _files("0")), dest)
    real_rename, real_flock = os.rename, fcntl.flock
    a_moved_aside, b_went = threading.Event(), threading.Event()

    def rename(src, dst, *args, **kwargs):
        real_rename(src, dst, *args, **kwargs)
        if threading.current_thread().name == "a" and src == dest:
            a_moved_aside.set()  # a's old output is aside, its new one not yet in place: b starts now
            assert b_went.wait(WAIT_S)

    def flock(fd, op):
        if threading.current_thread().name == "b":
            b_went.set()  # b waits for its turn
        return real_flock(fd, op)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(fcntl, "flock", flock)
    errors = []

    def writer(name):
        try:
            if name == "b":
                assert a_moved_aside.wait(WAIT_S)
            publish_dir(_stage(tmp_path / name, _files(name)), dest, overwrite=True)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)
        finally:
            b_went.set()

    threads = [threading.Thread(target=writer, args=(n,), name=n) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not errors, errors[:1]
    assert _read_all(dest) == _files("b")  # b's turn came second: its output, whole
    assert sorted(os.listdir(tmp_path)) == ["out"]  # every staging folder consumed, nothing moved aside left
