"""Moving table rows between a plan's slots and the plan-free canonical layout, in rounds of bounded size.

The canonical layout of a table of V rows on W ranks: rank r holds the full
rows ``[V·r//W, V·(r+1)//W)`` of every logical state (:func:`row_range`). It
depends on nothing but V and W, which is what makes a checkpoint loadable into
any plan: saving gathers every slot's rows (:mod:`rayemb.checkpoint.layout`)
to their canonical owners (:func:`gather_canonical`), loading sends each
slot the rows it asks for (:func:`scatter_canonical`). Replicated slots
(data-parallel tables, hot halves) are read locally for the rank's own range
and never sent, so bytes on the wire are the sharded rows only, once.

Host memory is bounded by ``chunk_bytes``: an exchange runs in *rounds*, and
in each round a rank sends at most ``chunk_bytes / W`` to each rank (so it
sends, and receives, at most ``chunk_bytes``), counting with each row the
:data:`INDEX_BYTES` it costs the sender to pick and order it (which outweigh
the values of a row-wise state's one-value rows). A round is one
``all_to_all_single`` of counts, one of per-row headers ``(row, code)``
(``code`` packs the table, first column and width: 16 bytes a row) and one
of values, each row at its own width (rows of column-wise shards carry their
own columns only; nothing is padded). Saving writes the received rows
straight into the canonical tensors, in the table's stored dtype. Ranks run
rounds until none has rows left (an ``all_reduce`` a round).
``chunk_bytes=None`` is one round with everything. Works on gloo (CPU
tensors) and nccl (the current CUDA device).

The canonical rows themselves need not be anonymous memory: a save makes its
canonical tensors (and their per-row bookkeeping) with the ``zeros`` it is
given (:class:`rayemb.checkpoint.staging.Staging`: memory-mapped files), and a
load reads rows from any :class:`CanonicalRows` (:class:`rayemb.checkpoint.mapped.MappedRows`:
the stored pieces, memory-mapped), a round's rows at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from rayemb.checkpoint.layout import WEIGHT, Slot

#: header bytes a row costs on the wire: int64 row id + int64 code (table, first column, width)
HEADER_BYTES = 16
#: bytes a row costs its sender while its round is prepared: its local position, row id and owner (int64) and the
#: sorted copies of the first two
INDEX_BYTES = 40
_VALUE_BYTES = 4  # rows travel as fp32, which holds fp16 / bf16 rows exactly
_FIELD_BITS = 20  # first column and width each fit 20 bits of a code (tables up to 2**20 columns)
_FIELD_MASK = (1 << _FIELD_BITS) - 1
#: a canonical element no slot has written yet: signalling NaNs, which no arithmetic or cast produces
_UNSET = {torch.float32: (torch.int32, 0x7FA5A5A5), torch.float16: (torch.int16, 0x7D5A),
          torch.bfloat16: (torch.int16, 0x7FA5)}
#: rows of the canonical tensors a check or a conversion touches at once when there is no round size
_WINDOW_BYTES = 64 * 2**20

#: makes a zero-filled tensor of (shape, dtype): where a save keeps the canonical rows it gathers
Allocator = Callable[[Sequence[int], torch.dtype], torch.Tensor]


class CanonicalRows(Protocol):
    """A rank's canonical rows of one table's state that are read a few at a time (e.g. memory-mapped)."""

    def dim(self) -> int:
        """1 for row-wise state ``[hi-lo]``, 2 for ``[hi-lo, D]``."""

    def rows_at(self, local: torch.Tensor, col0: int, width: int) -> torch.Tensor:
        """Rows ``local`` (0: the rank's first canonical row), ``[n]``; or their columns ``[col0, col0+width)``."""


def _zeros(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(tuple(shape), dtype=dtype)


def _windows(num_rows: int, cap: Optional[int], row_bytes: int) -> Iterator[slice]:
    """``[0, num_rows)`` in slices of at most ``cap`` (or :data:`_WINDOW_BYTES`) bytes of rows."""
    step = max(1, (cap or _WINDOW_BYTES) // max(row_bytes, 1))
    for i in range(0, num_rows, step):
        yield slice(i, min(i + step, num_rows))


def row_range(num_rows: int, rank: int, world_size: int) -> Tuple[int, int]:
    """Canonical rows ``[lo, hi)`` of ``rank``."""
    return num_rows * rank // world_size, num_rows * (rank + 1) // world_size


def _owner(rows: torch.Tensor, num_rows: int, world_size: int) -> torch.Tensor:
    # the rank r with V·r//W <= row < V·(r+1)//W, i.e. r = floor(((row+1)·W - 1) / V)
    return torch.div((rows + 1) * world_size - 1, num_rows, rounding_mode="floor")


def _comm_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_to_all(tensor: torch.Tensor, send_counts: List[int], recv_counts: List[int], dev: torch.device
                ) -> torch.Tensor:
    out = torch.empty((sum(recv_counts),) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=dev)
    dist.all_to_all_single(out, tensor.to(dev).contiguous(), output_split_sizes=recv_counts,
                           input_split_sizes=send_counts)
    return out.cpu()


def exchange_counts(send: List[int], dev: torch.device) -> List[int]:
    """What each rank sends this one, for ``send[r]`` this rank sends rank ``r`` (one count each)."""
    recv = torch.empty(len(send), dtype=torch.int64, device=dev)
    dist.all_to_all_single(recv, torch.tensor(send, dtype=torch.int64, device=dev))
    return [int(x) for x in recv.cpu().tolist()]


def _exchange_counts(send: List[Tuple[int, int]], dev: torch.device) -> List[Tuple[int, int]]:
    """(rows, values) each rank sends this one, for (rows, values) this rank sends each rank."""
    recv = torch.empty(2 * len(send), dtype=torch.int64, device=dev)
    dist.all_to_all_single(recv, torch.tensor(send, dtype=torch.int64, device=dev).flatten())
    flat = [int(x) for x in recv.cpu().tolist()]
    return list(zip(flat[0::2], flat[1::2]))


def _any_rank(flag: bool, dev: torch.device) -> bool:
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _code(table: int, col0: int, width: int) -> int:
    if col0 > _FIELD_MASK or width > _FIELD_MASK:
        raise ValueError(f"a table of {col0 + width} columns: checkpoints move tables of up to {_FIELD_MASK} columns")
    return (table << (2 * _FIELD_BITS)) | (col0 << _FIELD_BITS) | width


def _decode(code: int) -> Tuple[int, int, int]:
    return code >> (2 * _FIELD_BITS), (code >> _FIELD_BITS) & _FIELD_MASK, code & _FIELD_MASK


# ---- ROUNDS ---- #


@dataclass
class _Block:
    """Rows ``[r0, r1)`` of one slot (less the replicated ones another rank owns), sorted by canonical owner."""

    slot: Slot
    code: int
    width: int  # values per row on the wire
    local: torch.Tensor  # int64: positions in the slot's tensor, grouped by owner
    rows: torch.Tensor  # int64: their logical rows
    per_rank: List[int]  # rows for each rank, in rank order

    def cost(self) -> List[int]:
        return [n * _row_bytes(self.width) for n in self.per_rank]


def _row_bytes(width: int) -> int:
    """What a row of ``width`` values counts against a round's bound."""
    return HEADER_BYTES + _VALUE_BYTES * width + INDEX_BYTES


def _blocks(slots: Sequence[Tuple[Slot, int, int]], tables: Mapping[str, Tuple[int, int]], cap: Optional[int],
            rank: int, world: int, own_replicated: bool) -> Iterator[_Block]:
    """``(slot, code, width)`` cut into blocks of at most ``cap`` bytes on the wire (None: whole slots).

    ``own_replicated``: a replicated slot contributes only the rows this rank owns (saving: every rank holds
    them, one sends them); else all its rows (loading: every rank fills its copy).
    """
    for slot, code, width in slots:
        n = slot.rows.numel()
        step = n if cap is None else max(1, cap // _row_bytes(width))
        for r0 in range(0, n, max(step, 1)):
            rows = slot.rows[r0:r0 + step]
            owner = _owner(rows, tables[slot.table][0], world)
            local = torch.arange(r0, r0 + rows.numel(), dtype=torch.int64)
            if slot.replicated and own_replicated:
                keep = owner == rank
                local, rows, owner = local[keep], rows[keep], owner[keep]
            if rows.numel() == 0:
                continue
            order = torch.argsort(owner, stable=True)
            yield _Block(slot, code, width, local[order], rows[order],
                         torch.bincount(owner, minlength=world).tolist())


def _rounds(blocks: Iterator[_Block], cap: Optional[int], world: int, dev: torch.device) -> Iterator[List[_Block]]:
    """Blocks grouped so that no rank is sent more than ``cap`` bytes a round; every rank runs every round."""
    pending = next(blocks, None)
    while True:
        batch: List[_Block] = []
        used = [0] * world
        while pending is not None:
            cost = pending.cost()
            if batch and cap is not None and any(u + c > cap for u, c in zip(used, cost)):
                break
            batch.append(pending)
            used = [u + c for u, c in zip(used, cost)]
            pending = next(blocks, None)
        yield batch
        if not _any_rank(pending is not None, dev):
            return


def _per_rank_cap(chunk_bytes: Optional[int], world: int) -> Optional[int]:
    if chunk_bytes is None:
        return None
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes={chunk_bytes}: give a positive number of bytes, or None for one round")
    return max(1, chunk_bytes // world)


def _segments(batch: List[_Block], world: int) -> Iterator[Tuple[int, _Block, slice]]:
    """(destination, block, its rows for it), destination-major: the order rows travel in."""
    starts = [[0] + torch.tensor(b.per_rank).cumsum(0).tolist() for b in batch]
    for d in range(world):
        for b, s in zip(batch, starts):
            if s[d + 1] > s[d]:
                yield d, b, slice(s[d], s[d + 1])


def _runs(codes: torch.Tensor) -> List[Tuple[int, int, int]]:
    """(start, end, code) of each stretch of equal codes: rows of one slot arrive together, at one width."""
    if codes.numel() == 0:
        return []
    change = torch.ones(codes.numel(), dtype=torch.bool)
    change[1:] = codes[1:] != codes[:-1]
    starts = torch.nonzero(change).flatten().tolist() + [codes.numel()]
    return [(s, e, int(codes[s])) for s, e in zip(starts[:-1], starts[1:])]


# ---- SAVE ---- #


def _unset(out: torch.Tensor) -> torch.Tensor:
    int_dtype, pattern = _UNSET[out.dtype]
    out.view(int_dtype).fill_(pattern)
    return out


def _count_unset(out: torch.Tensor, cap: Optional[int]) -> int:
    int_dtype, pattern = _UNSET[out.dtype]
    bits = out.view(int_dtype)
    return sum(int((bits[w] == pattern).sum()) for w in _windows(out.shape[0], cap, _VALUE_BYTES * out.shape[1]))


def _count_not(values: torch.Tensor, expected: float, cap: Optional[int]) -> int:
    """Elements of the 1-D ``values`` other than ``expected``, a window at a time (no mask of the whole)."""
    return sum(int((values[w] != expected).sum()) for w in _windows(values.shape[0], cap, 8))


def gather_canonical(slots: Sequence[Slot], tables: Mapping[str, Tuple[int, int]], state: str,
                     dtypes: Optional[Mapping[str, torch.dtype]] = None, chunk_bytes: Optional[int] = None,
                     zeros: Optional[Allocator] = None) -> Dict[str, torch.Tensor]:
    """This rank's canonical rows of ``state`` for every table that has it: ``[hi-lo, D]`` or ``[hi-lo]`` (row-wise).

    ``tables``: name -> (num_embeddings, dim), the same on every rank.
    ``dtypes``: name -> dtype the rows are returned in (fp32 when absent;
    row-wise state is fp32). ``chunk_bytes``: the most bytes a rank sends in
    one round (None: one round). ``zeros``: makes the returned tensors and the
    per-row bookkeeping (``torch.zeros`` when absent; a save passes
    :meth:`rayemb.checkpoint.staging.Staging.zeros`); nothing else this call
    holds grows with the table. A collective: every rank calls it with the
    same ``tables``, ``state`` and ``chunk_bytes``. Raises :class:`RuntimeError`
    when some canonical element was held by no slot or by several.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _comm_device()
    zeros = zeros or _zeros
    names = sorted(tables)
    index = {n: i for i, n in enumerate(names)}
    mine = [s for s in slots if s.state == state and s.table in index]
    # row-wise is a property of the optimizer, the same for every table: agree on it across ranks
    rowwise = state != WEIGHT and _any_rank(any(s.rowwise for s in mine), dev)
    bounds = {n: row_range(tables[n][0], rank, world) for n in names}
    if rowwise:
        num = {n: zeros((hi - lo,), torch.float64) for n, (lo, hi) in bounds.items()}
        den = {n: zeros((hi - lo,), torch.float64) for n, (lo, hi) in bounds.items()}
    else:
        out = {n: _unset(zeros((hi - lo, tables[n][1]), (dtypes or {}).get(n, torch.float32)))
               for n, (lo, hi) in bounds.items()}
        # with every element set, a row that received exactly D values received each of its columns once
        count = {n: zeros((hi - lo,), torch.int32) for n, (lo, hi) in bounds.items()}
    cap = _per_rank_cap(chunk_bytes, world)
    sources = [(s, _code(index[s.table], s.col0, s.width), 1 if rowwise else s.width) for s in mine]
    for batch in _rounds(_blocks(sources, tables, cap, rank, world, True), cap, world, dev):
        header, values = _pack_rows(batch, world)
        sent = [(0, 0)] * world
        for d, b, seg in _segments(batch, world):
            sent[d] = (sent[d][0] + seg.stop - seg.start, sent[d][1] + (seg.stop - seg.start) * b.width)
        got = _exchange_counts(sent, dev)
        header = _all_to_all(header, [r for r, _ in sent], [r for r, _ in got], dev)
        values = _all_to_all(values, [v for _, v in sent], [v for _, v in got], dev)
        offset = 0
        for s, e, code in _runs(header[:, 1]):
            t, col0, width = _decode(code)
            name = names[t]
            local = header[s:e, 0] - bounds[name][0]
            if rowwise:
                v = values[offset:offset + e - s]
                offset += e - s
                # width-weighted mean of the column shards' row values, in float64 (exact when they agree)
                num[name].index_add_(0, local, v.double() * width)
                den[name].index_add_(0, local, torch.full((e - s,), float(width), dtype=torch.float64))
                continue
            v = values[offset:offset + (e - s) * width].view(e - s, width)
            offset += (e - s) * width
            out[name][local, col0:col0 + width] = v.to(out[name].dtype)
            count[name].index_add_(0, local, torch.full((e - s,), width, dtype=torch.int32))

    result: Dict[str, torch.Tensor] = {}
    for name in names:
        (lo, hi), dim = bounds[name], tables[name][1]
        if rowwise:
            bad = _count_not(den[name], float(dim), cap)
            if bad:
                _missing(name, state, f"{bad} row(s) not covering {dim} columns once", lo)
            mean = zeros((hi - lo,), torch.float32)
            for w in _windows(hi - lo, cap, 8):
                mean[w] = (num[name][w] / den[name][w]).to(torch.float32)
            del num[name], den[name]
            result[name] = mean
            continue
        bad = _count_not(count[name], dim, cap)
        unset = _count_unset(out[name], cap)
        if bad or unset:
            _missing(name, state, f"{bad} row(s) given other than {dim} values, {unset} value(s) given by none", lo)
        result[name] = out[name]
    return result


def _pack_rows(batch: List[_Block], world: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Headers ``[n, 2]`` and values (flat fp32) of a round, destination-major."""
    n_rows = sum(sum(b.per_rank) for b in batch)
    n_vals = sum(sum(b.per_rank) * b.width for b in batch)
    header = torch.empty(n_rows, 2, dtype=torch.int64)
    values = torch.empty(n_vals, dtype=torch.float32)
    r = v = 0
    for _, b, seg in _segments(batch, world):
        n = seg.stop - seg.start
        header[r:r + n, 0] = b.rows[seg]
        header[r:r + n, 1] = b.code
        local = b.local[seg].to(b.slot.tensor.device)
        rows = b.slot.tensor.detach().index_select(0, local).reshape(n, -1)[:, :b.width]
        values[v:v + n * b.width].view(n, b.width).copy_(rows)
        r, v = r + n, v + n * b.width
    return header, values


def _missing(table: str, state: str, what: str, lo: int) -> None:
    raise RuntimeError(f"canonical {state} of table {table!r} (rows from {lo}): {what} (held by no slot or by "
                       "several); the model's layout is not covered by rayemb.checkpoint.layout")


# ---- LOAD ---- #


def _answer_width(slot: Slot) -> int:
    """Values a slot row takes: 1 for 1-D and row-wise ``[n, 1]`` state, else its width."""
    t = slot.tensor
    return 1 if t.dim() == 1 else int(t.shape[1])


def _rows_of(chunk: Union[torch.Tensor, CanonicalRows], local: torch.Tensor, col0: int, width: int) -> torch.Tensor:
    if isinstance(chunk, torch.Tensor):
        return chunk[local] if chunk.dim() == 1 else chunk[local, col0:col0 + width]
    return chunk.rows_at(local, col0, width)


def scatter_canonical(slots: Sequence[Slot], canonical: Mapping[str, Union[torch.Tensor, CanonicalRows]],
                      tables: Mapping[str, Tuple[int, int]], state: str, chunk_bytes: Optional[int] = None) -> int:
    """Writes into every slot of ``state`` its rows from the canonical chunks (inverse of :func:`gather_canonical`).

    ``canonical``: this rank's ``[hi-lo, D]`` / ``[hi-lo]`` per table, as a
    tensor or a :class:`CanonicalRows` read a round's rows at a time (tables
    absent there leave their slots untouched; every rank passes the same
    table names). A 1-D (row-wise) chunk gives every column of an
    element-wise slot its row's value. ``chunk_bytes``: the most bytes of answers a rank is sent
    in one round (None: one round). A collective. Returns the number of slot
    rows written on this rank.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _comm_device()
    names = sorted(tables)
    index = {n: i for i, n in enumerate(names)}
    wanted = [s for s in slots if s.state == state and s.table in index and s.table in canonical]
    cap = _per_rank_cap(chunk_bytes, world)
    sources = [(s, _code(index[s.table], s.col0, _answer_width(s)), _answer_width(s)) for s in wanted]
    written = 0
    for batch in _rounds(_blocks(sources, tables, cap, rank, world, False), cap, world, dev):
        # 1) requests (row, code) to each row's canonical owner
        asked = [(0, 0)] * world
        for d, b, seg in _segments(batch, world):
            asked[d] = (asked[d][0] + seg.stop - seg.start, asked[d][1] + (seg.stop - seg.start) * b.width)
        request = torch.empty(sum(r for r, _ in asked), 2, dtype=torch.int64)
        r = 0
        for _, b, seg in _segments(batch, world):
            request[r:r + seg.stop - seg.start, 0] = b.rows[seg]
            request[r:r + seg.stop - seg.start, 1] = b.code
            r += seg.stop - seg.start
        got = _exchange_counts(asked, dev)
        incoming = _all_to_all(request, [n for n, _ in asked], [n for n, _ in got], dev)
        # 2) answers, in the order asked, each row at the width asked
        answer = torch.empty(sum(v for _, v in got), dtype=torch.float32)
        offset = 0
        for s, e, code in _runs(incoming[:, 1]):
            t, col0, width = _decode(code)
            local = incoming[s:e, 0] - row_range(tables[names[t]][0], rank, world)[0]
            rows = _rows_of(canonical[names[t]], local, col0, width)
            answer[offset:offset + (e - s) * width].view(e - s, width).copy_(
                rows.reshape(e - s, -1).expand(-1, width))
            offset += (e - s) * width
        back = _all_to_all(answer, [v for _, v in got], [v for _, v in asked], dev)
        # 3) into the slots, in the order asked
        offset = 0
        with torch.no_grad():
            for _, b, seg in _segments(batch, world):
                n = seg.stop - seg.start
                t = b.slot.tensor
                v = back[offset:offset + n * b.width].view(n, b.width)
                offset += n * b.width
                t.index_copy_(0, b.local[seg].to(t.device), v.reshape((n,) + tuple(t.shape[1:])).to(t.device, t.dtype))
                written += n
    return written


__all__ = ["HEADER_BYTES", "INDEX_BYTES", "Allocator", "CanonicalRows", "gather_canonical", "row_range", "scatter_canonical"]
