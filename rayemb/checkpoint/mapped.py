"""A checkpoint's stored table rows, memory-mapped and read a round's rows at a time.

DCP's ``FileSystemReader`` reads every stored piece a load touches with
``torch.load``: the whole piece, in anonymous memory, before it copies the
rows asked for. A table's piece is a whole rank's canonical share of it, so a
load's host memory would follow the largest table, not the rounds of the
exchange. :func:`mapped_rows` reads the same files without that copy:

* each ``__<rank>_0.distcp`` holds the rank's items one after another, each a
  ``torch.save`` archive at the ``(offset, length)`` the ``.metadata`` records
  for it (``storage_data``; the metadata is read by
  :mod:`rayemb.checkpoint.safe_reader`, never unpickled freely);
* ``torch.save`` stores a tensor's bytes uncompressed as one zip record
  (``data/0``): its offset comes from the archive's own directory
  (``PyTorchFileReader``), its dtype, shape and strides from
  ``torch.load(..., map_location="meta", weights_only=True)``, which reads the
  archive's small pickle and no tensor data;
* the record is mapped (``np.memmap``, copy-on-write, read only) and rows are
  copied out by index when the exchange asks for them: the file's pages are
  page cache, which the kernel drops under pressure, and anonymous memory
  holds one round's rows.

Only the layout rayemb writes is read this way: row-sharded pieces of whole
rows (:func:`rayemb.checkpoint.store.save_logical`). Run
:func:`rayemb.checkpoint.reader.verify` first: a file's size and SHA-256 are
checked there, before anything is mapped.

Example::

    >>> md = SafeFileSystemReader(directory).metadata()
    >>> rows = mapped_rows(directory, md, "tables.t0.weight", lo=0, hi=500_000)
    >>> rows.rows_at(torch.tensor([3, 7]), col0=0, width=8).shape
    torch.Size([2, 8])
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import numpy as np
import torch
from torch.distributed.checkpoint.filesystem import _create_file_view
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

from rayemb.errors import DataError

#: bytes of whole stored rows one copy touches when a reduction needs whole rows (a window of a round)
WINDOW_BYTES = 16 * 2**20


@dataclass(frozen=True)
class _Piece:
    """Stored rows ``[r0, r1)`` of a tensor: ``data`` is their bytes, ``[r1-r0, row_bytes]`` uint8, memory-mapped."""

    r0: int
    r1: int
    data: torch.Tensor


class MappedRows:
    """Canonical rows ``[lo, hi)`` of one stored tensor, read from the memory-mapped pieces that hold them.

    A :class:`rayemb.checkpoint.exchange.CanonicalRows`: ``rows_at`` copies the
    rows asked for (and only their columns) out of the mapping, in the stored
    dtype. ``reduce`` turns whole rows ``[n, D]`` into one value a row ``[n]``
    (e.g. the mean, for row-wise state loaded from element-wise state): then
    rows are read :data:`WINDOW_BYTES` at a time.
    """

    def __init__(self, key: str, pieces: List[_Piece], lo: int, hi: int, dtype: torch.dtype, tail: List[int],
                 reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
        self.key, self.lo, self.hi, self.dtype, self.tail = key, lo, hi, dtype, list(tail)
        self._pieces = pieces
        self._reduce = reduce
        self._itemsize = torch.empty(0, dtype=dtype).element_size()

    def reduced(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "MappedRows":
        """The same rows, each ``[D]`` row read as ``fn(rows)`` (``[n, D] -> [n]``): row-wise from element-wise."""
        return MappedRows(self.key, self._pieces, self.lo, self.hi, self.dtype, self.tail, fn)

    def dim(self) -> int:
        return 1 if self._reduce is not None else 1 + len(self.tail)

    def rows_at(self, local: torch.Tensor, col0: int, width: int) -> torch.Tensor:
        if self._reduce is not None:
            full = self.tail[0]
            step = max(1, WINDOW_BYTES // max(full * self._itemsize, 1))
            out = torch.empty(local.numel(), dtype=self.dtype)
            for i in range(0, local.numel(), step):
                out[i:i + step] = self._reduce(self._take(local[i:i + step], 0, full).view(-1, full))
            return out
        if not self.tail:
            return self._take(local, 0, 1).view(-1)
        return self._take(local, col0, width).view(-1, width)

    def _take(self, local: torch.Tensor, col0: int, width: int) -> torch.Tensor:
        """Rows ``lo + local``, columns ``[col0, col0+width)``: a new ``[n, width]`` tensor of the stored dtype."""
        rows = local.to(torch.int64) + self.lo
        if rows.numel() and (int(rows.min()) < self.lo or int(rows.max()) >= self.hi):
            raise IndexError(f"{self.key}: rows asked for outside this rank's canonical rows [{self.lo}, {self.hi})")
        # bytes, not values: a piece's offset in its file need not be aligned for the dtype
        b0, b1 = col0 * self._itemsize, (col0 + width) * self._itemsize
        if len(self._pieces) == 1:
            piece = self._pieces[0]
            return piece.data[rows - piece.r0, b0:b1].view(self.dtype)
        out = torch.empty(rows.numel(), b1 - b0, dtype=torch.uint8)
        for piece in self._pieces:
            inside = (rows >= piece.r0) & (rows < piece.r1)
            if bool(inside.any()):
                out[inside] = piece.data[rows[inside] - piece.r0, b0:b1]
        return out.view(self.dtype)


def _refusal(directory: str, key: str, why: str) -> DataError:
    return DataError(f"Checkpoint {directory!r}: {key} {why}; it was not written by rayemb's logical checkpoints "
                     "(whole rows, sharded by row). Use a checkpoint_* directory a rayemb job wrote, or start "
                     "fresh without --resume-from / train.resume_from.", category="bad_checkpoint")


def _map_item(directory: str, key: str, path: str, offset: int, length: int, dtype: torch.dtype,
              sizes: List[int]) -> torch.Tensor:
    """The tensor bytes of the ``torch.save`` archive at ``(offset, length)`` of ``path``, mapped ``[rows, bytes]``."""
    with open(path, "rb") as f:
        archive = torch._C.PyTorchFileReader(_create_file_view(f, offset, length))
        records = [r for r in archive.get_all_records() if r.startswith("data/")]
        if len(records) != 1:
            raise _refusal(directory, key, f"is stored as {len(records)} tensor records, not one")
        if archive.has_record("byteorder") and archive.get_record("byteorder").decode() != sys.byteorder:
            raise _refusal(directory, key, f"is stored {archive.get_record('byteorder').decode()}-endian, this host "
                                           f"is {sys.byteorder}-endian")
        start, nbytes = archive.get_record_offset(records[0]), archive.get_record_size(records[0])
        stored = torch.load(_create_file_view(f, offset, length), map_location="meta", weights_only=True)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if not isinstance(stored, torch.Tensor) or stored.dtype != dtype or list(stored.shape) != list(sizes):
        raise _refusal(directory, key, f"is stored as {getattr(stored, 'dtype', type(stored).__name__)} "
                                       f"{list(getattr(stored, 'shape', []))}, the metadata says {dtype} {sizes}")
    first = stored.storage_offset() * itemsize
    if not stored.is_contiguous() or first + stored.numel() * itemsize > nbytes or start + nbytes > length:
        raise _refusal(directory, key, "is not stored as contiguous rows inside its item")
    rows = int(sizes[0])
    row_bytes = stored.numel() * itemsize // rows if rows else 0
    if rows == 0 or row_bytes == 0:
        return torch.empty(rows, row_bytes, dtype=torch.uint8)
    # copy-on-write: writable for torch, never written; the pages read are the file's page cache
    data = np.memmap(path, dtype=np.uint8, mode="c", offset=offset + start + first, shape=(rows * row_bytes,))
    return torch.from_numpy(data).view(rows, row_bytes)


def mapped_rows(directory: str, metadata: Metadata, key: str, lo: int, hi: int) -> MappedRows:
    """Rows ``[lo, hi)`` of the stored tensor ``key`` of the checkpoint ``directory`` (``metadata``: its ``.metadata``).

    Maps only the pieces that hold some of those rows. A :class:`DataError`
    (``bad_checkpoint``) when ``key`` is absent, when its pieces are not whole
    rows or do not cover ``[lo, hi)``, or when a piece is not stored as the
    metadata says.
    """
    entry: Any = metadata.state_dict_metadata.get(key)
    if entry is None or not hasattr(entry, "chunks"):
        raise _refusal(directory, key, "is not in the checkpoint's metadata")
    dtype, size = entry.properties.dtype, [int(n) for n in entry.size]
    tail = size[1:]
    pieces: List[_Piece] = []
    for chunk in sorted(entry.chunks, key=lambda c: int(c.offsets[0])):
        offsets, sizes = [int(n) for n in chunk.offsets], [int(n) for n in chunk.sizes]
        if any(offsets[1:]) or sizes[1:] != tail:
            raise _refusal(directory, key, f"has a piece at {offsets} of {sizes}, not whole rows")
        r0, r1 = offsets[0], offsets[0] + sizes[0]
        if r1 <= lo or r0 >= hi or r1 == r0:
            continue
        info = (metadata.storage_data or {}).get(MetadataIndex(key, torch.Size(offsets)))
        if info is None:
            raise _refusal(directory, key, f"has no stored data for its piece at {offsets}")
        path = os.path.join(directory, info.relative_path)
        pieces.append(_Piece(r0, r1, _map_item(directory, key, path, int(info.offset), int(info.length), dtype,
                                               sizes)))
    covered = lo
    for piece in pieces:
        if piece.r0 > covered:
            break
        covered = max(covered, piece.r1)
    if covered < hi:
        raise _refusal(directory, key, f"does not hold rows [{covered}, {hi}) of {size[0]}")
    return MappedRows(key, pieces, lo, hi, dtype, tail)


__all__ = ["MappedRows", "WINDOW_BYTES", "mapped_rows"]
