"""Input files cut into chunks of whole lines that tasks on any node read on their own.

An uncompressed file is cut into byte ranges of about ``chunk_bytes``: each cut
moves forward to the next line start, found by reading a few bytes there (a
ranged GET on a bucket), so every line lies in exactly one chunk. A ``.gz`` /
``.bz2`` file cannot be entered in the middle and is one chunk, read as a
stream. Within a chunk, :func:`text_blocks` hands out buffers of whole lines of
about ``block_size`` bytes, the bound on a task's memory.

Line numbers are those of the single-process reader (pyarrow's CSV rules:
``\\n``, ``\\r\\n`` and a lone ``\\r`` each end a line); :func:`count_lines`
counts them in a buffer and :func:`chunk_lines` in a chunk, so a chunk's first
line number is the sum of the counts of the chunks before it in its file.

Example::

    >>> chunks = plan_chunks([("day_0", "rows"), ("day_1.gz", "rows")], chunk_bytes=256 << 20)
    >>> for buf in text_blocks(chunks[0], block_size=16 << 20):
    ...     count_lines(buf)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from rayemb import storage
from rayemb.convert.common import _CODECS, not_text, open_input

_NL, _CR = 10, 13
#: bytes read at a time while looking for the next line start after a cut
_PROBE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Chunk:
    """Bytes ``[start, end)`` of input ``file_index`` (``end`` None: the whole file, read as a stream)."""

    index: int
    file_index: int
    path: str
    role: str
    start: int = 0
    end: Optional[int] = None
    #: the physical number of the chunk's first line in its file (known once the chunks before it are counted)
    first_line: int = 1

    @property
    def whole_file(self) -> bool:
        return self.end is None


def is_compressed(path: str) -> bool:
    return any(path.endswith(ext) for ext in _CODECS)


def _open_random(path: str) -> Any:
    if storage.is_remote(path):
        fs, p = storage.filesystem(path)
        return fs.open_input_file(p)
    return pa.OSFile(path, "rb")


def _line_start_at_or_after(f: Any, pos: int, size: int) -> int:
    """The first offset >= ``pos`` where a line starts (just after a ``\\n``), or ``size``."""
    if pos <= 0:
        return 0
    f.seek(pos - 1)
    offset = pos - 1
    while offset < size:
        piece = f.read(_PROBE_BYTES)
        if not piece:
            break
        hit = piece.find(b"\n")
        if hit >= 0:
            return offset + hit + 1
        offset += len(piece)
    return size


def plan_chunks(inputs: Sequence[Tuple[str, str]], chunk_bytes: int) -> List[Chunk]:
    """Chunks of every ``(path, role)`` input, in input order, then byte order."""
    chunks: List[Chunk] = []
    for file_index, (path, role) in enumerate(inputs):
        size = storage.size_and_mtime_ns(path)[0]
        pieces = 1 if is_compressed(path) else max(1, math.ceil(size / chunk_bytes))
        if pieces == 1:
            chunks.append(Chunk(len(chunks), file_index, path, role))
            continue
        try:
            with _open_random(path) as f:
                cuts = [0] + [_line_start_at_or_after(f, k * size // pieces, size) for k in range(1, pieces)] + [size]
        except (pa.ArrowInvalid, OSError) as e:
            raise not_text(path, e) from None
        for a, b in zip(cuts, cuts[1:]):
            if b > a:  # a cut that moved past the next one (a line longer than a chunk) leaves nothing between
                chunks.append(Chunk(len(chunks), file_index, path, role, a, b))
    return chunks


def _stream_lines(f: Any, block_size: int) -> Iterator[bytes]:
    """A stream's text regrouped so that every buffer ends at a ``\\n`` (the last one at the end of the stream)."""
    rest = b""
    while True:
        piece = f.read(block_size)
        if not piece:
            break
        cut = piece.rfind(b"\n")
        if cut < 0:
            rest += piece
            continue
        yield rest + piece[: cut + 1]
        rest = piece[cut + 1:]
    if rest:
        yield rest


