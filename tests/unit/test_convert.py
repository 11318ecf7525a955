"""``rayemb convert``: Criteo (the real 200-row sample in its tab-separated form), Avazu and MovieLens files
written here, converted through the CLI, and the parquet read back and compared with the source lines."""

from __future__ import annotations

import collections
import csv
import datetime
import gzip
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayemb.cli import main
from rayemb.data.schema import load_checked

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "criteo_sample.txt")


# ---- helpers ---- #

def criteo_rows():
    """The fixture (CSV with a header, dense written as floats) in Criteo's own form: lists of 40 strings."""
    with open(FIXTURE) as f:
        rows = list(csv.reader(f))[1:]
    return [[str(int(float(r[0])))] + [str(int(float(v))) if v else "" for v in r[1:14]] + r[14:] for r in rows]


def write_lines(path, lines, compress=False):
    opener = gzip.open if compress else open
    with opener(path, "wt") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


def write_tsv(path, rows, **kw):
    return write_lines(path, ["\t".join(r) for r in rows], **kw)


def read_split(out, split):
    return pq.read_table(os.path.join(out, split)).to_pylist()


def summary(out):
    with open(os.path.join(out, "convert_summary.json")) as f:
        return json.load(f)


def run(*argv):
    return main(["convert", *map(str, argv)])


def expected_criteo(row, ids):
    d = {"label": float(row[0])}
    d.update({f"I{j}": (float(row[j]) if row[j] else None) for j in range(1, 14)})
    d.update({f"C{j - 13}": (ids(j - 13, row[j]) if row[j] else None) for j in range(14, 40)})
    return d


def assert_rows_split_in_order(source, train, valid, ids):
    """Each split keeps the source's order: the two outputs interleave back into the source rows exactly."""
    ti = vi = 0
    for row in source:
        want = expected_criteo(row, ids)
        if ti < len(train) and train[ti] == want:
            ti += 1
        else:
            assert vi < len(valid) and valid[vi] == want, f"source row {row[:5]} not found in order"
            vi += 1
    assert (ti, vi) == (len(train), len(valid))


def fnv1a64(s: str) -> int:
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


def vocab(values, min_count, key):
    counts = collections.Counter(v for v in values if v != "")
    kept = sorted((v for v, c in counts.items() if c >= min_count), key=lambda v: (-counts[v], key(v)))
    return {v: i for i, v in enumerate(kept)}


# ---- Criteo ---- #

