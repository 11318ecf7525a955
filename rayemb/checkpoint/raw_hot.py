"""The hot rows of hybrid raw-id tables, saved and loaded as entries of the tables' raw-id parts.

A raw-id table placed hybrid keeps its hot ids (raw values, from the
statistics' heavy hitters) in fixed rows of the hybrid module's replicated
``hot`` child, and its other ids in the managed-collision table
(:mod:`rayemb.embedding.hybrid`). A checkpoint keeps the table in one form
whatever the placement: the ids it holds, each with its row, optimizer state
and eviction metadata (:mod:`rayemb.checkpoint.raw_state`). So the hot rows
are entries too, written once (rank 0's part: every rank holds the same rows)
and given the highest eviction priority of the table, since they are its most
frequent ids: each metadata at the largest value its managed entries have on
any rank, and at least the table's counter now, as if looked up at the save.
TorchRec's LRU evicts the smallest ``last_access_iter`` (the table's pass
counter at an id's last lookup) first and LFU the smallest ``counts``; a TTL
drops an id whose ``last_access_s`` (the table's clock) is older than the TTL.
So an empty table's hot entries get the pass counter (LRU's clock, and for LFU
a count of one lookup a pass) and the clock: reloaded as managed rows they are
the last the table evicts, not the first, and a TTL starts at the save.

On load the split is the loading job's: an entry whose id is hot there goes to
its hot row on every rank, any other to the managed-collision table. A job on
another world size (whose split has another hot set), a reshard and an export
read the same files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch
import torch.distributed as dist

from rayemb.checkpoint.layout import MOMENTUM, WEIGHT, embedding_key, is_momentum_state
from rayemb.checkpoint.raw_state import IDS, ITER, META


@dataclass
class HotHalf:
    """The live hot rows of one hybrid raw-id table on this rank."""

    ids: np.ndarray  # int64 [K], sorted: hot row k holds raw id ids[k]
    weight: torch.Tensor  # [K, D], the live rows (written in place on load)
    states: Dict[str, torch.Tensor]  # MOMENTUM -> [K] / [K, 1] / [K, D], the live optimizer state
    #: metadata name (``meta.<name>``) -> the least value the hot entries get: the table's counter now
    #: (:func:`table_counters`)
    floor: Dict[str, int] = field(default_factory=dict)


def table_counters(mcm: Any) -> Dict[str, int]:
    """``meta.<name>`` -> the managed-collision module ``mcm``'s counter for that metadata now: its pass counter
    for LRU's ``last_access_iter`` and LFU's ``counts``, its clock for a TTL's ``last_access_s``."""
    from rayemb.embedding.raw_tables import LAST_ACCESS_S

    passes = int(mcm._current_iter_tensor.item())
    now = {"last_access_iter": passes, "counts": passes, LAST_ACCESS_S: int(mcm._clock())}
    return {META + name: now[name] for name in mcm.metadata() if name in now}


def _remappers(model: torch.nn.Module) -> List[Any]:
    return [m.remapper for m in model.modules() if hasattr(getattr(m, "remapper", None), "raw_tables")]


def hot_halves(model: torch.nn.Module, model_state: Mapping[str, Any],
               optimizer_state: Mapping[str, Mapping[str, Any]]) -> Dict[str, HotHalf]:
    """Table -> :class:`HotHalf` of every raw-id table of ``model`` with hot ids (``{}``: none).

    ``model_state`` / ``optimizer_state``: ``model.state_dict()`` and ``optimizer.state_dict()["state"]``,
    whose tensors of a replicated table are the live ones.
    """
    from rayemb.embedding.raw_tables import raw_id_modules

    hot_ids = {t: r.hot_ids(t) for r in _remappers(model) for t in r.raw_tables if t in r.hybrid_tables()}
    managed = raw_id_modules(model)
    out: Dict[str, HotHalf] = {}
    for key, value in model_state.items():
        parsed = embedding_key(key)
        if parsed is None or parsed[0] != "hot" or parsed[1] not in hot_ids:
            continue
        table = parsed[1]
        states = {MOMENTUM: s for name, s in optimizer_state.get(key, {}).items()
                  if is_momentum_state(name) and isinstance(s, torch.Tensor)}
        out[table] = HotHalf(hot_ids[table], value, states,
                             table_counters(managed[table]) if table in managed else {})
    return out


