"""The Ray engine's pieces that need no Ray: byte-level field checks, chunks of whole lines, the column-wise
Criteo parser, each against what the single-process converter does with the same bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from _convert_engines import sample_lines, write_text

from rayemb.convert.chunks import count_lines, line_lengths, plan_chunks, text_blocks
from rayemb.convert.common import BadLines, LineReader, hex_keys, matches
from rayemb.convert.criteo import CriteoFormat
from rayemb.convert.criteo_columns import parse_block
from rayemb.convert.fields import hex_values, integer_ok
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


# lines ending in \n, \r\n and a lone \r, blank ones, one longer than the chunks, no newline at the end
_TEXT = b"a\tb\nc\r\n\r\nd\re\n\n" + b"x" * 5000 + b"\nlast\tline\r\nf\n\n\ng\th"


def test_chunks_hold_whole_lines_once_and_count_them_as_the_line_reader(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(_TEXT * 40)
    numbers = [int(n) for _, nums, _ in LineReader(str(path)) for n in nums]
    total = numbers[-1]
    for chunk_bytes in (4096, 7000, 10**6):
        chunks = plan_chunks([(str(path), "rows")], chunk_bytes)
        assert (len(chunks) > 10) == (chunk_bytes < 10**6) and [c.index for c in chunks] == list(range(len(chunks)))
        assert chunks[0].start == 0 and chunks[-1].end in (None, len(_TEXT) * 40)
        texts = [b"".join(bytes(b) for b in text_blocks(c, block_size=4096)) for c in chunks]
        assert b"".join(texts) == _TEXT * 40
        for c, text in zip(chunks, texts):
            assert c.start == 0 or (_TEXT * 40)[c.start - 1:c.start] == b"\n"  # cut at a line start
            assert all(len(b) for b in text_blocks(c, block_size=4096))
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
