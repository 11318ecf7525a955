"""Raw-id tables in a world-size-free form: the ids a table holds, with their rows and eviction metadata.

A raw-id table (:mod:`rayemb.embedding.raw_tables`) is a set of *entries*,
one per id it holds. Which rank and slot hold an entry depends on the world
size (the key's owner, :func:`~rayemb.embedding.raw_tables.key_owner`) and on
the order ids arrived in, so neither is part of the logical form; as the
canonical row layout of ordinary tables (:mod:`rayemb.checkpoint.exchange`),
this form depends on nothing but the table.

:func:`export_raw_tables` returns this rank's entries, its *part*: per table a
dict of numpy arrays over its ``n`` entries, ascending by raw id:

* ``ids``: int64 ``[n]``, the raw ids (:func:`~rayemb.embedding.raw_ids.keys_to_raw_ids`
  of the stored keys);
* ``weight``: float32 ``[n, D]``;
* the fused optimizer's per-row state by name, float32 ``[n]`` (row-wise) or
  ``[n, D]``; the Adagrad accumulator is ``momentum1``, as in
  :mod:`rayemb.checkpoint.layout`;
* ``meta.<name>``: int64 ``[n]``, the eviction metadata TorchRec keeps per id
  (``meta.counts`` for LFU, ``meta.last_access_iter`` for LRU) and
  ``meta.last_access_s`` for a TTL;
* ``iter``: int64 ``[]``, the table's pass counter (LRU's clock).

The parts of all ranks together are the table; :func:`merge_parts` joins them
into one such dict per table. :func:`load_raw_tables` loads any collection of
parts, handed to the ranks of any world size in any split (each entry to one
rank): one all-to-all per table takes every entry to the rank owning its key,
where entries take slots from the first. A rank given more entries than its
shard holds keeps those the eviction policy keeps (most frequent for LFU,
most recent for LRU) and drops the rest, counted. Nothing else is lost: an id
that was in the table looks up the same row after the load; one that was not
looks up the zero default row, as before.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from rayemb.checkpoint.exchange import _all_to_all, _comm_device, exchange_counts
from rayemb.checkpoint.layout import MOMENTUM, WEIGHT
from rayemb.embedding.raw_ids import EMPTY_KEY, keys_to_raw_ids, raw_ids_to_keys
from rayemb.embedding.raw_tables import LAST_ACCESS_S, RawIdMCH, key_owner, raw_id_modules

IDS = "ids"
ITER = "iter"
META = "meta."
#: fused optimizer state names saved under the name the checkpoint layout gives them
_STATE_NAMES = {"sum": MOMENTUM}
#: the metadata that orders entries when a shard has too many: the policy's own
_PRIORITY = {"lfu": "counts", "lru": "last_access_iter"}

Part = Dict[str, Dict[str, np.ndarray]]


def _bound(mcm: RawIdMCH) -> RawIdMCH:
    if mcm._slot_rows is None:
        raise ValueError(f"raw-id table {mcm.table!r} is not a sharded one: shard the model with "
                         "RawIdEmbeddingBagCollectionSharder (rayemb.embedding.raw_tables) first")
    return mcm


def _live_positions(mcm: RawIdMCH) -> torch.Tensor:
    live = mcm._mch_sorted_raw_ids != int(EMPTY_KEY)
    live[-1] = False  # the default row's position
    return torch.nonzero(live).flatten()


def _states(mcm: RawIdMCH) -> Dict[str, torch.Tensor]:
    return {_STATE_NAMES.get(k, k): v for k, v in mcm._slot_rows.states().items()}


@torch.no_grad()
def export_raw_tables(model: torch.nn.Module) -> Part:
    """This rank's entries of every raw-id table in the sharded ``model`` (module docstring). Not a collective."""
    out: Part = {}
    for name, mcm in sorted(raw_id_modules(model).items()):
        rows = _bound(mcm)._slot_rows
        pos = _live_positions(mcm)
        slots = (mcm._mch_remapped_ids_mapping[pos] - mcm.offset).cpu()
        ids = keys_to_raw_ids(mcm._mch_sorted_raw_ids[pos].cpu().numpy())
        order = np.argsort(ids, kind="stable")
        part = {IDS: ids[order], WEIGHT: rows.weight()[slots].float().cpu().numpy()[order]}
        for state, value in _states(mcm).items():
            part[state] = value[slots.to(value.device)].float().cpu().numpy()[order]
        for meta, value in mcm.metadata().items():
            part[META + meta] = value[pos].cpu().numpy().astype(np.int64)[order]
        part[ITER] = np.array(int(mcm._current_iter_tensor.item()), dtype=np.int64)
        out[name] = part
    return out


