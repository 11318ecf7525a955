"""Criteo-format text of any length, generated fast: for the converters' benchmarks and tests.

Lines look like Criteo's (40 tab-separated fields: a 0/1 label, 13 integer
counts, 26 categories of 8 hex digits, empty fields here and there, the odd
negative count) with heavy-tailed values per category column (a few values in
most rows, a long tail), so the vocabulary, the hashing and the checks see what
they would see on the real logs. Lines are built column-wise with pyarrow, a
million in seconds; the same ``seed`` writes the same bytes.

Example::

    >>> write_criteo("/tmp/day_0.gz", lines=1_000_000, seed=0)   # .gz / .bz2 compressed by extension
    '/tmp/day_0.gz'
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayemb.convert.criteo import NUM_CATEGORICAL, NUM_DENSE

#: distinct values of each category column: from a handful to a long tail
_CARDINALITIES = [4, 10, 30, 100, 300, 1_000, 3_000, 10_000, 30_000, 100_000] * 3
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_CHUNK_LINES = 100_000


def _hex8(values: np.ndarray) -> pa.Array:
    """Each uint32 written as 8 lower-case hex digits."""
    nibbles = (values[:, None] >> np.arange(28, -1, -4, dtype=np.uint64)) & np.uint64(15)
    text = _HEX_DIGITS[nibbles.astype(np.intp)]
    return pa.array(np.ascontiguousarray(text).view("S8").ravel(), pa.binary()).cast(pa.string())


def _blank(col: pa.Array, empty: np.ndarray) -> pa.Array:
    return pc.if_else(pa.array(empty), pa.scalar("", pa.string()), col)


def criteo_lines(n: int, seed: int = 0, start: int = 0) -> pa.Array:
    """``n`` Criteo lines (a string array, no newlines), the ``start``-th onwards of the stream of ``seed``."""
    rng = np.random.default_rng([seed, start])
    cols = [pc.cast(pa.array((rng.random(n) < 0.25).astype(np.int8)), pa.string())]
    for j in range(NUM_DENSE):
        counts = np.floor(rng.pareto(1.2, n) * (3 + 5 * j)).astype(np.int64)
        counts[rng.random(n) < 0.01] = -1  # Criteo has a few negative counts (I2)
        cols.append(_blank(pc.cast(pa.array(counts), pa.string()), rng.random(n) < 0.05 + 0.03 * j))
    for j in range(NUM_CATEGORICAL):
        card = _CARDINALITIES[j % len(_CARDINALITIES)]
        rank = np.minimum(rng.zipf(1.3, n) - 1, card - 1).astype(np.uint64)
        # the rank scrambled into 32 bits (an odd multiplier and a per-column offset): values look like Criteo's
        values = (rank * np.uint64(2654435761) + np.uint64(j * 0x9E3779B1)) & np.uint64(0xFFFFFFFF)
        cols.append(_blank(_hex8(values), rng.random(n) < (0.4 if j % 7 == 5 else 0.02)))
    return pc.binary_join_element_wise(*cols, "\t")


def _concatenated(text: pa.Array) -> pa.Buffer:
    """The bytes of all the values of a string array, one after the other."""
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32)[text.offset: text.offset + len(text) + 1]
    return text.buffers()[2][int(offsets[0]): int(offsets[-1])]


def write_criteo(path: str, lines: int, seed: int = 0, bad_every: Optional[int] = None) -> str:
    """Writes ``lines`` lines to ``path`` (``.gz``/``.bz2`` compressed); with ``bad_every`` k, every k-th line
    (k, 2k, ...) has 39 fields instead of 40, a malformed line the converters must drop and count."""
    codec = "gzip" if path.endswith(".gz") else "bz2" if path.endswith(".bz2") else None
    with pa.output_stream(path, compression=codec) as out:
        for start in range(0, lines, _CHUNK_LINES):
            n = min(_CHUNK_LINES, lines - start)
            text = criteo_lines(n, seed, start)
            if bad_every:
                numbers = np.arange(start + 1, start + n + 1)
                cut = pc.replace_substring_regex(text, r"\t[^\t]*$", "")
                text = pc.if_else(pa.array(numbers % bad_every == 0), cut, text)
            out.write(_concatenated(pc.binary_join_element_wise(text, "", "\n")))
    return path
