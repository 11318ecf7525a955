"""Moving table rows between a plan's slots and the plan-free canonical layout, with two all-to-alls.

The canonical layout of a table of V rows on W ranks: rank r holds the full
rows ``[V·r//W, V·(r+1)//W)`` of every logical state (:func:`row_range`). It
depends on nothing but V and W, which is what makes a checkpoint loadable into
any plan: saving gathers every slot's rows (:mod:`rayemb.checkpoint.layout`)
to their canonical owners (:func:`gather_canonical`), loading sends each
slot the rows it asks for (:func:`scatter_canonical`). Replicated slots
(data-parallel tables, hot halves) are read locally for the rank's own range
and never sent, so bytes on the wire are the sharded rows only, once.

Each exchange is one ``all_to_all_single`` of per-row headers
``(table, row, first column, width)`` and one of values padded to the widest
table (rows of column-wise shards carry their own columns only). Works on gloo
(CPU tensors) and nccl (the current CUDA device).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

import torch
import torch.distributed as dist

from rayemb.checkpoint.layout import WEIGHT, Slot


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


def _exchange_counts(send_counts: List[int], dev: torch.device) -> List[int]:
    recv = torch.empty(len(send_counts), dtype=torch.int64, device=dev)
    dist.all_to_all_single(recv, torch.tensor(send_counts, dtype=torch.int64, device=dev))
    return [int(x) for x in recv.cpu().tolist()]


def _values_2d(slot: Slot) -> torch.Tensor:
    t = slot.tensor.detach().to("cpu", torch.float32)
    return t.reshape(t.shape[0], -1)


def gather_canonical(slots: Sequence[Slot], tables: Mapping[str, Tuple[int, int]], state: str
                     ) -> Dict[str, torch.Tensor]:
    """This rank's canonical rows of ``state`` for every table that has it: ``[hi-lo, D]`` or ``[hi-lo]`` (row-wise).

    ``tables``: name -> (num_embeddings, dim), the same on every rank. A
    collective: every rank calls it with the same ``tables`` and ``state``.
    Raises :class:`RuntimeError` when some canonical element was held by no slot.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _comm_device()
    names = sorted(tables)
    index = {n: i for i, n in enumerate(names)}
    width_max = max([d for _, d in tables.values()] + [1])
    headers: List[torch.Tensor] = []
    values: List[torch.Tensor] = []
    owners: List[torch.Tensor] = []
    rowwise_tables: Dict[str, bool] = {}
    for slot in slots:
        if slot.state != state or slot.table not in index:
            continue
        num_rows, _ = tables[slot.table]
        rowwise_tables[slot.table] = slot.rowwise
        owner = _owner(slot.rows, num_rows, world)
        keep = owner == rank if slot.replicated else torch.ones_like(owner, dtype=torch.bool)
        if not bool(keep.any()):
            continue
        rows = slot.rows[keep]
        vals = _values_2d(slot)[keep]
        n = rows.numel()
        headers.append(torch.stack([torch.full((n,), index[slot.table], dtype=torch.int64), rows,
                                    torch.full((n,), slot.col0, dtype=torch.int64),
                                    torch.full((n,), slot.width, dtype=torch.int64)], dim=1))
        padded = torch.zeros(n, width_max, dtype=torch.float32)
        padded[:, :vals.shape[1]] = vals
        values.append(padded)
        owners.append(owner[keep])
    header = torch.cat(headers) if headers else torch.zeros(0, 4, dtype=torch.int64)
    value = torch.cat(values) if values else torch.zeros(0, width_max)
    owner = torch.cat(owners) if owners else torch.zeros(0, dtype=torch.int64)
    order = torch.argsort(owner, stable=True)
    header, value = header[order], value[order]
    send_counts = torch.bincount(owner, minlength=world).tolist()
    recv_counts = _exchange_counts(send_counts, dev)
    header = _all_to_all(header, send_counts, recv_counts, dev)
    value = _all_to_all(value, send_counts, recv_counts, dev)

    # row-wise is a property of the optimizer, the same for every table: agree on it across ranks
    flag = torch.tensor([1 if any(rowwise_tables.values()) else 0], dtype=torch.int64, device=dev)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    rowwise = state != WEIGHT and bool(flag.item())

    out: Dict[str, torch.Tensor] = {}
    cols = torch.arange(width_max)
    for name in names:
        num_rows, dim = tables[name]
        lo, hi = row_range(num_rows, rank, world)
        mine = header[:, 0] == index[name]
        h, v = header[mine], value[mine]
        local = h[:, 1] - lo
        if rowwise:
            # width-weighted mean of the column shards' row values, in float64 (exact when they agree)
            num = torch.zeros(hi - lo, dtype=torch.float64).index_add_(0, local, v[:, 0].double() * h[:, 3].double())
            den = torch.zeros(hi - lo, dtype=torch.float64).index_add_(0, local, h[:, 3].double())
            if bool((den != dim).any()):
                _missing(name, state, int((den != dim).sum()), lo)
            out[name] = (num / den).to(torch.float32)
            continue
        full = torch.zeros(hi - lo, dim, dtype=torch.float32)
        seen = torch.zeros(hi - lo, dim, dtype=torch.int32)
        mask = cols[None, :] < h[:, 3:4]
        r_idx = local[:, None].expand(-1, width_max)[mask]
        c_idx = (h[:, 2:3] + cols[None, :])[mask]
        full[r_idx, c_idx] = v[mask]
        seen.index_put_((r_idx, c_idx), torch.ones_like(r_idx, dtype=torch.int32), accumulate=True)
        if bool((seen != 1).any()):
            _missing(name, state, int((seen != 1).sum()), lo)
        out[name] = full
    return out


