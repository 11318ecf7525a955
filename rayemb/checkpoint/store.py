"""Plan-independent checkpoints: every table in its logical row space, in ``torch.distributed.checkpoint`` format.

A checkpoint directory holds

* DCP files (``.metadata`` + ``__<rank>_0.distcp``): ``tables.<t>.weight``
  ``[V, D]`` in the table's stored dtype (fp16 for ``model.embedding_dtype:
  fp16``), ``tables.<t>.momentum1`` (fp32, ``[V]`` row-wise / ``[V, D]``) as
  row-sharded tensors in the canonical layout of the writing world
  (:mod:`rayemb.checkpoint.exchange`), ``dense.<param>`` and
  ``dense_optim.<param>.<state>`` (replicated; DCP keeps one copy);
* ``meta.json``, written last by rank 0: format, world size, plan fingerprint
  and placements, tables (rows, dim, stored ``dtype``: fp32 / fp16), epoch /
  step / position in the epoch, every rank's RNG state, and the size and SHA-256 of every file. A
  directory without a ``meta.json`` whose files match it is not a checkpoint
  (a crash mid-write leaves nothing that looks complete);
* ``raw_ids.<rank>.npz``: each rank's part of the raw-id tables (the ids each
  holds with their rows, :mod:`rayemb.checkpoint.raw_files`), loadable into
  any world size; ``meta.json`` names those tables with ``"ids": "raw"``.

Loading (:func:`load_logical`) reads the canonical rows of the *loading*
world (any world size: the stored pieces overlapping them) and scatters them
into the live model's slots (:mod:`rayemb.checkpoint.layout`: any plan, hybrid
or not), each row cast to the live table's dtype (fp32 rows into fp16 tables
round to nearest, fp16 rows into fp32 tables widen exactly). DCP's
``.metadata`` is a pickle: it is read by :mod:`rayemb.checkpoint.safe_reader`,
which resolves only the classes DCP metadata holds; tensors are described with
``torch.load(weights_only=True)``, ``meta.json`` is JSON.

Host memory: a save gathers the rank's canonical share into memory-mapped
files beside ``directory`` (:mod:`rayemb.checkpoint.staging`) and one
``dcp.save`` writes it from there; a load maps the stored table pieces
(:mod:`rayemb.checkpoint.mapped`) instead of reading them whole. Either way the
anonymous memory a rank adds is the exchange's rounds (a few times
``chunk_mib``), whatever the size of the tables; the rest is page cache.

Reading one without a process group (its meta.json, :func:`~rayemb.checkpoint.reader.verify`,
its tensors, on local or remote storage) is :mod:`rayemb.checkpoint.reader`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist

from rayemb.checkpoint.exchange import Allocator, gather_canonical, row_range, scatter_canonical
from rayemb.checkpoint.layout import (DTYPE_NAMES, MOMENTUM, MOMENTUM2, WEIGHT, Slot, dense_entries, model_slots,
                                      set_kernel_iterations, set_step_counters, stored_tables, table_dtypes)
from rayemb.checkpoint.mapped import mapped_rows
from rayemb.checkpoint.meta import CheckpointMeta
from rayemb.checkpoint.reader import FORMAT, META_FILE, verify
from rayemb.checkpoint.safe_reader import DCP_METADATA, SafeFileSystemReader
from rayemb.checkpoint.staging import Staging
from rayemb.errors import DataError

logger = logging.getLogger(__name__)

#: MiB of rows a rank sends in one round of a save's or load's exchange (``train.checkpoint_chunk_mib``)
DEFAULT_CHUNK_MIB = 64


def table_key(table: str, state: str) -> str:
    return f"tables.{table}.{state}"


def _row_sharded(chunk: torch.Tensor, num_rows: int, rank: int, world: int) -> Any:
    """A ShardedTensor of global rows ``num_rows`` whose local shard is this rank's canonical ``chunk``."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

    lo, hi = row_range(num_rows, rank, world)
    tail = list(chunk.shape[1:])
    shards = []
    if hi > lo:
        meta = ShardMetadata(shard_offsets=[lo] + [0] * len(tail), shard_sizes=[hi - lo] + tail,
                             placement=f"rank:{rank}/cpu")
        shards.append(Shard(chunk.contiguous(), meta))
    return init_from_local_shards(shards, num_rows, *tail)