def merge_parts(parts: Sequence[Part]) -> Part:
    """The whole table state from the parts of every rank: entries joined, ascending by raw id."""
    out: Part = {}
    for name in sorted({n for p in parts for n in p}):
        mine = [p[name] for p in parts if name in p]
        ids = np.concatenate([m[IDS] for m in mine])
        order = np.argsort(ids, kind="stable")
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"raw-id table {name!r}: the parts hold some ids twice; give each rank's part once")
        merged = {k: np.concatenate([m[k] for m in mine])[order] for k in mine[0] if k != ITER}
        merged[ITER] = np.array(max(int(m[ITER]) for m in mine), dtype=np.int64)
        out[name] = merged
    return out


def _columns(entries: Mapping[str, np.ndarray], names: List[str], n: int, width: Dict[str, int], dtype: type,
             fill: Dict[str, int]) -> np.ndarray:
    cols = []
    for name in names:
        if name in entries:
            cols.append(np.asarray(entries[name], dtype=dtype).reshape(n, width[name]))
        else:
            cols.append(np.full((n, width[name]), fill.get(name, 0), dtype=dtype))
    return np.concatenate(cols, axis=1) if cols else np.zeros((n, 0), dtype=dtype)


def _route(payloads: List[np.ndarray], owner: np.ndarray, world: int) -> List[torch.Tensor]:
    dev = _comm_device()
    order = np.argsort(owner, kind="stable")
    send = np.bincount(owner, minlength=world).tolist()
    recv = exchange_counts(send, dev)
    return [_all_to_all(torch.from_numpy(np.ascontiguousarray(p[order])), send, recv, dev) for p in payloads]


@torch.no_grad()
def _load_table(mcm: RawIdMCH, entries: List[Mapping[str, np.ndarray]]) -> int:
    rows = mcm._slot_rows
    weight, states, meta = rows.weight(), _states(mcm), mcm.metadata()
    dim = weight.shape[1]
    float_names = [WEIGHT, *sorted(states)]
    float_width = {WEIGHT: dim, **{k: v[0].numel() for k, v in states.items()}}
    int_names = [IDS, *(META + m for m in sorted(meta))]
    now = {META + LAST_ACCESS_S: int(mcm._clock())}  # entries saved without a TTL start their TTL now

    ints, floats, owners = [], [], []
    for e in entries:
        n = len(e[IDS])
        keys = raw_ids_to_keys(e[IDS])
        owners.append(key_owner(keys, dist.get_world_size(), mcm._input_hash_size))
        cols = _columns(e, int_names[1:], n, {m: 1 for m in int_names}, np.int64, now)
        ints.append(np.concatenate([keys[:, None], cols], axis=1))
        floats.append(_columns(e, float_names, n, float_width, np.float32, {}))
    ints_all = np.concatenate(ints) if ints else np.zeros((0, len(int_names)), dtype=np.int64)
    floats_all = np.concatenate(floats) if floats else np.zeros((0, sum(float_width.values())), dtype=np.float32)
    owner = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
    got_ints, got_floats = _route([ints_all, floats_all], owner, dist.get_world_size())

    keep = _keep(mcm, got_ints, int_names)
    dropped = int((~keep).sum())
    got_ints, got_floats = got_ints[keep], got_floats[keep]
    by_key = torch.argsort(got_ints[:, 0])
    got_ints, got_floats = got_ints[by_key], got_floats[by_key]
    k, zch = got_ints.shape[0], mcm._zch_size
    dev = mcm._mch_sorted_raw_ids.device

    # the sorted key array, identity slot mapping: entry j in slot offset + j, the default row stays last
    mcm._mch_sorted_raw_ids.fill_(int(EMPTY_KEY))
    mcm._mch_sorted_raw_ids[:k] = got_ints[:, 0].to(dev)
    mcm._mch_remapped_ids_mapping.copy_(torch.arange(mcm.offset, mcm.offset + zch, device=dev))
    for i, m in enumerate(int_names[1:], start=1):
        buf = meta[m[len(META):]]
        buf.zero_()
        buf[:k] = got_ints[:, i].to(buf.device)

    col = 0
    for name in float_names:
        target = weight if name == WEIGHT else states[name]
        values = got_floats[:, col:col + float_width[name]].reshape((k,) + tuple(target.shape[1:]))
        col += float_width[name]
        if name != WEIGHT:
            target.zero_()
        target[:k] = values.to(target.device, target.dtype)
    rows.zero(torch.tensor([zch - 1]))
    return dropped


