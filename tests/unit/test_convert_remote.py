"""``rayemb convert`` from and to a bucket (moto's S3 server on 127.0.0.1): inputs streamed from S3
(gzip included), the dataset published only when complete (a version named by its marker), equal to a
local conversion of the same files."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
from test_convert import _with_bad_lines, criteo_rows, run, write_lines, write_tsv
from test_storage import BUCKET, moto_server, s3  # noqa: F401  (moto's server and its environment: fixtures)

from rayemb import storage
from rayemb.data.schema import load_checked
from rayemb.publish import read_marker, resolve_dataset

def _tables(root: str):
    with storage.local_copy(resolve_dataset(root)) as local:
        return {split: pq.read_table(os.path.join(local, split)).to_pylist() for split in ("train", "valid")}, \
            sorted(os.listdir(local))


def test_criteo_from_s3_to_s3_equals_a_local_conversion(s3, tmp_path):
    rows = criteo_rows()
    days = [write_tsv(tmp_path / "day_0", rows[:120]), write_tsv(tmp_path / "day_23.gz", rows[120:], compress=True)]
    for d in days:
        storage.upload_file(d, f"s3://{BUCKET}/raw/{os.path.basename(d)}")
    remote_in = [f"s3://{BUCKET}/raw/{os.path.basename(d)}" for d in days]
    argv = ["--hash-buckets", 97, "--valid-days", 23, "--rows-per-file", 50]

    assert run("criteo", "--input", *days, "--out", tmp_path / "local", *argv) == 0
    out = f"s3://{BUCKET}/criteo"
    assert run("criteo", "--input", *remote_in, "--out", out, *argv) == 0

    schema = load_checked(resolve_dataset(out))  # what `rayemb train` checks, on the bucket
    assert [f.num_embeddings for f in schema.sparse] == [97] * 26
    remote, names = _tables(out)
    local, local_names = _tables(str(tmp_path / "local"))
    assert remote == local and len(remote["train"]) == 120 and len(remote["valid"]) == 80
    assert names == local_names == ["convert_summary.json", "schema.yaml", "train", "valid"]
    keys = s3.keys(BUCKET, "criteo/")
    first = read_marker(out)["version"]
    assert f"criteo/{first}/train/part-00002.parquet" in keys and "criteo/_PUBLISHED.json" in keys
    assert not [k for k in keys if "partial" in k]

    # an existing dataset is kept unless --overwrite, which replaces it whole (the old version only retired)
    assert run("criteo", "--input", remote_in[0], "--out", out, "--hash-buckets", 5) == 2
    assert s3.keys(BUCKET, "criteo/") == keys
    assert run("criteo", "--input", remote_in[0], "--out", out, "--hash-buckets", 5, "--rows-per-file", 1000,
               "--overwrite") == 0
    assert load_checked(resolve_dataset(out)).sparse[0].num_embeddings == 5
    assert read_marker(out)["version"] != first and list(read_marker(out)["retired"]) == [first]


def test_a_failed_conversion_leaves_nothing_in_the_bucket(s3, tmp_path, capsys):
    lines, _ = _with_bad_lines(criteo_rows())
    src = write_lines(tmp_path / "day_0", lines)
    storage.upload_file(src, f"s3://{BUCKET}/bad/day_0")
    assert run("criteo", "--input", f"s3://{BUCKET}/bad/day_0", "--out", f"s3://{BUCKET}/failed",
               "--hash-buckets", 997) == 2
    err = capsys.readouterr().err
    assert "5 of 205 lines" in err and "day_0 line 11" in err
    assert s3.keys(BUCKET, "failed") == []
    assert run("criteo", "--input", f"s3://{BUCKET}/bad/missing", "--out", f"s3://{BUCKET}/failed",
               "--hash-buckets", 9) == 2
    assert "do not exist" in capsys.readouterr().err and s3.keys(BUCKET, "failed") == []