def _has_state(slots: List[Any], state: str) -> bool:
    flag = torch.tensor([1 if any(s.state == state for s in slots) else 0], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _chunk_bytes(chunk_mib: Optional[float]) -> Optional[int]:
    return None if chunk_mib is None else max(1, int(chunk_mib * 2**20))


def _rng_state() -> str:
    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _file_digests(directory: str, names: List[str]) -> Dict[str, Dict[str, Any]]:
    return {n: {"bytes": os.path.getsize(os.path.join(directory, n)), "sha256": _sha256(os.path.join(directory, n))}
            for n in names}


def save_logical(directory: str, model: Any, optimizer: Any, remapper: Any,
                 tables: Mapping[str, Tuple[int, int]], meta: Mapping[str, Any],
                 chunk_mib: Optional[float] = DEFAULT_CHUNK_MIB) -> Dict[str, Any]:
    """Writes this rank's part of a logical checkpoint into ``directory`` (a collective; every rank calls it).

    ``directory`` may be local to each rank (Ray Train merges the ranks' directories)
    or shared. ``tables``: name -> (num_embeddings, dim) of every table (a raw-id
    table's: its capacity; its ids and rows go to ``raw_ids.<rank>.npz``). ``meta``: epoch, step,
    position and bookkeeping to record. ``chunk_mib``: the most MiB of rows a rank sends
    in one round of the exchange (``train.checkpoint_chunk_mib``; None: all at once); the
    files do not depend on it. The rank's canonical rows are staged in memory-mapped files
    beside ``directory`` (:class:`~rayemb.checkpoint.staging.Staging`: local disk of about the
    rank's share of the table state), removed before this returns or raises.
    Rank 0 writes ``meta.json`` last and returns it (other ranks return ``{}``).
    """
    from rayemb.checkpoint.raw_files import raw_table_meta, save_raw_files

    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(directory, exist_ok=True)
    model_state = model.state_dict()
    optim_state = optimizer.state_dict()["state"]
    # the raw-id tables: ids and their rows (hot ones too), not rows of [V, D]
    raw = save_raw_files(directory, model, rank, model_state, optim_state)
    given, tables = tables, stored_tables(_encoded(tables, model), model_state)
    dtypes = table_dtypes(model_state)
    slots = model_slots(model_state, optim_state, remapper)
    states = [WEIGHT] + [s for s in (MOMENTUM, MOMENTUM2) if _has_state(slots, s)]
    dense = {key: value.detach().cpu() for key, value in dense_entries(model_state, optim_state).items()}
    with Staging(directory, rank) as staging:
        _write_tensors(directory, _canonical_state(slots, tables, states, dtypes, _chunk_bytes(chunk_mib),
                                                   staging.zeros), dense)
    compression = model_compression(model)
    mine = [n for n in os.listdir(directory) if n.startswith(f"__{rank}_") and n.endswith(".distcp")]
    if rank == 0:
        mine.append(DCP_METADATA)
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, {"files": _file_digests(directory, mine + raw.get("files", [])),
                                      "rng": _rng_state(), "held": raw.get("held", {})})
    if rank != 0:
        return {}
    doc = {
        **dict(meta), "format": FORMAT, "world_size": world,
        "tables": {**{t: {"num_embeddings": int(v), "dim": int(d), "dtype": DTYPE_NAMES[dtypes[t]]}
                      for t, (v, d) in sorted(tables.items())},
                   **(raw_table_meta(given, model, [g["held"] for g in gathered]) if raw else {})},
        "states": states, "rng": [g["rng"] for g in gathered],
        **({"compression": compression} if compression else {}),
        "files": {n: info for g in gathered for n, info in g["files"].items()},
    }
    tmp = os.path.join(directory, META_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, META_FILE))
    return doc


