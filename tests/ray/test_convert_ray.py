"""``rayemb convert criteo --engine ray`` on the shared local 2-CPU Ray gives the single-process engine's
dataset: the same part files, rows in the same order, ids, dense values, split, schema.yaml and summary.

Inputs: the real 200-row sample in its tab-separated form (malformed lines added), and synthetic Criteo text
of 20,000 lines (a .gz input, a plain one), cut into several chunks and blocks so that the order across
chunks, blocks and files is exercised, and so that the part files, which tasks write, take rows from several
chunks and a chunk's rows go to several parts. A conversion that fails, in a task or on the driver, after
tasks wrote parts leaves nothing behind, on disk or in a bucket (moto's S3 server on 127.0.0.1).
"""

from __future__ import annotations

import os
import tempfile

import pyarrow.parquet as pq
import pytest
from _convert_engines import assert_same_dataset, both_engines, convert_argv, sample_lines, summary, write_text
from _servers import MotoS3Server

from rayemb import storage
from rayemb.cli import main
from rayemb.convert.synthetic import write_criteo
from rayemb.publish import resolve_dataset

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: small blocks and chunks: many of each even for 200 lines
SMALL = ("--block-size-mib", 0.004)
RAY_SMALL = ("--chunk-size-mib", 0.01)


def _with_bad_lines(lines):
    fields = [ln.split("\t") for ln in lines[:8]]
    bad = {11: "\t".join(fields[0][:39]), 31: "\t".join(fields[1][:14] + ["zz5d9164"] + fields[1][15:]),
           51: "\t".join(fields[2][:3] + ["1.5"] + fields[2][4:]), 71: "\t".join(["2"] + fields[3][1:]), 91: "",
           95: "\t" * 39, 96: "\t".join(fields[4][:3] + ["1\x012"] + fields[4][4:]), 97: "a\x01b",
           150: "\t".join(fields[5] + ["41st"])}
    out = list(lines)
    for n in sorted(bad):
        out.insert(n - 1, bad[n])
    return out


def test_sample_with_bad_lines_in_many_chunks(ray_2_cpus, tmp_path):
    src = write_text(tmp_path / "train.txt", _with_bad_lines(sample_lines()))
    local, ray = both_engines(main, tmp_path, [src], "--hash-buckets", 997, "--valid-fraction", 0.25,
                              "--max-bad-fraction", 0.1, "--rows-per-file", 64, *SMALL, ray_options=RAY_SMALL)
    assert_same_dataset(local, ray)
    s = summary(ray)
    assert s["engine"]["name"] == "ray" and s["engine"]["chunks"] >= 4 and s["engine"]["cpus"] == 2
    assert s["bad_lines"]["by_kind"] == {"wrong_field_count": 3, "categorical": 1, "dense": 1, "label": 2,
                                         "unreadable": 2}
    assert len(os.listdir(os.path.join(ray, "train"))) >= 2


@pytest.mark.parametrize("ids", [["--vocab-from-train", "--min-count", "2"], ["--ids", "raw"]])
def test_sample_as_day_files_gz_and_plain_with_valid_days(ray_2_cpus, tmp_path, ids):
    lines = sample_lines()
    days = [write_text(tmp_path / "day_0", lines[:80]), write_text(tmp_path / "day_1.gz", lines[80:150], compress=True),
            write_text(tmp_path / "day_23.gz", lines[150:], compress=True)]
    local, ray = both_engines(main, tmp_path, days, *ids, "--valid-days", 23, *SMALL, ray_options=RAY_SMALL)
    assert_same_dataset(local, ray)
    assert summary(ray)["rows"] == {"train": 150, "valid": 50}


@pytest.mark.parametrize("ids", [["--hash-buckets", "100000"], ["--vocab-from-train", "--min-count", "2"],
                                 ["--ids", "raw", "--capacity", "4096"]])
def test_synthetic_20k_lines_gz_and_plain(ray_2_cpus, tmp_path, ids):
    inputs = [write_criteo(str(tmp_path / "part_0.gz"), 12_000, seed=1, bad_every=3000),
              write_criteo(str(tmp_path / "part_1.txt"), 8_000, seed=2)]
    local, ray = both_engines(main, tmp_path, inputs, *ids, "--rows-per-file", 5000, "--block-size-mib", 0.25,
                              ray_options=("--chunk-size-mib", 0.5))
    assert_same_dataset(local, ray)
    s = summary(ray)
    assert s["lines_read"] == 20_000 and s["bad_lines"]["by_kind"] == {"wrong_field_count": 4}
    assert s["engine"]["chunks"] >= 3  # the .gz file whole, the plain one cut