def _range_lines(f: Any, start: int, end: int, block_size: int) -> Iterator[memoryview]:
    """Bytes ``[start, end)`` of a seekable file (whole lines) in buffers that end at a ``\\n``: each read starts
    where the previous buffer's last line ended, so no text is copied twice."""
    pos = start
    while pos < end:
        f.seek(pos)
        piece = f.read(min(block_size, end - pos))
        if not piece:
            return
        cut = len(piece) - 1 if pos + len(piece) >= end else piece.rfind(b"\n")
        while cut < 0:  # a line longer than the block: read on to its end
            more = f.read(min(block_size, end - pos - len(piece)))
            if not more:
                cut = len(piece) - 1
                break
            piece += more
            cut = len(piece) - 1 if pos + len(piece) >= end else piece.rfind(b"\n")
        yield memoryview(piece)[: cut + 1]
        pos += cut + 1


def text_blocks(chunk: Chunk, block_size: int) -> Iterator[Any]:
    """Buffers (bytes-like) of whole lines of ``chunk``, about ``block_size`` bytes each (a longer line makes a
    longer one)."""
    try:
        if chunk.whole_file:
            with open_input(chunk.path) as f:
                yield from _stream_lines(f, block_size)
            return
        with _open_random(chunk.path) as f:
            yield from _range_lines(f, chunk.start, chunk.end, block_size)
    except (pa.ArrowInvalid, OSError) as e:
        raise not_text(chunk.path, e) from None


def _terminators(buf: bytes) -> Tuple[np.ndarray, np.ndarray]:
    """(first byte, last byte) of every line terminator in ``buf``: ``\\n``, ``\\r\\n`` or a lone ``\\r``."""
    a = np.frombuffer(buf, dtype=np.uint8)
    nl = np.flatnonzero(a == _NL)
    cr = np.flatnonzero(a == _CR)
    lone_cr = cr[(cr + 1 >= a.size) | (a[np.minimum(cr + 1, a.size - 1)] != _NL)]
    ends = np.sort(np.concatenate([nl, lone_cr]))
    first = ends - ((a[ends] == _NL) & (ends > 0) & (a[np.maximum(ends - 1, 0)] == _CR))
    return first, ends


def count_lines(buf: bytes) -> int:
    """Physical lines in ``buf`` as pyarrow's CSV reader counts them (a last line without terminator included)."""
    if not len(buf):
        return 0
    data = buf if isinstance(buf, bytes) else bytes(buf)
    if b"\r" not in data:  # the usual text: every line ends in \n (one pass, no temporary arrays)
        return data.count(b"\n") + int(data[-1] != _NL)
    a = np.frombuffer(data, dtype=np.uint8)
    lone_cr = int(np.count_nonzero((a[:-1] == _CR) & (a[1:] != _NL))) + int(a[-1] == _CR)
    return int(np.count_nonzero(a == _NL)) + lone_cr + int(a[-1] not in (_NL, _CR))


def chunk_lines(chunk: Chunk, block_size: int) -> int:
    """The physical lines of ``chunk``, as :func:`count_lines` counts them in its :func:`text_blocks`. A byte
    range is read into one buffer, used again and again, and its ``\\n`` counted where they lie: only a ``\\r``
    needs whole lines (text holding one is counted block by block)."""
    if chunk.whole_file:
        return sum(count_lines(buf) for buf in text_blocks(chunk, block_size))
    buf = bytearray(max(1, min(block_size, chunk.end - chunk.start)))
    lines, last, pos = 0, _NL, chunk.start
    try:
        with _open_random(chunk.path) as f:
            f.seek(pos)
            while pos < chunk.end:
                n = f.readinto(memoryview(buf)[: min(len(buf), chunk.end - pos)])
                if not n:
                    break
                if buf.find(b"\r", 0, n) >= 0:
                    return sum(count_lines(b) for b in text_blocks(chunk, block_size))
                lines += buf.count(b"\n", 0, n)
                last, pos = buf[n - 1], pos + n
    except (pa.ArrowInvalid, OSError) as e:
        raise not_text(chunk.path, e) from None
    return lines + int(last != _NL)


def line_lengths(buf: bytes, numbers: np.ndarray) -> np.ndarray:
    """Byte length (terminator excluded) of each of the 1-based physical lines ``numbers`` of ``buf``."""
    first, ends = _terminators(buf)
    starts = np.concatenate([[0], ends + 1])
    stops = np.concatenate([first, [len(buf)]])
    idx = np.asarray(numbers, dtype=np.int64) - 1
    return stops[idx] - starts[idx]