def _write_tensors(directory: str, state: Dict[str, Any], dense: Mapping[str, torch.Tensor]) -> None:
    """One ``dcp.save`` of the canonical ``state`` and the ``dense`` entries; it holds the last reference to ``state``.

    (So the staged tensors, and the blocks of their files, go when it returns, and when it raises once
    :class:`Staging` has cleared the failed frames.)
    """
    import torch.distributed.checkpoint as dcp

    state.update(dense)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(directory, sync_files=True))


def _canonical_state(slots: List[Slot], tables: Mapping[str, Tuple[int, int]], states: List[str],
                     dtypes: Mapping[str, torch.dtype], chunk_bytes: Optional[int], zeros: Allocator
                     ) -> Dict[str, Any]:
    """``tables.<t>.<state>`` -> this rank's canonical rows of every table as a row-sharded tensor (a collective)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    state: Dict[str, Any] = {}
    for name in states:  # rows travel as fp32, which holds fp16 rows exactly: stored as the table is
        gathered = gather_canonical(slots, tables, name, dtypes if name == WEIGHT else None, chunk_bytes, zeros)
        for table in sorted(gathered):
            state[table_key(table, name)] = _row_sharded(gathered.pop(table), tables[table][0], rank, world)
    return state


def _encoded(tables: Mapping[str, Tuple[int, int]], model: Any) -> Dict[str, Tuple[int, int]]:
    """``tables`` less the model's raw-id tables (those are saved by :mod:`rayemb.checkpoint.raw_files`)."""
    from rayemb.embedding.raw_tables import raw_id_modules

    raw = raw_id_modules(model)
    return {t: v for t, v in tables.items() if t not in raw}


def model_compression(model: Any) -> Dict[str, Dict[str, Any]]:
    """Compressed table -> its storage (``compression``, ``buckets``, ``combine``, ``block_dim``) in ``model``.

    Recorded in meta.json so a checkpoint says how its physical tables
    (``T__q``, ``T__r``, ``T__block``) make the logical ones: ``rayemb export``
    builds the same compressed model from it.
    """
    from rayemb.embedding.compressed import CompressedEmbeddingBagCollection
    from rayemb.embedding.compression_math import spec_storage

    out: Dict[str, Dict[str, Any]] = {}
    for m in model.modules():
        if isinstance(m, CompressedEmbeddingBagCollection):
            rows = {t.name: int(t.num_embeddings) for t in m.embedding_bag_configs()}
            out.update({t: spec_storage(s, rows[t]) for t, s in m.compression().items() if s.compressed})
    return out


