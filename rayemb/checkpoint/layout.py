"""Where each logical table row lives in a live sharded model: the *slots* of a rank.

A rayemb model holds every embedding table of the schema in one of several
forms: a plain ``EmbeddingBagCollection`` table sharded table-, row- or
column-wise (TorchRec ``ShardedTensor``), a data-parallel table (a plain
tensor, the same on every rank), or a hybrid table split into a replicated hot
half and a cold half (an ``EmbeddingCollection`` table, sharded) whose rows are
the table's hot ids and cold ids in sorted order
(:class:`~rayemb.embedding.remap.HybridRemapper`). The optimizer state follows
its parameter: FBGEMM's fused state (``<table>.momentum1``; for row-wise
Adagrad one value per row and *per column shard*) or a regular optimizer's
(``sum`` of TorchRec's ``RowWiseAdagrad``, ``[rows, 1]``).

:func:`model_slots` turns all of that into one list of :class:`Slot`: a local
tensor (a view of the live weight or state, written in place on load) plus the
logical row ids it holds, its first column and width. Everything downstream
(:mod:`rayemb.checkpoint.exchange`) works on slots only, so a new placement
is a new slot source, not a new checkpoint format.

Logical state names: ``weight`` (``[V, D]``), ``momentum1`` (the
accumulator of Adagrad-type optimizers, Adam's first moment: ``[V]`` for row-wise, ``[V, D]`` for
element-wise) and ``momentum2`` (Adam's second moment, ``[V]`` or ``[V, D]``). Row-wise state of
column-wise shards is combined as the width-weighted mean over the shards (exactly the row's value when the shards
agree, so a save → load → save round trip is bit-exact).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch

from rayemb.embedding.compression_math import BLOCK_SUFFIX, QR_QUOTIENT_SUFFIX, QR_REMAINDER_SUFFIX
from rayemb.embedding.remap import COLD_SUFFIX, HOT_SUFFIX

#: logical state names a checkpoint may hold per table
WEIGHT = "weight"
MOMENTUM = "momentum1"
#: Adam's second moment (FBGEMM ``momentum2``, torch ``exp_avg_sq``): ``[V]`` row-wise or ``[V, D]``
MOMENTUM2 = "momentum2"

_PLAIN_OR_HOT = re.compile(r"(?:^|\.)(plain|hot)(?:\.bags)?\.embedding_bags\.([^.]+)\.weight$")
_COLD = re.compile(r"(?:^|\.)cold\.d\d+\.embeddings\.([^.]+)\.weight$")
#: whole tables looked up per id: compressed QR-mult rows (sharded ``rows.d<n>``, data-parallel
#: ``replicated``) and the DLRM's sequence-feature EmbeddingCollection (``sequence``)
_ROWS = re.compile(r"(?:^|\.)(?:plain\.rows\.d\d+|plain\.replicated|sequence)\.embeddings\.([^.]+)\.weight$")
#: optimizer state names that mean the Adagrad accumulator or Adam's first moment (FBGEMM fused / torch and
#: TorchRec optimizers)
_MOMENTUM_NAMES = ("momentum1", "sum", "exp_avg")
#: optimizer state names that mean Adam's second moment
_MOMENTUM2_NAMES = ("momentum2", "exp_avg_sq")
#: the state of raw-id tables: TorchRec's managed-collision EBC holds its tables and id->slot modules under
#: these children; checkpoints keep it in the world-size-free form of rayemb.checkpoint.raw_state instead
_RAW = re.compile(r"(?:^|\.)(?:_embedding_module|_managed_collision_collection)\.")


def is_momentum_state(name: str) -> bool:
    """Whether an optimizer state name (``momentum1``, ``sum``, or a key ending in one) is the Adagrad
    accumulator a checkpoint stores as ``momentum1``; other states (``step``) are not table rows."""
    return name.rsplit(".", 1)[-1] in _MOMENTUM_NAMES


def logical_state(name: str) -> Optional[str]:
    """The logical state (:data:`MOMENTUM`, :data:`MOMENTUM2`) an optimizer state name is checkpointed as;
    None for states that are not table rows (``step``)."""
    last = name.rsplit(".", 1)[-1]
    return MOMENTUM if last in _MOMENTUM_NAMES else MOMENTUM2 if last in _MOMENTUM2_NAMES else None


def raw_table_key(key: str) -> bool:
    """Whether a state-dict (or optimizer-state) key belongs to a raw-id table (neither slots nor dense)."""
    return _RAW.search(key) is not None


@dataclass
class Slot:
    """Rows of one logical table's state held by this rank, in one local tensor."""

    table: str
    state: str  # WEIGHT, MOMENTUM or MOMENTUM2
    tensor: torch.Tensor  # [n, width] (weight, element-wise state) or [n] / [n, 1] (row-wise state)
    rows: Union[torch.Tensor, RowRange]  # int64 [n]: logical row id of each local row
    col0: int
    width: int
    #: the same rows are on every rank (data-parallel table, hybrid hot half)
    replicated: bool

    @property
    def rowwise(self) -> bool:
        return self.state != WEIGHT and (self.tensor.dim() == 1 or self.tensor.shape[-1] == 1) and self.width > 1


