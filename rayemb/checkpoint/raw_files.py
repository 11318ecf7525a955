"""Raw-id tables in a checkpoint directory: every writing rank's part of them, one ``.npz`` file each.

A raw-id table's state is the set of ids it holds with their rows
(:mod:`rayemb.checkpoint.raw_state`); which rank held an id is not part of it.
So each rank of a saving job writes its part as it is, ``raw_ids.<rank>.npz``
(``np.savez``: arrays only, read back with ``allow_pickle=False``), beside the
DCP files; the files are listed in ``meta.json`` with their sizes and SHA-256
like every other file, and ``meta.json``'s ``tables`` names each raw table
with ``"ids": "raw"``, its capacity (``num_embeddings``), dim, eviction policy
and the ids it held (``held``).

Any world size loads them (:func:`load_raw_files`): rank ``r`` of ``W`` reads
the parts ``r, r + W, ...`` and :func:`~rayemb.checkpoint.raw_state.load_raw_tables`
sends every entry to the rank owning its key. ``rayemb checkpoint reshard``
rewrites them for its world size (:func:`reshard_raw_files`): part ``r`` then
holds exactly the ids rank ``r`` owns there. Inside a file, array ``T/K`` is
field ``K`` (``ids``, ``weight``, ``momentum1``, ``meta.counts``, ..., ``iter``)
of table ``T``.
"""

from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from rayemb.errors import DataError

if TYPE_CHECKING:
    from rayemb.checkpoint.raw_state import Part

logger = logging.getLogger(__name__)

#: a part's file name: the writing rank, zero-padded so that names sort by rank
PART_FILE = "raw_ids.{rank:05d}.npz"
_PART = re.compile(r"^raw_ids\.\d{5}\.npz$")
#: meta.json's marker of a raw-id table among ``tables``
RAW = "raw"


def part_files(names: Sequence[str]) -> List[str]:
    """The raw-id part files among ``names`` (e.g. meta.json's ``files``), in rank order."""
    return sorted(n for n in names if _PART.match(n))


