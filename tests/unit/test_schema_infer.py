"""``rayemb schema infer``: schemas of real parquet written here, compared with what the converters declare for
the same data, raw-id capacities, the distinct-count sketch, and the command's errors and output file."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from rayemb.cli import main
from rayemb.data import infer
from rayemb.data.infer import infer_schema, raw_capacity
from rayemb.data.schema import DatasetSchema, load_checked
from tests._own_parquet import CRITEO_RENAMES, MOVIELENS_RENAMES, converted_criteo, converted_movielens, renamed_copy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def id_ranges(data):
    """(smallest, largest) id of every integer (or list of integer) column over both splits."""
    table = pa.concat_tables([pq.read_table(os.path.join(data, s)) for s in ("train", "valid")])
    out = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_list(col.type):
            col = pc.list_flatten(col)
        if pa.types.is_integer(col.type):
            out[name] = (pc.min(col).as_py(), pc.max(col).as_py())
    return out


def assert_same_kinds(inferred, converted, renames):
    """The converter's schema, columns renamed, has the inferred kinds; every encoded size is max id + 1, within
    the converter's (whose vocabularies keep a row for ids the data may not hold, the out-of-vocabulary one)."""
    assert inferred.labels == [renames.get(c, c) for c in converted.labels]
    assert list(inferred.dense) == [renames.get(c, c) for c in converted.dense]
    assert [(f.name, f.multi_hot, f.ids) for f in inferred.sparse] == [
        (renames.get(f.name, f.name), f.multi_hot, f.ids) for f in (*converted.sparse, *converted.sequence)]


def write_split(data, split, table, part=0):
    os.makedirs(os.path.join(data, split), exist_ok=True)
    pq.write_table(table, os.path.join(data, split, f"part-{part:05d}.parquet"))


# ---- what the converters declare, inferred back ---- #