def _missing(table: str, state: str, count: int, lo: int) -> None:
    raise RuntimeError(f"canonical {state} of table {table!r} (rows from {lo}): {count} element(s) held by no "
                       "slot or by several; the model's layout is not covered by rayemb.checkpoint.layout")


def scatter_canonical(slots: Sequence[Slot], canonical: Mapping[str, torch.Tensor],
                      tables: Mapping[str, Tuple[int, int]], state: str) -> int:
    """Writes into every slot of ``state`` its rows from the canonical chunks (inverse of :func:`gather_canonical`).

    ``canonical``: this rank's ``[hi-lo, D]`` / ``[hi-lo]`` per table (tables
    absent there leave their slots untouched). A collective. Returns the
    number of slot rows written on this rank.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = _comm_device()
    names = sorted(tables)
    index = {n: i for i, n in enumerate(names)}
    width_max = max([d for _, d in tables.values()] + [1])
    wanted = [s for s in slots if s.state == state and s.table in index and s.table in canonical]
    # 1) requests: (table, row, col0, width) to the row's canonical owner
    req: List[torch.Tensor] = []
    owners: List[torch.Tensor] = []
    for slot in wanted:
        n = slot.rows.numel()
        req.append(torch.stack([torch.full((n,), index[slot.table], dtype=torch.int64), slot.rows,
                                torch.full((n,), slot.col0, dtype=torch.int64),
                                torch.full((n,), slot.width, dtype=torch.int64)], dim=1))
        owners.append(_owner(slot.rows, tables[slot.table][0], world))
    request = torch.cat(req) if req else torch.zeros(0, 4, dtype=torch.int64)
    owner = torch.cat(owners) if owners else torch.zeros(0, dtype=torch.int64)
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=world).tolist()
    recv_counts = _exchange_counts(send_counts, dev)
    incoming = _all_to_all(request[order], send_counts, recv_counts, dev)

    # 2) answers, in the order asked
    answer = torch.zeros(incoming.shape[0], width_max, dtype=torch.float32)
    cols = torch.arange(width_max)
    for name in names:
        if name not in canonical:
            continue
        num_rows, _ = tables[name]
        lo, _ = row_range(num_rows, rank, world)
        mine = torch.nonzero(incoming[:, 0] == index[name]).flatten()
        if mine.numel() == 0:
            continue
        chunk = canonical[name].to(torch.float32)
        local = incoming[mine, 1] - lo
        if chunk.dim() == 1:
            answer[mine, 0] = chunk[local]
            continue
        c0, w = incoming[mine, 2:3], incoming[mine, 3:4]
        mask = cols[None, :] < w
        src_c = torch.where(mask, c0 + cols[None, :], torch.zeros_like(mask, dtype=torch.int64))
        vals = chunk[local[:, None].expand(-1, width_max), src_c.clamp(max=chunk.shape[1] - 1)]
        answer[mine] = torch.where(mask, vals, torch.zeros_like(vals))
    back = _all_to_all(answer, recv_counts, send_counts, dev)

    # 3) into the slots (undo the sort by owner)
    received = torch.empty_like(back)
    received[order] = back
    offset = 0
    with torch.no_grad():
        for slot in wanted:
            n = slot.rows.numel()
            v = received[offset:offset + n]
            offset += n
            t = slot.tensor
            if t.dim() == 1:
                t.copy_(v[:, 0].to(t.dtype))
            elif slot.state != WEIGHT and t.shape[-1] == 1 and slot.width > 1:
                t.copy_(v[:, :1].to(t.dtype))
            else:
                t.copy_(v[:, :t.shape[1]].to(t.dtype))
    return offset


__all__ = ["gather_canonical", "row_range", "scatter_canonical"]