def test_criteo_hash_ids_dense_nulls_and_a_dataset_train_accepts(tmp_path):
    rows = criteo_rows()
    src = write_tsv(tmp_path / "train.txt", rows)
    out = str(tmp_path / "criteo")
    assert run("criteo", "--input", src, "--out", out, "--hash-buckets", 1000, "--valid-fraction", 0.25,
               "--rows-per-file", 64, "--block-size-mib", 0.004) == 0
    schema = load_checked(out)
    assert list(schema.dense) == [f"I{i}" for i in range(1, 14)]
    assert [(f.name, f.num_embeddings, f.multi_hot) for f in schema.sparse] == [(f"C{i}", 1000, False)
                                                                              for i in range(1, 27)]
    train, valid = read_split(out, "train"), read_split(out, "valid")
    assert len(train) + len(valid) == 200 and 25 <= len(valid) <= 75
    assert_rows_split_in_order(rows, train, valid, lambda t, v: int(v, 16) % 1000)
    assert sum(r["I1"] is None for r in train + valid) == 90  # empty fields stay null, not 0
    assert sum(r["C22"] is None for r in train + valid) == 159
    assert min(r["I2"] for r in train + valid) == -1.0  # raw values: the log is applied at batch time
    # parts of --rows-per-file rows; the tiny block size made many blocks
    parts = sorted(os.listdir(os.path.join(out, "train")))
    assert parts == [f"part-{i:05d}.parquet" for i in range(-(-len(train) // 64))]
    s = summary(out)
    assert s["rows"] == {"train": len(train), "valid": len(valid)} and s["lines_read"] == 200
    assert s["bad_lines"]["total"] == 0 and s["tables"]["C9"]["num_embeddings"] == 1000
    assert s["tables"]["C9"]["distinct_ids_used"] == 2 and s["tables"]["C22"]["empty_rows"]["train"] + \
        s["tables"]["C22"]["empty_rows"]["valid"] == 159
    # the split depends on (seed, input, line number) only, not on block sizes
    out2 = str(tmp_path / "again")
    assert run("criteo", "--input", src, "--out", out2, "--hash-buckets", 1000, "--valid-fraction", 0.25) == 0
    assert read_split(out2, "valid") == valid
    out3 = str(tmp_path / "seed")
    assert run("criteo", "--input", src, "--out", out3, "--hash-buckets", 1000, "--valid-fraction", 0.25,
               "--seed", 1) == 0
    assert read_split(out3, "valid") != valid


def test_criteo_vocabulary_by_train_frequency_with_oov(tmp_path):
    rows = criteo_rows()
    train_src = write_tsv(tmp_path / "part_a.txt", rows[:150])
    valid_src = write_tsv(tmp_path / "part_b.txt", rows[150:])
    out = str(tmp_path / "vocab")
    assert run("criteo", "--input", train_src, "--valid-input", valid_src, "--out", out, "--vocab-from-train",
               "--min-count", 2) == 0
    schema = load_checked(out)
    vocabs = {t: vocab([r[13 + t] for r in rows[:150]], 2, lambda v: int(v, 16)) for t in range(1, 27)}
    assert {f.name: f.num_embeddings for f in schema.sparse} == {f"C{t}": len(vocabs[t]) + 1 for t in range(1, 27)}
    ids = lambda t, v: vocabs[t].get(v, len(vocabs[t]))  # noqa: E731
    train, valid = read_split(out, "train"), read_split(out, "valid")
    assert train == [expected_criteo(r, ids) for r in rows[:150]]
    assert valid == [expected_criteo(r, ids) for r in rows[150:]]
    # id 0 is the most frequent value; rare and unseen values share the last id
    assert collections.Counter(r["C1"] for r in train).most_common(1)[0][0] == 0
    oov = len(vocabs[3])
    assert sum(r["C3"] == oov for r in valid) > 10
    s = summary(out)
    assert s["ids"]["mode"] == "vocab" and s["tables"]["C3"]["oov_rows"]["valid"] == sum(r["C3"] == oov for r in valid)
    assert s["ids"]["rare_values"]["C3"] == sum(1 for c in collections.Counter(
        r[16] for r in rows[:150] if r[16]).values() if c < 2)


def _with_bad_lines(rows):
    lines = ["\t".join(r) for r in rows]
    bad = {
        11: "\t".join(rows[0][:39]),                                            # 39 fields
        31: "\t".join(rows[1][:14] + ["zz5d9164"] + rows[1][15:]),              # C1 not hex
        51: "\t".join(rows[2][:3] + ["1.5"] + rows[2][4:]),                     # I3 not an integer
        71: "\t".join(["2"] + rows[3][1:]),                                     # label 2
        91: "",                                                                 # blank line
    }
    for line_no in sorted(bad):
        lines.insert(line_no - 1, bad[line_no])
    return lines, bad


def test_criteo_bad_lines_are_dropped_counted_and_reported(tmp_path):
    rows = criteo_rows()
    lines, bad = _with_bad_lines(rows)
    src = write_lines(tmp_path / "day_0", lines)
    out = str(tmp_path / "ok")
    assert run("criteo", "--input", src, "--out", out, "--hash-buckets", 997, "--max-bad-fraction", 0.05) == 0
    train, valid = read_split(out, "train"), read_split(out, "valid")
    assert_rows_split_in_order(rows, train, valid, lambda t, v: int(v, 16) % 997)
    b = summary(out)["bad_lines"]
    assert b["by_kind"] == {"wrong_field_count": 2, "categorical": 1, "dense": 1, "label": 1}
    assert abs(b["fraction"] - 5 / 205) < 1e-12
    assert {(e["line"], e["kind"]) for e in b["examples"]} == {
        (11, "wrong_field_count"), (91, "wrong_field_count"), (31, "categorical"), (51, "dense"), (71, "label")}
    assert any("C1 is not hexadecimal" == e["why"] for e in b["examples"])


def test_criteo_too_many_bad_lines_fail_and_leave_nothing(tmp_path, capsys):
    lines, _ = _with_bad_lines(criteo_rows())
    src = write_lines(tmp_path / "day_0", lines)
    out = tmp_path / "data" / "criteo"
    assert run("criteo", "--input", src, "--out", out, "--hash-buckets", 997) == 2
    err = capsys.readouterr().err
    assert "5 of 205 lines" in err and "--max-bad-fraction 0.01" in err and "day_0 line 11" in err
    assert not out.exists() and os.listdir(out.parent) == []  # no staging folder left either


def test_refuses_to_overwrite_unless_asked(tmp_path, capsys):
    src = write_tsv(tmp_path / "train.txt", criteo_rows())
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert run("criteo", "--input", src, "--out", out, "--hash-buckets", 10) == 2
    assert "--overwrite" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"
    assert run("criteo", "--input", src, "--out", out, "--hash-buckets", 10, "--overwrite") == 0
    assert not (out / "keep.txt").exists() and load_checked(str(out)).sparse[0].num_embeddings == 10
    assert sorted(os.listdir(tmp_path)) == ["out", "train.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run("criteo", "--input", src, "--out", empty, "--hash-buckets", 10) == 0  # an empty folder is fine


def test_criteo_valid_days_pick_day_files_and_read_gzip(tmp_path, capsys):
    rows = criteo_rows()
    days = [write_tsv(tmp_path / "day_0", rows[:80]), write_tsv(tmp_path / "day_1.gz", rows[80:150], compress=True),
            write_tsv(tmp_path / "day_23.gz", rows[150:], compress=True)]
    out = str(tmp_path / "tb")
    assert run("criteo", "--input", *days, "--out", out, "--hash-buckets", 50, "--valid-days", 23) == 0
    ids = lambda t, v: int(v, 16) % 50  # noqa: E731
    assert read_split(out, "train") == [expected_criteo(r, ids) for r in rows[:150]]
    assert read_split(out, "valid") == [expected_criteo(r, ids) for r in rows[150:]]
    assert run("criteo", "--input", *days[:2], "--out", str(tmp_path / "x"), "--hash-buckets", 50,
               "--valid-days", 23) == 2
    assert "none of the inputs" in capsys.readouterr().err and not (tmp_path / "x").exists()


@pytest.mark.parametrize("argv,message", [
    (["criteo", "--input", FIXTURE, "--hash-buckets", "5"], "does not look like Criteo data"),  # the CSV sample as is
    (["criteo", "--input", "MISSING", "--hash-buckets", "5"], "do not exist"),
    (["criteo", "--input", "SRC"], "--hash-buckets N"),  # no way to make ids chosen
    (["movielens", "--input", "SRC", "--hash-buckets", "5"], "drop --hash-buckets"),
    (["criteo", "--input", "SRC", "--hash-buckets", "5", "--valid-fraction", "1.5"], "must lie in (0, 1)"),
    (["criteo", "--input", "ftp://host/day_0", "--hash-buckets", "5"], "which rayemb cannot open"),
])
def test_user_errors_before_any_work(tmp_path, capsys, argv, message):
    src = write_tsv(tmp_path / "train.txt", criteo_rows()[:5])
    argv = [a.replace("SRC", src).replace("MISSING", str(tmp_path / "nope")) for a in argv]
    assert run(*argv, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "out").exists() and sorted(os.listdir(tmp_path)) == ["train.txt"]


def test_hex_and_string_keys_match_python():
    from rayemb.convert.common import hex_keys, string_keys

    values = ["05db9164", "0", "ffffffffffffffff", "FfA", "", "7"]
    assert hex_keys(pa.array(values).slice(0)).tolist() == [int(v, 16) if v else 0 for v in values]
    assert hex_keys(pa.array(values).slice(2, 3)).tolist() == [2**64 - 1, 0xFFA, 0]
    words = ["1fbe01fe", "", "a", "15706", "é€"]
    assert string_keys(pa.array(words)).tolist() == [fnv1a64(w) for w in words]


def test_frequency_counter_merges_exactly(monkeypatch):
    from rayemb.convert import vocab as v

    monkeypatch.setattr(v, "_MERGE_MIN", 8)  # merge often
    rng = np.random.default_rng(0)
    c, ref = v.FrequencyCounter(), collections.Counter()
    for _ in range(40):
        keys = rng.zipf(1.5, size=50).astype(np.uint64) % np.uint64(300)
        c.add(keys)
        ref.update(keys.tolist())
    keys, counts = c.result()
    assert dict(zip(keys.tolist(), counts.tolist())) == dict(ref)
    voc = v.Vocabulary.from_counter(c, min_count=3)
    ranked = sorted((k for k, n in ref.items() if n >= 3), key=lambda k: (-ref[k], k))
    assert voc.encode(np.array(ranked + [10**6], np.uint64)).tolist() == list(range(len(ranked))) + [len(ranked)]


def test_line_numbers_survive_unreadable_lines_and_small_blocks(tmp_path):
    from rayemb.convert.common import LineReader

    path = tmp_path / "t.txt"
    path.write_bytes(b"".join(b"line %d\n" % i if i != 700 else b"bad\x01line\n" for i in range(1, 2001)))
    reader = LineReader(str(path), block_size=4096)
    got = [(ln, int(n)) for lines, nums, _ in reader for ln, n in zip(lines.to_pylist(), nums)]
    assert len(got) == 1999 and all(ln == f"line {n}" for ln, n in got)
    assert reader.skipped == [(700, "bad\x01line")]


# ---- Avazu ---- #

AVAZU_HEADER = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,"
                "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21")


def avazu_lines(n, seed=0):
    rng = np.random.default_rng(seed)
    cols = AVAZU_HEADER.split(",")
    out = [AVAZU_HEADER]
    for i in range(n):
        day, hour = 21 + i % 10, int(rng.integers(0, 24))
        values = {c: f"{int(rng.integers(0, 6)):08x}" for c in cols[3:]}
        values.update(id=str(10**18 + i), click=str(int(rng.random() < 0.3)), hour=f"1410{day:02d}{hour:02d}",
                      C14=str(15700 + int(rng.integers(0, 4))))
        if i % 7 == 0:
            values["device_id"] = ""
        out.append(",".join(values[c] for c in cols))
    return out


def test_avazu_labels_hours_hash_ids_and_valid_days(tmp_path):
    lines = avazu_lines(120)
    feb31 = lines[5].split(",")
    feb31[2] = "14023100"  # no such day: strptime alone would read it as March 3rd
    lines.insert(5, ",".join(feb31))
    lines.insert(9, "1,0,14102100")  # too few fields
    src = write_lines(tmp_path / "train.csv", lines)
    out = str(tmp_path / "avazu")
    assert run("avazu", "--input", src, "--out", out, "--hash-buckets", 1000, "--valid-days", 30,
               "--max-bad-fraction", 0.05) == 0
    schema = load_checked(out)
    cols = AVAZU_HEADER.split(",")
    tables = {f.name: f.num_embeddings for f in schema.sparse}
    assert list(tables) == cols[3:] + ["hour_of_day", "day_of_week"] and "id" not in tables
    assert tables["hour_of_day"] == 24 and tables["day_of_week"] == 7 and tables["C14"] == 1000
    assert list(schema.dense) == ["hour_of_day_num"]
    good = [dict(zip(cols, ln.split(","))) for ln in lines[1:] if ln.count(",") == 23]
    good = [g for g in good if g["hour"] != "14023100"]
    train, valid = read_split(out, "train"), read_split(out, "valid")
    assert len(valid) == sum(g["hour"][4:6] == "30" for g in good) == 12 and len(train) == 108
    expect_t = [g for g in good if g["hour"][4:6] != "30"]
    for g, r in zip(expect_t, train):
        when = datetime.datetime.strptime(g["hour"], "%y%m%d%H")
        assert r["label"] == float(g["click"]) and r["hour_of_day"] == when.hour == r["hour_of_day_num"]
        assert r["day_of_week"] == when.weekday()
        assert r["site_id"] == fnv1a64(g["site_id"]) % 1000 and r["C14"] == fnv1a64(g["C14"]) % 1000
        assert r["device_id"] == (fnv1a64(g["device_id"]) % 1000 if g["device_id"] else None)
    assert summary(out)["bad_lines"]["by_kind"] == {"hour": 1, "wrong_field_count": 1}


def test_avazu_vocabulary_and_header_checks(tmp_path, capsys):
    lines = avazu_lines(200, seed=1)
    src = write_lines(tmp_path / "train.csv", lines)
    out = str(tmp_path / "voc")
    assert run("avazu", "--input", src, "--out", out, "--vocab-from-train", "--valid-fraction", 0.2) == 0
    train, valid = read_split(out, "train"), read_split(out, "valid")
    assert len(train) + len(valid) == 200 and 20 <= len(valid) <= 60
    # the train rows' 4 distinct C14 values get ids 0..3 by descending count (ties by their FNV key); OOV is 4
    rows = [dict(zip(AVAZU_HEADER.split(","), ln.split(","))) for ln in lines[1:]]
    assert len({r["C14"] for r in rows}) == 4 and load_checked(out).feature("C14").num_embeddings == 5
    train_c14 = collections.Counter(r["C14"] for r in train)
    assert sorted(train_c14) == [0, 1, 2, 3]
    assert [train_c14[i] for i in range(4)] == sorted(train_c14.values(), reverse=True)
    test_file = write_lines(tmp_path / "test.csv", [AVAZU_HEADER.replace("click,", "")])
    assert run("avazu", "--input", test_file, "--out", tmp_path / "t", "--hash-buckets", 10) == 2
    assert "has no click column" in capsys.readouterr().err


# ---- MovieLens ---- #

# (user, item, rating, timestamp) in file order: user 7 rates 5 items out of time order, user 3 rates 2, user 9 one
RATINGS = [(7, 50, 5, 300), (7, 10, 3, 100), (3, 10, 4, 50), (7, 20, 4, 200), (9, 30, 2, 10), (7, 40, 1, 500),
           (3, 20, 5, 60), (7, 30, 4, 400)]


def write_movielens(tmp_path, layout):
    if layout == "u.data":
        return write_lines(tmp_path / "u.data", ["\t".join(map(str, r)) for r in RATINGS])
    if layout == "ratings.dat":
        return write_lines(tmp_path / "ratings.dat", ["::".join(map(str, r)) for r in RATINGS] + ["x::1::2::3"])
    return write_lines(tmp_path / "ratings.csv", ["userId,movieId,rating,timestamp"] +
                       [f"{u},{m},{float(r)},{t}" for u, m, r, t in RATINGS])


@pytest.mark.parametrize("layout", ["u.data", "ratings.dat", "ratings.csv"])
def test_movielens_labels_ids_history_and_leave_last_out(tmp_path, layout):
    src = write_movielens(tmp_path, layout)
    out = str(tmp_path / "ml")
    assert run("movielens", "--input", src, "--out", out, "--history-length", 3, "--max-bad-fraction", 0.2) == 0
    schema = load_checked(out)
    by_time = sorted(RATINGS, key=lambda r: (r[0], r[3]))
    last = {u: max(r[3] for r in RATINGS if r[0] == u) for u in (7, 3)}
    train_src = [r for r in by_time if last.get(r[0]) != r[3]]
    items = vocab([r[1] for r in train_src], 1, int)  # 10 and 30 twice (tie -> smaller id first), 20 and 50 once
    users = vocab([r[0] for r in train_src], 1, int)
    assert items == {10: 0, 30: 1, 20: 2, 50: 3} and users == {7: 0, 3: 1, 9: 2}
    assert {f.name: (f.num_embeddings, f.multi_hot) for f in schema.sparse} == {
        "user": (4, False), "item": (5, False), "history": (5, True)}
    train, valid = read_split(out, "train"), read_split(out, "valid")
    assert len(train) == 6 and len(valid) == 2  # users 7 and 3 leave their last rating out; user 9 has one
    u7 = sorted((r for r in train if r["user"] == 0), key=lambda r: r["history_length"])
    # user 7 in time order: items 10, 20, 50, 30 | 40 (valid, unseen in train -> OOV id 4)
    assert [r["item"] for r in u7] == [0, 2, 3, 1]
    assert [r["history"] for r in u7] == [[], [0], [0, 2], [0, 2, 3]]  # the 3rd rating: exactly its 2 previous items
    assert [r["label"] for r in u7] == [0.0, 1.0, 1.0, 1.0] and [r["history_length"] for r in u7] == [0, 1, 2, 3]
    v7 = next(r for r in valid if r["user"] == 0)
    assert v7 == {"label": 0.0, "history_length": 3.0, "user": 0, "item": 4, "history": [2, 3, 1]}
    v3 = next(r for r in valid if r["user"] == 1)
    assert v3["item"] == 2 and v3["history"] == [0] and v3["label"] == 1.0
    s = summary(out)
    assert s["layouts"] == {src: layout} and s["users"] == 3 and s["items"] == 5
    assert s["bad_lines"]["by_kind"] == ({"id": 1} if layout == "ratings.dat" else {})


def test_movielens_history_as_a_sequence_feature(tmp_path):
    """--history-as-sequence: the same lists, declared for a user-history tower (max_length, target item)."""
    from rayemb.data.batching import BatchConverter

    src = write_movielens(tmp_path, "u.data")
    out = str(tmp_path / "ml")
    assert run("movielens", "--input", src, "--out", out, "--history-length", 3, "--history-as-sequence") == 0
    schema = load_checked(out)
    assert schema.sparse_names == ["user", "item"] and schema.sequence_names == ["history"]
    h = schema.sequence[0]
    assert (h.num_embeddings, h.max_length, h.target) == (5, 3, "item")
    plain = str(tmp_path / "ml_plain")
    assert run("movielens", "--input", src, "--out", plain, "--history-length", 3) == 0
    key = lambda r: (r["user"], r["history_length"])  # noqa: E731
    assert sorted(read_split(out, "train"), key=key) == sorted(read_split(plain, "train"), key=key)
    # the batch path turns it into the sequence KJT the tower reads (valid: users 7 and 3, 3 and 1 items)
    import pyarrow.parquet as pq

    from rayemb.data.schema import parquet_files

    batch = BatchConverter(schema, "error", sequence=True)(pq.read_table(parquet_files(out, "valid")))
    assert batch.sequence.keys() == ["history"] and sorted(batch.sequence.lengths().tolist()) == [1, 3]