def load_logical(directory: str, model: Any, optimizer: Any, remapper: Any,
                 tables: Mapping[str, Tuple[int, int]], meta: Optional[Mapping[str, Any]] = None,
                 chunk_mib: Optional[float] = DEFAULT_CHUNK_MIB) -> Dict[str, Any]:
    """Loads a logical checkpoint into the live model and optimizer of any plan and world size (a collective).

    Tables must have the same rows and dim as in the checkpoint (a
    :class:`DataError` names the first that does not). One table's state is
    read at a time from the memory-mapped files (:func:`~rayemb.checkpoint.mapped.mapped_rows`),
    its rows sent to the slots in rounds of at most ``chunk_mib`` MiB a rank
    (None: all at once). ``directory`` is local and checked first
    (:func:`verify`, sizes; a resume checks hashes too). Restores this rank's
    RNG state when the world size is the one that wrote it. Returns ``meta.json``.
    """
    import torch.distributed.checkpoint as dcp

    from rayemb.checkpoint.raw_files import check_id_kinds, load_raw_files, rank_parts
    from rayemb.embedding.raw_tables import raw_id_modules

    meta = dict(meta) if meta is not None else verify(directory, hashes=False)
    raw = raw_id_modules(model)
    check_id_kinds({t: e for t, e in meta["tables"].items() if t in tables}, list(raw), directory)
    reader = SafeFileSystemReader(directory)
    metadata = reader.metadata()  # a refused .metadata fails here, not wrapped by DCP
    rank, world = dist.get_rank(), dist.get_world_size()
    saved_tables = meta["tables"]
    model_state = model.state_dict()
    for name in raw:  # a raw-id table's capacity and dim, as an encoded table's rows and dim
        _same_shape(directory, name, saved_tables.get(name), tables[name])
    tables = stored_tables({t: v for t, v in tables.items() if t not in raw}, model_state)
    for name, (rows, dim) in sorted(tables.items()):
        _same_shape(directory, name, saved_tables.get(name), (rows, dim))
    live_dtypes = table_dtypes(model_state)
    cast = sorted(t for t in tables if saved_tables[t].get("dtype", "fp32") != DTYPE_NAMES[live_dtypes[t]])
    if cast:
        logger.info("checkpoint %s: tables %s stored as %s load into %s tables (rows cast)", directory, cast[:5],
                    saved_tables[cast[0]].get("dtype", "fp32"), DTYPE_NAMES[live_dtypes[cast[0]]])
    optim_state = optimizer.state_dict()
    slots = model_slots(model_state, optim_state["state"], remapper)
    states = [s for s in meta.get("states", [WEIGHT]) if s in (WEIGHT, MOMENTUM, MOMENTUM2)]
    if MOMENTUM not in states and _has_state(slots, MOMENTUM):
        logger.warning("checkpoint %s holds no optimizer state for the tables; they start with fresh state",
                       directory)
    rowwise = {(s.state, s.table): s.rowwise for s in slots if s.state != WEIGHT}
    for name in states:  # one table's state at a time; every rank in the same order
        for table, (rows, _dim) in sorted(tables.items()):
            lo, hi = row_range(rows, rank, world)
            # read in the stored dtype; the slots cast (exchange.scatter_canonical); row-wise saved state
            # gives element-wise live slots every column its row's value there too
            canonical = mapped_rows(directory, metadata, table_key(table, name), lo, hi)
            if name != WEIGHT and canonical.dim() == 2 and rowwise.get((name, table)):
                canonical = canonical.reduced(_row_mean)  # element-wise saved, row-wise live
            scatter_canonical(slots, {table: canonical}, tables, name, _chunk_bytes(chunk_mib))
    request = {k: v.detach().cpu().clone() for k, v in dense_entries(model_state, optim_state["state"]).items()}
    dcp.load(request, storage_reader=reader)
    live_dense = dense_entries(model_state, optim_state["state"])
    with torch.no_grad():
        for key, value in live_dense.items():
            value.copy_(request[key].to(value.device))
    # a hybrid raw-id table's hot rows are replicated state: written with the state dicts
    raw_parts = rank_parts(directory, meta, model, model_state, optim_state["state"]) if raw else []
    set_step_counters(optim_state["state"], CheckpointMeta.from_dict(meta, shown=directory).step)
    set_kernel_iterations(optimizer, CheckpointMeta.from_dict(meta, shown=directory).step)
    model.load_state_dict(model_state)
    optimizer.load_state_dict(optim_state)
    if raw:  # after the state dicts: the raw tables' slots and rows are written in place
        load_raw_files(directory, meta, model, raw_parts)
    if int(meta.get("world_size", -1)) == world and meta.get("rng"):
        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(meta["rng"][rank])), dtype=torch.uint8))
    return dict(meta)


def _same_shape(directory: str, name: str, got: Optional[Mapping[str, Any]], shape: Tuple[int, int]) -> None:
    rows, dim = shape
    if got is None or (int(got["num_embeddings"]), int(got["dim"])) != (int(rows), int(dim)):
        raise DataError(
            f"Checkpoint {directory!r} has table {name!r} as {got} ; this job has {rows} rows x {dim} dims. "
            "Resume with the same schema, model.embedding_dim and table compression, or start fresh.",
            category="bad_checkpoint")


def _row_mean(rows: torch.Tensor) -> torch.Tensor:
    return rows.mean(dim=1)


__all__ = ["DEFAULT_CHUNK_MIB", "load_logical", "model_compression", "save_logical", "table_key"]