@pytest.mark.parametrize("ids", [["--vocab-from-train"], ["--hash-buckets", 1000]])
def test_criteo_with_renamed_columns_infers_the_converters_schema(tmp_path, capsys, ids):
    src = converted_criteo(main, tmp_path, *ids)
    data = renamed_copy(src, str(tmp_path / "mine"), CRITEO_RENAMES)
    assert main(["schema", "infer", data]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the report's columns are padded to the longest name
    converted, inferred = DatasetSchema.load(src), load_checked(data)  # written, and the files match it
    assert_same_kinds(inferred, converted, CRITEO_RENAMES)
    ranges = id_ranges(data)
    for f, c in zip(inferred.sparse, converted.sparse):
        assert f.num_embeddings == ranges[f.name][1] + 1 <= c.num_embeddings, (f, c)
    rule = "max+1 <= 4 x distinct" if ids[0] == "--vocab-from-train" else "max+1 <= 65,536 (a small range)"
    assert "# cat_1 sparse encoded: ids in [{:,}, {:,}]".format(*ranges["cat_1"]) in printed and rule in printed
    assert "# num_1 dense float column" in printed and "# label label the column named 'label'" in printed


def test_movielens_with_renamed_columns_and_a_label_flag(tmp_path):
    src = converted_movielens(main, tmp_path)
    renames = MOVIELENS_RENAMES
    data = renamed_copy(src, str(tmp_path / "mine"), renames)
    inferred = infer_schema(data, labels=["liked"])
    converted = DatasetSchema.load(src)
    assert_same_kinds(inferred.schema, converted, renames)
    ranges = id_ranges(data)
    sizes = {f.name: f.num_embeddings for f in converted.sparse}
    for f in inferred.schema.sparse:
        assert f.num_embeddings == ranges[f.name][1] + 1 <= sizes[{v: k for k, v in renames.items()}[f.name]]
    assert inferred.schema.feature("recent_movies").multi_hot and inferred.rows == {"train": 440, "valid": 40}
    assert [c.kind for c in inferred.columns] == ["label", "dense", "sparse", "sparse", "sparse"]
    assert inferred.notes == []


# ---- raw ids ---- #

def test_raw_capacity_rule():
    assert [raw_capacity(d) for d in (0, 1, 2, 3, 4, 5, 1000, 1024)] == [2, 2, 4, 8, 8, 16, 2048, 2048]


def own_dataset(tmp_path, rows=600, seed=0):
    """Columns of every kind, as a user's export holds them: 64-bit ids, strings, lists, a sparse range..."""
    rng = np.random.default_rng(seed)
    data = str(tmp_path / "own")
    users = rng.integers(-2**63, 2**63 - 1, size=150, dtype=np.int64)  # random 64-bit ids, negative ones too
    cities = np.array([f"city-{i}" for i in range(40)])
    for split, n in (("train", rows), ("valid", rows // 4)):
        tags = [[f"t{int(x)}" for x in rng.integers(0, 25, size=int(k))] for k in rng.integers(0, 4, size=n)]
        write_split(data, split, pa.table({
            "request_id": pa.array(rng.integers(0, 2**40, size=n)),
            "click": pa.array(rng.integers(0, 2, size=n)),
            "user": pa.array(rng.choice(users, size=n)),
            "city": pa.array(rng.choice(cities, size=n)),
            "tags": pa.array(tags, type=pa.list_(pa.string())),
            "ad": pa.array(rng.integers(0, 90, size=n) * 1_000_003),  # 90 ids spread up to 9e7: mostly unused
            "slot": pa.array(rng.integers(0, 7, size=n).astype(np.uint16) * 100),  # sparse, but a small range
            "is_mobile": pa.array(rng.random(n) < 0.5),
            "price": pa.array(rng.random(n).astype(np.float32)),
            "seen_at": pa.array(rng.integers(0, 10**9, size=n).astype("datetime64[s]")),
            "geo": pa.array([{"lat": 1.0, "lon": 2.0}] * n),
        }))
    return data


def test_64_bit_and_string_ids_are_raw_with_the_capacity_rule(tmp_path):
    data = own_dataset(tmp_path)
    inferred = infer_schema(data, labels=["click"], exclude=["request_id"])
    both = pa.concat_tables([pq.read_table(os.path.join(data, s)) for s in ("train", "valid")])
    distinct = {c: len(set(both.column(c).to_pylist())) for c in ("user", "city", "ad")}
    distinct["tags"] = len({t for bag in both.column("tags").to_pylist() for t in bag})
    s = inferred.schema
    assert s.labels == ["click"] and list(s.dense) == ["is_mobile", "price"]
    raw = {f.name: (f.num_embeddings, f.multi_hot, f.eviction) for f in s.sparse if f.ids == "raw"}
    assert raw == {"user": (raw_capacity(distinct["user"]), False, "lru"),
                   "city": (raw_capacity(distinct["city"]), False, "lru"),
                   "tags": (raw_capacity(distinct["tags"]), True, "lru"),
                   "ad": (raw_capacity(distinct["ad"]), False, "lru")}
    assert s.feature("slot").ids == "encoded" and s.feature("slot").num_embeddings == 601
    kinds = {c.name: (c.kind, c.rule) for c in inferred.columns}
    assert kinds["request_id"] == ("excluded", "--exclude")
    assert kinds["user"][1].startswith("raw: negative ids") and kinds["city"][1].startswith("raw: string ids")
    assert "max+1 > 4 x distinct" in kinds["ad"][1] and "eviction lru" in kinds["ad"][1]
    assert kinds["seen_at"][0] == kinds["geo"][0] == "skipped"
    assert [n for n in inferred.notes if "skipped" in n] == [
        "column 'seen_at' skipped: type timestamp[ms] is not supported (dense: float or bool; sparse: integer, "
        "string, or a list of them)",
        "column 'geo' skipped: type struct<lat: double, lon: double> is not supported (dense: float or bool; "
        "sparse: integer, string, or a list of them)"]
    # what it writes reads back as the same schema, and the files pass the column checks
    assert main(["schema", "infer", data, "--label", "click", "--exclude", "request_id"]) == 0
    assert load_checked(data) == s


def test_distinct_ids_exact_across_batches_and_files_then_sketched(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    data = str(tmp_path / "many")
    ids = {}
    for part in range(3):
        v = rng.integers(0, 40_000, size=9_000) * 7
        ids.setdefault("v", set()).update(v.tolist())
        write_split(data, "train", pa.table({"label": np.zeros(len(v), np.float32), "v": v}), part)
    write_split(data, "valid", pa.table({"label": np.zeros(3, np.float32), "v": np.array([0, 7, 14])}))
    monkeypatch.setattr(infer, "SCAN_BATCH_ROWS", 1000)  # many batches and several merges per file
    exact = len(ids["v"] | {0, 7, 14})
    inferred = infer_schema(data)
    assert inferred.columns[1].rule == (f"raw: ids in [0, 279,986]; max+1 > 4 x distinct and > 65,536; {exact:,} "
                                        "distinct -> capacity 65,536 (next power of two >= 2 x distinct), "
                                        "eviction lru")
    assert inferred.schema.feature("v").num_embeddings == raw_capacity(exact)
    monkeypatch.setattr(infer, "EXACT_DISTINCT_MAX", 2_000)  # past it, HyperLogLog
    rule = infer_schema(data).columns[1].rule
    estimate = int(re.search(r"([\d,]+) distinct \(HyperLogLog estimate\)", rule).group(1).replace(",", ""))
    assert abs(estimate - exact) < 0.05 * exact, (estimate, exact)


def test_bad_values_and_null_ids_in_lists_are_noted(tmp_path):
    data = str(tmp_path / "bad")
    write_split(data, "train", pa.table({"label": [0.0, 1.0, 0.5], "x": [1.0, float("nan"), 2.0],
                                         "bag": pa.array([[1, None], [2], []], type=pa.list_(pa.int64())),
                                         "empty": pa.array([None, None, None], type=pa.int64())}))
    inferred = infer_schema(data)
    assert [f.name for f in inferred.schema.sparse] == ["bag"]
    notes = "\n".join(inferred.notes)
    assert "column 'empty' skipped: no values in any row" in notes
    assert "no valid/ parquet files" in notes and "1 label value(s)" in notes
    assert "dense column 'x' holds 1 NaN" in notes and "'bag' holds 1 null id(s) inside its lists" in notes


# ---- errors and the output file ---- #

def test_missing_label_exits_2_naming_the_columns(tmp_path):
    data = str(tmp_path / "nolabel")
    write_split(data, "train", pa.table({"clicked": [0, 1], "item": [3, 4]}))
    p = subprocess.run([sys.executable, "-m", "rayemb.cli", "schema", "infer", data], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("rayemb: error: The parquet files have no column named 'label' (the label unless "
                               "--label names another); their columns: ['clicked', 'item']."), p.stderr
    assert "--label COL" in p.stderr and not os.path.exists(os.path.join(data, "schema.yaml"))


def _files(data, **splits):
    for split, tables in splits.items():
        for i, t in enumerate(tables):
            write_split(data, split, t, i)
    return data


ROW = pa.table({"label": [1.0], "item": [2]})


@pytest.mark.parametrize("make,argv,needle", [
    (lambda d: os.makedirs(d), [], "has no train/ split"),
    (lambda d: os.makedirs(os.path.join(d, "train")), [], "train/ holds no .parquet files"),
    (lambda d: _files(d, train=[ROW], valid=[ROW.append_column("extra", pa.array([1]))]), [],
     "has other columns than"),
    (lambda d: _files(d, train=[ROW, ROW.set_column(1, "item", pa.array([2], pa.int32()))]), [],
     "other types: ['item (int64 vs int32)']"),
    (lambda d: _files(d, train=[ROW]), ["--label", "item", "--label", "nope"],
     "no column(s) ['nope'], which --label names"),
    (lambda d: _files(d, train=[ROW]), ["--exclude", "nope"], "--exclude names ['nope']"),
    (lambda d: _files(d, train=[pa.table({"label": ["yes"], "item": [2]})]), [], "a label must be numeric"),
    (lambda d: _files(d, train=[pa.table({"label": [1.0], "x": [2.0]})]), [], "no column that can be a sparse"),
])
def test_user_errors(tmp_path, capsys, make, argv, needle):
    data = str(tmp_path / "d")
    make(data)
    assert main(["schema", "infer", data, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rayemb: error: ") and needle in err, err


def test_an_existing_schema_is_kept_unless_forced(tmp_path, capsys):
    data = _files(str(tmp_path / "d"), train=[pa.table({"label": [1.0, 0.0], "item": [5, 9]})], valid=[ROW])
    target = os.path.join(data, "schema.yaml")
    assert main(["schema", "infer", data]) == 0
    first = open(target).read()
    assert yaml.safe_load(first)["sparse"] == [{"name": "item", "num_embeddings": 10, "multi_hot": False}]
    assert first.startswith("# written by `rayemb schema infer` from 2 train rows, 1 valid rows; per column:\n")
    with open(target, "w") as f:
        f.write("label: mine\n")
    capsys.readouterr()
    assert main(["schema", "infer", data]) == 2
    assert "schema.yaml already exists; pass --force" in capsys.readouterr().err
    assert open(target).read() == "label: mine\n"
    assert main(["schema", "infer", data, "--force"]) == 0 and open(target).read() == first
    other = str(tmp_path / "elsewhere" / "s.yaml")
    assert main(["schema", "infer", data, "--out", other]) == 0 and open(other).read() == first
    out = capsys.readouterr().out
    assert "wrote " + other + ": 1 label(s), 0 dense, 1 sparse (0 raw-id) columns" in out
    assert not [n for n in os.listdir(data) if ".tmp" in n]  # written through a temp file, renamed