def test_parts_that_tasks_write_from_many_chunks_are_the_local_engine_parts(ray_2_cpus, tmp_path):
    src = write_criteo(str(tmp_path / "train.txt"), 20_000, seed=4, bad_every=1500)
    local, ray = both_engines(main, tmp_path, [src], "--hash-buckets", 5000, "--valid-fraction", 0.2,
                              "--rows-per-file", 3000, "--block-size-mib", 0.1,
                              ray_options=("--chunk-size-mib", 0.3))
    assert_same_dataset(local, ray)
    s = summary(ray)
    assert s["engine"]["chunks"] >= 12 and s["rows"]["train"] > 5 * 3000  # every part spans chunk boundaries
    train = sorted(os.listdir(os.path.join(ray, "train")))
    assert len(train) == -(-s["rows"]["train"] // 3000)
    assert all(pq.ParquetFile(os.path.join(ray, "train", p)).metadata.num_row_groups >= 2 for p in train[:-1])


def _broken_copy(good: str, path) -> str:
    """``good``'s lines with one that is not UTF-8 inserted near the end: the last chunks' task fails on it."""
    with open(good, "rb") as f:
        data = f.read()
    cut = data.index(b"\n", len(data) * 9 // 10) + 1  # the last chunks: the first parts are written by then
    path.write_bytes(data[:cut] + b"1" + b"\t\xff\xfe" * 39 + b"\n" + data[cut:])
    return str(path)


def test_a_task_failing_after_parts_were_written_leaves_nothing(ray_2_cpus, tmp_path, capsys, monkeypatch):
    from rayemb.convert.ray_encode import EncodePass

    parts = []
    submit = EncodePass._submit
    monkeypatch.setattr(EncodePass, "_submit", lambda self, path, *a: (parts.append(path), submit(self, path, *a)))
    broken = _broken_copy(write_criteo(str(tmp_path / "whole.txt"), 20_000, seed=5), tmp_path / "day_0")
    errors = {}
    for engine in ("local", "ray"):
        out = tmp_path / engine / "criteo"
        small = ("--chunk-size-mib", 0.3) if engine == "ray" else ()
        argv = convert_argv([broken], str(out), engine, "--hash-buckets", 50, "--rows-per-file", 1000,
                            "--block-size-mib", 0.1, *small)
        assert main(argv) == 2
        errors[engine] = capsys.readouterr().err.strip().splitlines()[-1]
        assert not out.exists() and os.listdir(out.parent) == []  # no staging folder left either
    assert len(parts) >= 10  # tasks were writing parts when the failing chunk's turn came
    # the same error; the reader's own words after it name a row of the block it read, which differs
    said = {engine: e.split(" (")[0] for engine, e in errors.items()}
    assert said["ray"] == said["local"] == f"rayemb: error: Input '{broken}' cannot be read as text", errors


@pytest.fixture
def s3(monkeypatch):
    server = MotoS3Server().start()
    server.create_bucket("convert")
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    yield server
    server.stop()


def test_into_a_bucket_the_dataset_appears_whole_or_not_at_all(ray_2_cpus, tmp_path, s3, monkeypatch):
    src = write_criteo(str(tmp_path / "train.txt"), 20_000, seed=6)
    options = ("--hash-buckets", 5000, "--rows-per-file", 4000, "--block-size-mib", 0.25)
    small = ("--chunk-size-mib", 0.5)
    assert main(convert_argv([src], str(tmp_path / "local"), "local", *options)) == 0
    staging = tmp_path / "tmp"  # where the driver stages a bucket's dataset, and the tasks write its parts
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    assert main(convert_argv([src], "s3://convert/criteo", "ray", *options, *small)) == 0
    assert os.listdir(staging) == []
    with storage.local_copy(resolve_dataset("s3://convert/criteo")) as published:
        assert_same_dataset(str(tmp_path / "local"), published)

    broken = _broken_copy(src, tmp_path / "day_0")
    assert main(convert_argv([broken], "s3://convert/failed", "ray", *options, *small)) == 2
    assert s3.keys("convert", "failed") == [] and os.listdir(staging) == []


def test_a_failed_conversion_says_what_the_local_engine_says_and_leaves_nothing(ray_2_cpus, tmp_path, capsys):
    src = write_text(tmp_path / "day_0", _with_bad_lines(sample_lines()))
    errors = {}
    for engine in ("local", "ray"):
        out = tmp_path / engine / "criteo"
        small = (*SMALL, *RAY_SMALL) if engine == "ray" else SMALL
        assert main(convert_argv([src], str(out), engine, "--hash-buckets", 997, *small)) == 2
        errors[engine] = capsys.readouterr().err.strip().splitlines()[-1]
        assert not out.exists() and os.listdir(out.parent) == []  # no staging folder left either
    assert errors["ray"] == errors["local"] and "9 of 209 lines" in errors["ray"]


def test_an_input_broken_past_its_head_fails_in_a_task_as_it_fails_locally(ray_2_cpus, tmp_path, capsys):
    good = write_criteo(str(tmp_path / "whole.gz"), 20_000, seed=3)
    with open(good, "rb") as f:
        data = f.read()
    broken = tmp_path / "day_0.gz"
    broken.write_bytes(data[: len(data) // 2] + b"\x00" * 64 + data[len(data) // 2:])  # past the head's 64 KiB
    errors = {}
    for engine in ("local", "ray"):
        out = tmp_path / engine / "criteo"
        assert main(convert_argv([str(broken)], str(out), engine, "--hash-buckets", 50)) == 2
        errors[engine] = capsys.readouterr().err.strip().splitlines()[-1]
        assert not out.exists() and os.listdir(out.parent) == []
    assert errors["ray"] == errors["local"] and "cannot be read as text" in errors["ray"], errors


def test_the_running_ray_is_used_and_left_running(ray_2_cpus, tmp_path):
    before = ray_2_cpus.get_runtime_context().gcs_address
    src = write_text(tmp_path / "train.txt", sample_lines())
    assert main(convert_argv([src], str(tmp_path / "out"), "ray", "--hash-buckets", 50)) == 0
    assert ray_2_cpus.is_initialized() and ray_2_cpus.get_runtime_context().gcs_address == before
    assert summary(str(tmp_path / "out"))["engine"] == {"name": "ray", "cpus": 2, "chunks": 1}


def test_without_a_running_ray_a_local_one_is_started_and_stopped(shared_ray, tmp_path):
    import ray

    shared_ray.stop()  # the next test that asks for the shared Ray starts it again
    src = write_text(tmp_path / "train.txt", sample_lines())
    assert main(convert_argv([src], str(tmp_path / "out"), "ray", "--hash-buckets", 50)) == 0
    assert not ray.is_initialized() and summary(str(tmp_path / "out"))["engine"]["name"] == "ray"