def _keep(mcm: RawIdMCH, got_ints: torch.Tensor, int_names: List[str]) -> torch.Tensor:
    """Which received entries fit this shard: all, or the ``capacity`` the policy ranks first."""
    n = got_ints.shape[0]
    keep = torch.ones(n, dtype=torch.bool)
    if n <= mcm.capacity:
        return keep
    priority = got_ints[:, int_names.index(META + _PRIORITY[mcm.policy])]
    # most important first; among equals the smaller key, so every world size drops the same way
    order = torch.argsort(got_ints[:, 0], stable=True)
    order = order[torch.argsort(priority[order], descending=True, stable=True)]
    keep[:] = False
    keep[order[:mcm.capacity]] = True
    return keep


def load_raw_tables(model: torch.nn.Module, parts: Sequence[Part]) -> Dict[str, int]:
    """Loads the raw-id tables of the sharded ``model`` from ``parts``; returns the ids dropped per table.

    A collective: every rank calls it, each with the parts it was given (any
    split of the exported parts over the ranks; a rank may get none). Every
    table of the model is replaced whole: ids not in the parts are gone.
    Entries a shard cannot hold are dropped (module docstring); the counts
    returned are over all ranks. Optimizer states and metadata the parts lack
    start at 0 (a TTL's timestamp at now); those the model does not keep are
    ignored. The tables' pass counter becomes the largest saved one.
    """
    dev = _comm_device()
    dropped: Dict[str, int] = {}
    for name, mcm in sorted(raw_id_modules(model).items()):
        _bound(mcm)
        entries = [p[name] for p in parts if name in p]
        dropped[name] = _load_table(mcm, entries)
        it = torch.tensor([max([int(e[ITER]) for e in entries] + [0])], dtype=torch.int64, device=dev)
        dist.all_reduce(it, op=dist.ReduceOp.MAX)
        mcm._current_iter_tensor.fill_(int(it.item()))
        # TorchRec reads the counter back from the tensor at the next training pass; the history of ids seen
        # since the last admission pass is not part of the state
        mcm._current_iter, mcm._last_eviction_iter = -1, -1
        mcm._current_history_buffer_offset = 0
        mcm._evicted = False
    counts = torch.tensor([dropped[n] for n in sorted(dropped)], dtype=torch.int64, device=dev)
    dist.all_reduce(counts)
    return dict(zip(sorted(dropped), (int(c) for c in counts.cpu().tolist())))


__all__ = ["IDS", "ITER", "META", "Part", "export_raw_tables", "load_raw_tables", "merge_parts"]