def embedding_key(key: str) -> Optional[Tuple[str, str]]:
    """(part, logical table) of a state-dict key of an embedding weight: part is plain, hot or cold; else None.

    Compressed tables are checkpointed as the tables they are stored in
    (``T__q``, ``T__r``, ``T__block``: part plain, their own row spaces);
    block projections are dense parameters (``None`` here).
    """
    m = _PLAIN_OR_HOT.search(key)
    if m:
        part, table = m.group(1), m.group(2)
        return part, table.removesuffix(HOT_SUFFIX) if part == "hot" else table
    m = _COLD.search(key)
    if m:
        return "cold", m.group(1).removesuffix(COLD_SUFFIX)
    m = _ROWS.search(key)
    if m:
        return "plain", m.group(1)
    return None


def stored_tables(tables: Mapping[str, Tuple[int, int]], model_state: Mapping[str, Any]) -> Dict[str, Tuple[int, int]]:
    """The checkpoint's tables: ``tables`` (logical name -> (rows, dim)) with compressed ones replaced by their parts.

    A table the model stores compressed has no ``name`` weight but ``name__q``
    and ``name__r`` (QR) or ``name__block``: those are checkpointed as tables
    of their own, with the global shapes the model holds them in.
    """
    live: Dict[str, Tuple[int, int]] = {}
    for key, value in model_state.items():
        parsed = embedding_key(key)
        if parsed is not None:
            size = tuple(value.size())
            live[parsed[1]] = (int(size[0]), int(size[1]))
    out: Dict[str, Tuple[int, int]] = {}
    for name, shape in tables.items():
        parts = {name + s: live[name + s] for s in (QR_QUOTIENT_SUFFIX, QR_REMAINDER_SUFFIX, BLOCK_SUFFIX)
                 if name + s in live}
        if name not in live and parts:
            out.update(parts)
        else:
            out[name] = shape
    return out


#: a table's stored dtype as meta.json names it
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def table_dtypes(model_state: Mapping[str, Any]) -> Dict[str, torch.dtype]:
    """Table (a compressed one's parts by their own names) -> the dtype of its weight in the live model.

    Every rank's state dict has every table (a ShardedTensor without local shards has its dtype too), so the
    ranks agree; a hybrid table's halves share their logical table's dtype.
    """
    return {parsed[1]: value.dtype for key, value in model_state.items() if (parsed := embedding_key(key))}


def _row_map(part: str, table: str, remapper: Any) -> Optional[np.ndarray]:
    """Logical id of each row of the half (None: the identity, a plain table)."""
    if part == "hot":
        return remapper.hot_ids(table)
    if part == "cold":
        return remapper.cold_ids(table)
    return None


@dataclass(frozen=True)
class RowRange:
    """Logical rows ``[start, start+count)`` of a slot, made a slice at a time: a whole shard's ids would be
    8 bytes a row of anonymous memory, held through a save or a load."""

    start: int
    count: int

    def numel(self) -> int:
        return self.count

    def __getitem__(self, part: slice) -> torch.Tensor:
        lo, hi, step = part.indices(self.count)
        return torch.arange(self.start + lo, self.start + max(lo, hi), step, dtype=torch.int64)


def _rows(mapping: Optional[np.ndarray], start: int, count: int) -> Union[torch.Tensor, RowRange]:
    if mapping is None:
        return RowRange(start, count)
    return torch.from_numpy(np.ascontiguousarray(mapping[start:start + count], dtype=np.int64))


def _local_pieces(value: Any) -> Tuple[List[Tuple[torch.Tensor, List[int], List[int]]], bool]:
    """[(tensor, offsets, sizes)] of a state-dict value and whether it is replicated (a plain tensor)."""
    if hasattr(value, "local_shards"):
        return [(s.tensor, list(s.metadata.shard_offsets), list(s.metadata.shard_sizes))
                for s in value.local_shards()], False
    t = value.detach() if isinstance(value, torch.Tensor) else value
    return [(t, [0] * t.dim(), list(t.shape))], True