def top_metadata(part: Mapping[str, Mapping[str, np.ndarray]], halves: Mapping[str, HotHalf]
                 ) -> Dict[str, Dict[str, int]]:
    """Table -> metadata name -> its largest value over every rank's managed entries and the table's counter
    (``HotHalf.floor``) on every rank (a collective over the ranks, each with its own ``part``), at least 1:
    what the hot entries are given."""
    names = [(t, k) for t in sorted(halves) for k in sorted(part[t]) if k.startswith(META)]
    local = [max(int(part[t][k].max()) if part[t][k].size else 0, halves[t].floor.get(k, 0)) for t, k in names]
    top = torch.tensor(local + [0], dtype=torch.int64)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    out: Dict[str, Dict[str, int]] = {t: {} for t in halves}
    for (t, k), v in zip(names, top.tolist()):
        out[t][k] = max(int(v), 1)
    return out


@torch.no_grad()
def add_hot_entries(part: Dict[str, Dict[str, np.ndarray]], halves: Mapping[str, HotHalf],
                    top: Mapping[str, Mapping[str, int]]) -> None:
    """Adds the hot rows of ``halves`` to ``part`` (this rank's raw-id part: every raw-id table, each field of
    its managed entries, ascending by id), in place. A metadata the hot rows lack is ``top``'s
    (:func:`top_metadata`); an optimizer state they lack is 0."""
    for table, half in halves.items():
        fields, n = part[table], len(half.ids)
        hot: Dict[str, np.ndarray] = {IDS: half.ids.astype(np.int64),
                                      WEIGHT: half.weight.detach().float().cpu().numpy()}
        for key, value in fields.items():
            if key in hot or key == ITER:
                continue
            if key.startswith(META):
                hot[key] = np.full(n, top[table][key], dtype=np.int64)
            elif key in half.states:
                state = half.states[key].detach().float().cpu().numpy()
                if state.size != n * int(np.prod(value.shape[1:], dtype=np.int64)):
                    raise ValueError(f"raw-id table {table!r}: the hot rows' optimizer state {key!r} has shape "
                                     f"{state.shape}, the managed rows' {value.shape[1:]} per row")
                hot[key] = state.reshape((n,) + value.shape[1:])
            else:
                hot[key] = np.zeros((n,) + value.shape[1:], dtype=value.dtype)
        order = np.argsort(np.concatenate([fields[IDS], hot[IDS]]), kind="stable")
        for key, value in hot.items():
            fields[key] = np.concatenate([fields[key], value.astype(fields[key].dtype)])[order]


@torch.no_grad()
def take_hot_entries(entries: List[Dict[str, np.ndarray]], half: HotHalf) -> List[Dict[str, np.ndarray]]:
    """Writes the entries whose id is hot into ``half`` on every rank (a collective); returns the others.

    Each rank passes the entries of the parts it read; hot rows that no entry names keep their weight and start
    with a zero optimizer state.
    """
    mine, rest = [], []
    for e in entries:
        is_hot = np.isin(e[IDS], half.ids)
        mine.append({k: v[is_hot] for k, v in e.items() if k in (IDS, WEIGHT) or k in half.states})
        rest.append({k: (v if np.ndim(v) == 0 else v[~is_hot]) for k, v in e.items()})
    gathered: List[Optional[List[Dict[str, np.ndarray]]]] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    for state in half.states.values():
        state.zero_()
    for e in (e for part in gathered for e in (part or [])):
        if not len(e[IDS]):
            continue
        rows = torch.from_numpy(np.searchsorted(half.ids, e[IDS]))
        half.weight[rows.to(half.weight.device)] = torch.from_numpy(e[WEIGHT]).to(half.weight)
        for name, state in half.states.items():
            if name in e:
                state[rows.to(state.device)] = torch.from_numpy(e[name]).to(state).reshape(
                    (len(rows),) + tuple(state.shape[1:]))
    return rest


__all__ = ["HotHalf", "add_hot_entries", "hot_halves", "table_counters", "take_hot_entries", "top_metadata"]