def write_part(directory: str, rank: int, part: "Part") -> str:
    """Writes ``part`` (per table a dict of arrays) as ``directory``/``raw_ids.<rank>.npz``; returns the name."""
    name = PART_FILE.format(rank=rank)
    arrays = {f"{table}/{key}": np.asarray(value) for table, fields in part.items() for key, value in fields.items()}
    with open(os.path.join(directory, name), "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    return name


def read_part(path: str) -> "Part":
    """The part a file holds (arrays only: a file holding pickled objects is refused)."""
    out: "Part" = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for key in data.files:
                table, field = key.rsplit("/", 1)
                out.setdefault(table, {})[field] = data[key]
    except (OSError, ValueError) as e:
        raise DataError(f"Raw-id part {path!r} cannot be read ({type(e).__name__}: {e}); the checkpoint is damaged. "
                        "Use another checkpoint.", category="bad_checkpoint") from None
    return out


def save_raw_files(directory: str, model: Any, rank: int, model_state: Optional[Mapping[str, Any]] = None,
                   optimizer_state: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """This rank's part of the model's raw-id tables written to ``directory``: ``{"files": [name], "held":
    {table: ids}}``; ``{}`` when the model has none. With the model's and optimizer's state dicts (``"state"``),
    rank 0's part also holds the hybrid ones' hot rows (:mod:`rayemb.checkpoint.raw_hot`; then a collective)."""
    from rayemb.checkpoint.raw_hot import add_hot_entries, hot_halves, top_metadata
    from rayemb.checkpoint.raw_state import IDS, export_raw_tables  # TorchRec: where a model is

    part = export_raw_tables(model)
    hot = hot_halves(model, model_state, optimizer_state or {}) if model_state is not None else {}
    if hot:
        top = top_metadata(part, hot)
        if rank == 0:
            add_hot_entries(part, hot, top)
    if not part:
        return {}
    return {"files": [write_part(directory, rank, part)], "held": {t: int(len(v[IDS])) for t, v in part.items()}}


def raw_table_meta(tables: Mapping[str, Any], model: Any, held: Sequence[Mapping[str, int]]) -> Dict[str, Any]:
    """meta.json's ``tables`` entries of the raw-id tables: capacity, dim, fp32, eviction and ids held (every
    rank's ``held`` summed). ``tables``: name -> (capacity, dim), as the job gave them."""
    from rayemb.embedding.raw_tables import raw_id_modules

    mods = raw_id_modules(model)
    return {t: {"num_embeddings": int(tables[t][0]), "dim": int(tables[t][1]), "dtype": "fp32", "ids": RAW,
                "eviction": mods[t].policy, "held": int(sum(h.get(t, 0) for h in held))} for t in sorted(mods)}


def check_id_kinds(saved: Mapping[str, Any], raw: Sequence[str], where: str) -> None:
    """:class:`DataError` (``bad_checkpoint``) when a table holds raw ids in the checkpoint ``saved`` (meta.json's
    ``tables``) but not in the job (its ``raw`` tables), or the other way round."""
    for name, entry in sorted(saved.items()):
        if ((entry or {}).get("ids") == RAW) != (name in raw):
            job, ckpt = ("raw", "encoded") if name in raw else ("encoded", "raw")
            raise DataError(f"Checkpoint {where!r} holds table {name!r} with {ckpt} ids; this job's schema gives it "
                            f"{job} ids (`ids:` in schema.yaml). Resume or export with the schema the checkpoint was "
                            "trained with, or start fresh.", category="bad_checkpoint")


def rank_parts(directory: str, meta: Mapping[str, Any], model: Any = None,
               model_state: Optional[Mapping[str, Any]] = None, optimizer_state: Optional[Mapping[str, Any]] = None
               ) -> List["Part"]:
    """The raw-id parts this rank loads: parts ``r, r + W, ...`` for rank ``r`` of ``W``.

    With the ``model`` and its model's and optimizer's state dicts (``"state"``; a collective) the entries whose
    ids are hot in a hybrid table (:mod:`rayemb.checkpoint.raw_hot`) are written into its hot rows on every rank,
    in those state dicts' tensors, and left out of the parts returned.
    """
    import torch.distributed as dist

    from rayemb.checkpoint.raw_hot import hot_halves, take_hot_entries

    files = part_files(meta.get("files", {}))
    parts = [read_part(os.path.join(directory, n)) for n in files[dist.get_rank()::dist.get_world_size()]]
    hot = hot_halves(model, model_state, optimizer_state or {}) if model_state is not None else {}
    for table in sorted(hot):  # every rank, in one order: a collective per table
        having = [p for p in parts if table in p]
        for p, rest in zip(having, take_hot_entries([p[table] for p in having], hot[table])):
            p[table] = rest
    return parts


def load_raw_files(directory: str, meta: Mapping[str, Any], model: Any, parts: Optional[List["Part"]] = None
                   ) -> Dict[str, int]:
    """Loads the checkpoint's raw-id tables into the sharded ``model`` (a collective; any world size).

    Each rank loads its :func:`rank_parts` (or ``parts``, those left by the hot rows). Returns the ids dropped
    per table (shards of this world holding fewer ids than were saved), logged when any were.
    """
    import torch.distributed as dist

    from rayemb.checkpoint.raw_state import load_raw_tables

    rank, world = dist.get_rank(), dist.get_world_size()
    parts = rank_parts(directory, meta) if parts is None else parts
    dropped = load_raw_tables(model, parts)
    if rank == 0 and any(dropped.values()):
        logger.warning("checkpoint %s: the raw-id tables' shards hold fewer ids on %d ranks than were saved; "
                       "dropped by their eviction policy: %s", directory, world, dropped)
    return dropped


def reshard_raw_files(src: str, out: str, meta: Mapping[str, Any], rank: int, world: int) -> List[str]:
    """Rank ``rank``'s part of the raw-id tables of checkpoint ``src`` for ``world`` ranks, written to ``out``: the
    ids whose key it owns there ([] without raw-id tables). Reads every part."""
    from rayemb.checkpoint.raw_state import IDS, merge_parts
    from rayemb.embedding.raw_ids import raw_ids_to_keys
    from rayemb.embedding.raw_tables import key_owner

    files = part_files(meta.get("files", {}))
    if not files:
        return []
    merged = merge_parts([read_part(os.path.join(src, n)) for n in files])
    mine: "Part" = {}
    for table, fields in merged.items():
        keep = key_owner(raw_ids_to_keys(fields[IDS]), world) == rank
        mine[table] = {k: (v if v.ndim == 0 else v[keep]) for k, v in fields.items()}
    return [write_part(out, rank, mine)]


def raw_tables_of(directory: str, meta: Mapping[str, Any]) -> "Part":
    """The whole raw-id tables of a checkpoint (every part merged: ids ascending), without a process group."""
    from rayemb.checkpoint.raw_state import merge_parts

    return merge_parts([read_part(os.path.join(directory, n)) for n in part_files(meta.get("files", {}))])


__all__ = ["PART_FILE", "RAW", "check_id_kinds", "load_raw_files", "part_files", "rank_parts", "raw_table_meta",
           "raw_tables_of", "read_part", "reshard_raw_files", "save_raw_files", "write_part"]
