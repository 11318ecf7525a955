"""Checks and conversions of whole string columns at the byte level: no regex, no Python loop over values.

The Ray engine parses Criteo's 39 checked columns per block; a regex pass per
column and a byte-position loop per hex value cost more than the CSV parse
itself. Here each check is a handful of numpy passes over the column's bytes:
one lookup per byte, one cumulative sum, one difference per value; a column of
8-digit values (Criteo's categories) is checked and converted as one 64-bit
word per value, with bit arithmetic that tests and packs its 8 bytes at once.
They accept exactly what the single-process converter's regexes accept
(``^-?[0-9]{1,18}$`` for integers, ``^[0-9a-fA-F]{1,16}$`` for hex), so both
engines drop the same lines, and :func:`hex_values` gives the keys
:func:`~rayemb.convert.common.hex_keys` gives.

Example::

    >>> keys, ok = hex_values(pa.array(["05db9164", "", "zz"]))
    >>> keys.tolist(), ok.tolist()
    ([98275684, 0, 0], [True, False, False])
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import pyarrow as pa

from rayemb.convert.common import _bytes_view

_NOT_HEX = np.uint8(255)
#: the value of each hex digit byte, 255 for any other byte
_HEX_VALUE = np.full(256, _NOT_HEX, dtype=np.uint8)
for _i, _c in enumerate("0123456789abcdef"):
    _HEX_VALUE[ord(_c)] = _HEX_VALUE[ord(_c.upper())] = _i
_MINUS = ord("-")
_ONES = np.uint64(0x0101010101010101)
_HIGH = np.uint64(0x8080808080808080)


def _per_value_sums(flags: np.ndarray, rel_start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """How many set ``flags`` (one per byte) fall in each value's bytes."""
    cum = np.zeros(flags.size + 1, dtype=np.int64)
    np.cumsum(flags, out=cum[1:])
    return cum[rel_start + length] - cum[rel_start]


def _region(col: pa.Array) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the bytes the values span, each value's start within them, its length)."""
    data, start, length = _bytes_view(col)
    if not len(length):
        return np.zeros(0, np.uint8), start, length
    lo, hi = int(start[0]), int(start[-1] + length[-1])
    return data[lo:hi], start - lo, length


def integer_ok(col: pa.Array) -> np.ndarray:
    """Whether each value is an optional ``-`` and 1 to 18 decimal digits (what int64 parses without overflow)."""
    data, rel, length = _region(col)
    non_digit = (data - np.uint8(48)) > np.uint8(9)  # bytes below '0' wrap around to large values
    bad = _per_value_sums(non_digit, rel, length)
    first = data[np.minimum(rel, max(data.size - 1, 0))] if data.size else np.zeros(len(length), np.uint8)
    negative = (length > 0) & (first == _MINUS)
    return np.where(negative, (bad == 1) & (length >= 2) & (length <= 19), (bad == 0) & (length >= 1) & (length <= 18))


def _pack_digits(digits: np.ndarray) -> np.ndarray:
    """Rows of hex digit values (at most 16 per row) -> one uint64 per row: paired into bytes, read big-endian."""
    if digits.shape[1] % 2:
        digits = np.hstack([np.zeros((len(digits), 1), np.uint8), digits])
    packed = np.zeros((len(digits), 8), dtype=np.uint8)
    packed[:, 8 - digits.shape[1] // 2:] = (digits[:, 0::2] << np.uint8(4)) | digits[:, 1::2]
    return packed.view(">u8").ravel()


def _in_range(words: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The top bit of each byte of ``words`` set where ``lo <= byte < hi`` (for bytes below 0x80, where adding
    ``0x80 - c`` sets the top bit exactly when the byte is >= c and carries into no other byte)."""
    at_least_lo = words + np.uint64((0x80 - lo) * 0x0101010101010101)
    at_least_lo ^= words + np.uint64((0x80 - hi) * 0x0101010101010101)
    at_least_lo &= _HIGH
    return at_least_lo


def _hex8(words: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(value, ok)`` of values of exactly 8 bytes, each read as one little-endian uint64 (its first digit in the
    low byte): a few passes of bit arithmetic over whole words instead of a lookup per byte."""
    digits = _in_range(words, 0x30, 0x3A)
    # 'A'-'F' -> 'a'-'f'; no other byte lands in 'a'-'f'
    digits |= _in_range(words | np.uint64(0x2020202020202020), 0x61, 0x67)
    ok = (digits == _HIGH) & ((words & _HIGH) == 0)
    # each byte's digit value: its low nibble, plus 9 for a letter (bit 6 set)
    v = (words >> np.uint64(6)) & _ONES
    v *= np.uint64(9)
    v += words & np.uint64(0x0F0F0F0F0F0F0F0F)
    # pairs of digits into bytes, bytes into 16-bit halves, halves into the value (first digit most significant)
    v = (v << np.uint64(4)) | (v >> np.uint64(8))
    v &= np.uint64(0x00FF00FF00FF00FF)
    v = (v << np.uint64(8)) | (v >> np.uint64(16))
    v &= np.uint64(0x0000FFFF0000FFFF)
    v = (v << np.uint64(16)) | (v >> np.uint64(32))
    v &= np.uint64(0xFFFFFFFF)
    v[~ok] = 0
    return v, ok


def hex_values(col: pa.Array) -> Tuple[np.ndarray, np.ndarray]:
    """``(int(value, 16) as uint64, ok)`` per value; ok: 1 to 16 hex digits. Keys of values that are not ok
    are 0."""
    data, rel, length = _region(col)
    width = int(length.max()) if len(length) else 0
    if 1 <= width <= 16 and ((length == width) | (length == 0)).all():
        # every value that is not empty has the same width (Criteo: 8 digits): the bytes are a matrix as they are
        if width == 8:
            good_keys, good = _hex8(data.view("<u8"))
        else:
            digits = _HEX_VALUE[data].reshape(-1, width)
            good = ~(digits == _NOT_HEX).any(axis=1)
            good_keys = np.where(good, _pack_digits(digits), np.uint64(0))
        if len(good) == len(length):  # no empty value
            return good_keys, good
        present = np.flatnonzero(length)
        keys, ok = np.zeros(len(length), dtype=np.uint64), np.zeros(len(length), dtype=bool)
        keys[present], ok[present] = good_keys, good
        return keys, ok
    digit = _HEX_VALUE[data]
    keys = np.zeros(len(length), dtype=np.uint64)
    ok = (_per_value_sums(digit == _NOT_HEX, rel, length) == 0) & (length >= 1) & (length <= 16)
    # values of one width at a time: their digits gathered into a (values x width) matrix
    for width in np.flatnonzero(np.bincount(length[ok], minlength=17)):
        rows = np.flatnonzero(ok & (length == width))
        keys[rows] = _pack_digits(digit[rel[rows][:, None] + np.arange(width)])
    return keys, ok
