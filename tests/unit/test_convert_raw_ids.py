"""``rayemb convert criteo --ids raw`` (the hex values themselves as ids, a capacity for num_embeddings), the
choice of engine, and the synthetic Criteo text the engines are benchmarked on; the single-process engine only
(tests/ray/test_convert_ray.py runs the Ray engine on the same inputs)."""

from __future__ import annotations

import collections
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from _convert_engines import convert_argv, sample_lines, summary, write_text

from rayemb.cli import main
from rayemb.convert import ConvertOptions, engine_for
from rayemb.convert.synthetic import criteo_lines, write_criteo
from rayemb.data.schema import load_checked
from rayemb.errors import ConfigError


def _rows(out, split):
    return pq.read_table(os.path.join(out, split)).to_pylist()


def test_raw_ids_are_the_hex_values_and_capacity_counts_train_ids(tmp_path):
    lines = sample_lines()
    src = write_text(tmp_path / "train.txt", lines)
    out = str(tmp_path / "raw")
    assert main(convert_argv([src], out, "local", "--ids", "raw", "--valid-fraction", 0.25)) == 0
    train, valid = _rows(out, "train"), _rows(out, "valid")
    by_label_and_i2 = collections.Counter((r["label"], r["I2"], r["C1"], r["C26"]) for r in train + valid)
    fields = [ln.split("\t") for ln in lines]
    assert by_label_and_i2 == collections.Counter(
        (float(f[0]), float(f[2]) if f[2] else None, int(f[14], 16) if f[14] else None,
         int(f[39], 16) if f[39] else None) for f in fields)
    with open(os.path.join(out, "schema.yaml")) as f:
        entries = {e["name"]: e for e in yaml.safe_load(f)["sparse"]}
    for t in range(1, 27):
        distinct = {r[f"C{t}"] for r in train if r[f"C{t}"] is not None}
        assert entries[f"C{t}"]["ids"] == "raw"
        assert entries[f"C{t}"]["num_embeddings"] == len(distinct) + 1  # a row for the ids the table does not hold
    assert load_checked(out).feature("C3").ids == "raw"
    s = summary(out)
    assert s["ids"]["mode"] == "raw" and s["ids"]["capacity"] is None
    assert s["ids"]["distinct_train_ids"]["C3"] == entries["C3"]["num_embeddings"] - 1
    assert "distinct_ids_used" not in s["tables"]["C3"]  # raw ids are not bounded by num_embeddings

    capped = str(tmp_path / "capped")
    assert main(convert_argv([src], capped, "local", "--ids", "raw", "--capacity", 1000, "--valid-fraction", 0.25)) == 0
    assert {f.num_embeddings for f in load_checked(capped).sparse} == {1000}
    assert _rows(capped, "train") == train and summary(capped)["ids"]["capacity"] == 1000


def test_raw_ids_of_values_past_int64_keep_their_low_63_bits(tmp_path):
    fields = sample_lines()[0].split("\t")
    fields[14], fields[15] = "ffffffffffffffff", "7fffffffffffffff"
    src = write_text(tmp_path / "day_0", ["\t".join(fields)] + sample_lines()[1:20])
    out = str(tmp_path / "out")
    assert main(convert_argv([src], out, "local", "--ids", "raw", "--valid-fraction", 0.5, "--seed", 3)) == 0
    first = next(r for r in _rows(out, "train") + _rows(out, "valid") if r["C2"] == 2**63 - 1)
    assert first["C1"] == 2**63 - 1


@pytest.mark.parametrize("argv,message", [
    (["criteo", "--ids", "raw", "--capacity", "1"], "--capacity 1: give it with --ids raw, at least 2"),
    (["criteo", "--hash-buckets", "5", "--capacity", "10"], "give it with --ids raw"),
    (["avazu", "--ids", "raw"], "--ids raw keeps Criteo's hex values"),
    (["avazu", "--hash-buckets", "5", "--engine", "ray"], "--engine ray converts ['criteo']"),
    (["movielens", "--engine", "ray"], "--engine ray converts ['criteo']"),
])
def test_option_errors_before_any_work(tmp_path, capsys, argv, message):
    src = write_text(tmp_path / "train.txt", sample_lines()[:5])
    assert main(["convert", argv[0], "--input", src, "--out", str(tmp_path / "out"), *argv[1:]]) == 2
    assert message in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["train.txt"]


def test_auto_engine_takes_ray_for_big_criteo_inputs_or_a_cluster_address(tmp_path, monkeypatch):
    src = write_text(tmp_path / "train.txt", sample_lines())

    def engine(fmt="criteo", **kw):
        return engine_for(fmt, ConvertOptions(inputs=(src,), out=str(tmp_path / "o"), hash_buckets=5, **kw))

    assert engine() == "local" and engine(engine="ray") == "ray" and engine(address="head:6379") == "ray"
    assert engine("avazu", address="head:6379") == "local"
    monkeypatch.setattr("rayemb.convert.AUTO_RAY_MIN_BYTES", os.path.getsize(src))
    assert engine() == ("ray" if (os.cpu_count() or 1) > 1 else "local") and engine(engine="local") == "local"
    monkeypatch.setattr("rayemb.convert.AUTO_RAY_MIN_BYTES", 1)
    missing = ConvertOptions(inputs=(str(tmp_path / "nope"),), out=str(tmp_path / "o"), hash_buckets=5)
    assert engine_for("criteo", missing) == "local"  # the converter then names the missing input
    with pytest.raises(ConfigError, match="--engine 'fast'"):
        ConvertOptions(inputs=(src,), out="o", hash_buckets=5, engine="fast")


def test_dense_counts_above_2_to_24_round_to_float32(tmp_path):
    fields = sample_lines()[0].split("\t")
    fields[5] = "23159457"  # past 2**24, as some of Kaggle's I5 counts: a float32 holds it rounded
    src = write_text(tmp_path / "day_0", ["\t".join(fields)] * 8)
    out = str(tmp_path / "out")
    assert main(convert_argv([src], out, "local", "--hash-buckets", 10, "--valid-fraction", 0.5)) == 0
    assert {r["I5"] for r in _rows(out, "train") + _rows(out, "valid")} == {float(np.float32(23159456))}


def test_synthetic_criteo_is_seeded_well_formed_and_marks_its_bad_lines(tmp_path):
    assert criteo_lines(500, seed=1).equals(criteo_lines(500, seed=1))
    assert not criteo_lines(500, seed=1).equals(criteo_lines(500, seed=2))
    path = write_criteo(str(tmp_path / "day_0.gz"), 3000, seed=4, bad_every=1000)
    out = str(tmp_path / "out")
    assert main(convert_argv([path], out, "local", "--vocab-from-train")) == 0
    s = summary(out)
    assert s["lines_read"] == 3000 and s["bad_lines"]["by_kind"] == {"wrong_field_count": 3}
    assert [e["line"] for e in s["bad_lines"]["examples"]] == [1000, 2000, 3000]
    assert 0.2 < s["label_mean"]["train"] < 0.3 and s["tables"]["C1"]["num_embeddings"] == 5
    assert sum(s["tables"]["C6"]["empty_rows"].values()) > 800  # a column with many empty values
