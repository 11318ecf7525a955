"""The Ray engine's pieces that need no Ray: byte-level field checks, chunks of whole lines, the column-wise
Criteo parser, the part files cut for tasks to write, each against what the single-process converter does with
the same bytes or rows."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _convert_engines import sample_lines, write_text

from rayemb.convert.chunks import chunk_lines, count_lines, line_lengths, plan_chunks, text_blocks
from rayemb.convert.common import BadLines, LineReader, hex_keys, matches
from rayemb.convert.criteo import CriteoFormat
from rayemb.convert.criteo_columns import parse_block
from rayemb.convert.fields import hex_values, integer_ok
from rayemb.convert.output import PartPlan, PartWriter, part_name, write_part
from rayemb.errors import DataError

_ALPHABET = list("0123456789abcdefABCDEF-+ gz\x01é")


def _random_values(n, seed=0):
    rng = np.random.default_rng(seed)
    values = ["".join(rng.choice(_ALPHABET, size=rng.integers(0, 21))) for _ in range(n)]
    return values + ["-", "-1", "--1", "1-", "0", "a", "", "123456789012345678", "1234567890123456789",
                     "-123456789012345678", "-1234567890123456789", "ffffffffffffffff", "fffffffffffffffff"]


@pytest.mark.parametrize("values", [
    _random_values(3000),
    ["0123abcd", "", "zzzzzzzz", "FFFFFFFF", "", "0000000g", "0\x01234567"] * 20,  # the width-8 path
    ["0123abcd", "", "1234567", "123456789"],  # one width, then not
    ["", "", ""],
    [],
])
def test_field_checks_accept_what_the_regexes_accept(values):
    col = pa.array(values, pa.string())
    for part in (col, col.slice(3), col.slice(1, max(0, len(col) - 2))):
        assert (integer_ok(part) == matches(part, r"^-?[0-9]{1,18}$")).all()
        keys, ok = hex_values(part)
        assert (ok == matches(part, r"^[0-9a-fA-F]{1,16}$")).all()
        assert keys[ok].tolist() == hex_keys(part.filter(pa.array(ok))).tolist()
        assert keys[ok].tolist() == [int(v, 16) for v, good in zip(part.to_pylist(), ok) if good]


def test_eight_digit_values_are_checked_byte_by_byte_as_the_regex_does():
    # every byte next to a range the check draws ('/' ':' '@' 'G' '`' 'g', DEL, NUL), in each of the 8 places
    rng = np.random.default_rng(1)
    alphabet = np.frombuffer(b"0123456789abcdefABCDEF/:@G`g\x7f\x00 -", dtype=np.uint8)
    values = [bytes(rng.choice(alphabet, size=8)).decode() for _ in range(3000)]
    values += ["0" * i + c + "0" * (7 - i) for i in range(8) for c in "/:@G`g\x7fF"] + ["ffffffff", "00000000", ""]
    col = pa.array(values, pa.string())
    keys, ok = hex_values(col)
    assert (ok == matches(col, r"^[0-9a-fA-F]{1,16}$")).all() and 100 < ok.sum() < len(values)
    assert keys.tolist() == [int(v, 16) if good else 0 for v, good in zip(values, ok)]


def test_part_plan_cuts_the_parts_the_part_writer_writes(tmp_path):
    schema = pa.schema([("x", pa.int64())])
    rng = np.random.default_rng(2)
    sizes = [int(n) for n in rng.integers(0, 40, size=30)] + [25, 0, 50]
    tables = [pa.table({"x": np.arange(sum(sizes[:i]), sum(sizes[:i + 1]))}) for i in range(len(sizes))]
    for rows_per_file in (1, 7, 25, 10_000):
        by_writer, by_plan = tmp_path / f"w{rows_per_file}", tmp_path / f"p{rows_per_file}"
        by_writer.mkdir(), by_plan.mkdir()
        writer = PartWriter(str(by_writer), schema, rows_per_file)
        plan, parts = PartPlan(rows_per_file), []
        for i, t in enumerate(tables):
            writer.write(t)
            parts += plan.add(i, t.num_rows)
        parts += plan.close()
        assert writer.close() == plan.rows == sum(sizes)
        assert [index for index, _ in parts] == list(range(len(parts)))
        for index, pieces in parts:
            written = write_part(str(by_plan / part_name(index)), schema,
                                 [tables[i].slice(start, stop - start) for i, start, stop in pieces])
            assert written == sum(stop - start for _, start, stop in pieces) and written <= rows_per_file
        assert sorted(os.listdir(by_writer)) == sorted(os.listdir(by_plan))
        for name in os.listdir(by_writer):
            assert pq.read_table(by_writer / name).equals(pq.read_table(by_plan / name)), (rows_per_file, name)


# lines ending in \n, \r\n and a lone \r, blank ones, one longer than the chunks, no newline at the end
_TEXT = b"a\tb\nc\r\n\r\nd\re\n\n" + b"x" * 5000 + b"\nlast\tline\r\nf\n\n\ng\th"


@pytest.mark.parametrize("text", [_TEXT * 40, _TEXT.replace(b"\r", b"") * 40], ids=["with-cr", "without-cr"])
def test_chunks_hold_whole_lines_once_and_count_them_as_the_line_reader(tmp_path, text):
    path = tmp_path / "t.txt"
    path.write_bytes(text)
    numbers = [int(n) for _, nums, _ in LineReader(str(path)) for n in nums]
    total = numbers[-1]
    for chunk_bytes in (4096, 7000, 10**6):
        chunks = plan_chunks([(str(path), "rows")], chunk_bytes)
        assert (len(chunks) > 10) == (chunk_bytes < 10**6) and [c.index for c in chunks] == list(range(len(chunks)))
        assert chunks[0].start == 0 and chunks[-1].end in (None, len(text))
        texts = [b"".join(bytes(b) for b in text_blocks(c, block_size=4096)) for c in chunks]
        assert b"".join(texts) == text
        for c, chunk_text in zip(chunks, texts):
            assert c.start == 0 or text[c.start - 1:c.start] == b"\n"  # cut at a line start
            assert all(len(b) for b in text_blocks(c, block_size=4096))
            assert chunk_lines(c, block_size=4096) == count_lines(chunk_text)
        assert sum(count_lines(t) for t in texts) == total


def test_line_lengths_and_gzip_inputs_are_one_chunk(tmp_path):
    assert line_lengths(b"ab\r\n\rcde\nf", np.array([1, 2, 3, 4])).tolist() == [2, 0, 3, 1]
    assert count_lines(b"ab\r\n\rcde\nf") == 4 and count_lines(b"") == 0 and count_lines(b"\n\n") == 2
    gz = write_text(tmp_path / "day_0.gz", ["x\ty"] * 5000, compress=True)
    (chunk,) = plan_chunks([(gz, "train")], 4096)
    assert chunk.whole_file and b"".join(text_blocks(chunk, 4096)) == b"x\ty\n" * 5000


def test_column_parser_equals_the_line_parser_on_good_and_bad_lines(tmp_path):
    rows = [line.split("\t") for line in sample_lines()]
    lines = list(sample_lines())
    bad = [(11, "\t".join(rows[0][:39])), (31, "\t".join(rows[1][:14] + ["zz5d9164"] + rows[1][15:])),
           (51, "\t".join(rows[2][:3] + ["1.5"] + rows[2][4:])), (71, "\t".join(["2"] + rows[3][1:])),
           (91, ""), (95, "\t" * 39), (96, "\t".join(rows[4][:3] + ["1\x012"] + rows[4][4:])), (97, "a\x01b"),
           (98, "\t".join(rows[5] + ["41st"])), (99, "\t".join(rows[6][:20] + ["123456789abcdef01"] + rows[6][21:]))]
    for n, text in bad:
        lines.insert(n - 1, text)
    data = ("\n".join(lines) + "\n").encode()

    path = tmp_path / "day_0"  # the single-process engine's reading and parsing of the same bytes
    path.write_bytes(data)
    reader, want_bad = LineReader(str(path)), BadLines()
    ((array, numbers, _),) = list(reader)
    want_bad.lines_read = len(array)
    want = CriteoFormat().parse(array, numbers, "p", want_bad)
    want_bad.add_skipped("p", reader.skipped)

    cut = data.index(b"\n", len(data) // 2) + 1  # two buffers: numbering goes on across them
    got_bad = BadLines()
    first = parse_block(data[:cut], 1, "p", got_bad)
    second = parse_block(memoryview(data)[cut:], 1 + count_lines(data[:cut]), "p", got_bad)
    assert got_bad.counts == want_bad.counts == {"wrong_field_count": 3, "categorical": 2, "dense": 1, "label": 2,
                                                 "unreadable": 2}
    assert got_bad.lines_read == want_bad.lines_read == 210
    key = lambda e: (e["kind"], e["line"])  # noqa: E731
    assert sorted(got_bad.examples, key=key) == sorted(want_bad.examples, key=key)
    assert np.concatenate([first.numbers, second.numbers]).tolist() == want.numbers.tolist()
    assert np.concatenate([first.label, second.label]).tolist() == want.label.tolist()
    for name, col in want.dense.items():
        assert pa.concat_arrays([first.dense[name], second.dense[name]]).equals(col), name
    for name, (keys, empty) in want.keys.items():
        assert np.concatenate([first.keys[name][0], second.keys[name][0]])[~empty].tolist() == keys[~empty].tolist()
        assert np.concatenate([first.keys[name][1], second.keys[name][1]]).tolist() == empty.tolist()


def test_column_parser_reports_text_it_cannot_read():
    with pytest.raises(DataError, match="cannot be read as text"):
        parse_block(sample_lines()[0].encode() + b"\n1" + b"\t\xff\xfe" * 39 + b"\n", 1, "day_0", BadLines())