def model_slots(model_state: Mapping[str, Any], optimizer_state: Mapping[str, Mapping[str, Any]],
                remapper: Any) -> List[Slot]:
    """Every slot of this rank: weights from ``model.state_dict()``, states from ``optimizer.state_dict()["state"]``.

    Raises :class:`ValueError` when a fused state's local shards do not pair
    with its weight's (a TorchRec layout this code does not know).
    """
    slots: List[Slot] = []
    weight_pieces: Dict[str, List[Tuple[torch.Tensor, List[int], List[int]]]] = {}
    for key, value in model_state.items():
        parsed = embedding_key(key)
        if parsed is None:
            continue
        part, table = parsed
        if part == "hot" and getattr(remapper, "is_raw", None) and remapper.is_raw(table):
            continue  # a raw-id table's hot rows are entries of its raw-id part (rayemb.checkpoint.raw_hot)
        mapping = _row_map(part, table, remapper)
        pieces, replicated = _local_pieces(value)
        weight_pieces[key] = pieces
        for tensor, (r0, c0), (nr, nc) in pieces:
            slots.append(Slot(table, WEIGHT, tensor, _rows(mapping, r0, nr), int(c0), int(nc), replicated))
        for name, state in optimizer_state.get(key, {}).items():
            logical = logical_state(name)
            if logical is None:
                continue  # "step" counters: restored from the checkpoint's step
            state_pieces, state_replicated = _local_pieces(state)
            if len(state_pieces) != len(pieces):
                raise ValueError(f"{key}: {len(state_pieces)} local shards of optimizer state {name!r} "
                                 f"for {len(pieces)} weight shards")
            for (tensor, _, _), (_, (r0, c0), (nr, nc)) in zip(state_pieces, pieces):
                if tensor.shape[0] != nr:
                    raise ValueError(f"{key}: optimizer state {name!r} shard of {tensor.shape[0]} rows pairs "
                                     f"with a weight shard of {nr} rows")
                slots.append(Slot(table, logical, tensor, _rows(mapping, r0, nr), int(c0), int(nc),
                                  state_replicated))
    return slots


def dense_entries(model_state: Mapping[str, Any], optimizer_state: Mapping[str, Mapping[str, Any]]
                  ) -> Dict[str, torch.Tensor]:
    """The model's non-embedding tensors and their optimizer state, replicated on every rank (raw-id tables
    excluded: :mod:`rayemb.checkpoint.raw_state`).

    Keys ``dense.<param>`` and ``dense_optim.<param>.<state>``; tensors are the live ones.
    """
    out: Dict[str, torch.Tensor] = {}
    for key, value in model_state.items():
        if embedding_key(key) is None and not raw_table_key(key) and isinstance(value, torch.Tensor):
            out[f"dense.{key}"] = value
    for key, states in optimizer_state.items():
        if embedding_key(key) is not None or raw_table_key(key):
            continue
        for name, value in states.items():
            if isinstance(value, torch.Tensor):
                out[f"dense_optim.{key}.{name}"] = value
    return out


def set_step_counters(optimizer_state: Mapping[str, Mapping[str, Any]], step: int) -> None:
    """Sets every embedding optimizer ``step`` counter (replicated halves) to the checkpoint's step."""
    for key, states in optimizer_state.items():
        if embedding_key(key) is None:
            continue
        for name, value in states.items():
            if name == "step" and isinstance(value, torch.Tensor):
                value.fill_(float(step))


def set_kernel_iterations(optimizer: Any, step: int) -> None:
    """Sets the iteration counter of every FBGEMM Adam kernel under ``optimizer`` (TorchRec's fused optimizers,
    nested in a ``CombinedOptimizer``) to the checkpoint's step: Adam's bias correction reads it, and TorchRec's
    fused state (the two moments) does not hold it."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    stack, seen = [optimizer], set()
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        stack.extend(inner for _, inner in getattr(o, "optimizers", []))
        tbe = getattr(o, "_emb_module", None)
        if getattr(tbe, "optimizer", None) in (EmbOptimType.ADAM, EmbOptimType.PARTIAL_ROWWISE_ADAM):
            tbe.iter.fill_(int(step))
            tbe.iter_cpu.fill_(int(step))


__all__ = ["DTYPE_NAMES", "MOMENTUM", "MOMENTUM2", "Slot", "WEIGHT", "dense_entries", "embedding_key",
           "is_momentum_state", "logical_state", "model_slots", "raw_table_key", "set_kernel_iterations",
           "set_step_counters", "stored_tables", "table_dtypes"]
