"""``rayemb checkpoint export`` and ``reshard``: a logical checkpoint as one unsharded file, or for another world.

:func:`export_checkpoint` writes one ``torch.save`` file of plain tensors
(loadable with ``torch.load(path, weights_only=True)``)::

    {"tables": {name: {"weight": [V, D], "momentum1": [V] or [V, D]}},
     "raw_tables": {name: {"ids": [n] int64, "weight": [n, D], "momentum1": ..., "meta.counts": ..., "iter": []}},
     "dense": {param: tensor}, "dense_optim": {param: {state: tensor}},
     "meta": {format, epoch, step, world_size, ...}}

(``raw_tables``: the raw-id tables, the ids each holds ascending with their
rows, :mod:`rayemb.checkpoint.raw_state`; empty without raw-id features.)

— the form a user takes to inference. :func:`reshard_checkpoint` rewrites a
checkpoint in the canonical layout of ``world_size`` ranks (real gloo ranks
on 127.0.0.1, each reading exactly its rows, as a job of that size would).
``export(reshard(C, W))`` equals ``export(C)`` bit for bit.

Checkpoints and outputs may be URIs (``s3://bucket/runs/ray_results/<job>/checkpoint_...``,
:mod:`rayemb.storage`): a remote checkpoint is downloaded to a temporary
directory for the duration of the call, a remote output written locally and
uploaded when complete::

    >>> export_checkpoint("s3://bucket/runs/ray_results/job/checkpoint_000001", "model.pt")
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, Optional

import torch

from rayemb import storage
from rayemb.checkpoint.meta import CheckpointMeta
from rayemb.checkpoint.safe_reader import SafeFileSystemReader
from rayemb.checkpoint.reader import META_FILE, read_unsharded, verify
from rayemb.errors import DataError
from rayemb.logs import redact_uri

#: meta.json entries that describe the writing job, copied into an export: the store's ...
_EXPORT_STORE_META = ("format", "world_size", "tables", "states")
#: ... and the training's (:class:`~rayemb.checkpoint.meta.CheckpointMeta`)
_EXPORT_TRAINING_META = ("epoch", "step", "plan_fingerprint", "placements")


def _export_meta(meta: Dict[str, Any], shown: str) -> Dict[str, Any]:
    written = CheckpointMeta.from_dict(meta, shown=f"Checkpoint {shown!r}").to_dict()
    return {**{k: meta[k] for k in _EXPORT_STORE_META if k in meta},
            **{k: written[k] for k in _EXPORT_TRAINING_META if k in written}}


def unsharded_state(directory: str, shown: Optional[str] = None) -> Dict[str, Any]:
    """The checkpoint as nested plain tensors (see the module doc); checks sizes and hashes first.

    ``shown``: the name messages use for ``directory`` (the URI a local copy came from).
    """
    if storage.is_remote(directory):
        verify(directory, hashes=False)  # a missing checkpoint is named by its URI, before any download
        with storage.local_copy(directory, prefix="rayemb-export-") as local:
            return unsharded_state(local, shown=directory)
    meta = verify(directory, shown=shown)
    flat = read_unsharded(directory, shown=shown)
    from rayemb.checkpoint.raw_files import RAW, raw_tables_of

    out: Dict[str, Any] = {"tables": {}, "dense": {}, "dense_optim": {},
                           "meta": _export_meta(meta, redact_uri(shown or directory)),
                           "raw_tables": {t: {k: torch.from_numpy(v) for k, v in fields.items()}
                                          for t, fields in raw_tables_of(directory, meta).items()}}
    for key, value in sorted(flat.items()):
        kind, rest = key.split(".", 1)
        if kind == "tables":
            table, state = rest.rsplit(".", 1)
            out["tables"].setdefault(table, {})[state] = value
        elif kind == "dense":
            out["dense"][rest] = value
        elif kind == "dense_optim":
            param, state = rest.rsplit(".", 1)
            out["dense_optim"].setdefault(param, {})[state] = value
    missing = sorted({t for t, e in meta["tables"].items() if e.get("ids") != RAW} - set(out["tables"]))
    if missing:
        raise DataError(f"Checkpoint {redact_uri(directory)!r} lists tables {missing[:5]} that its files do not hold.",
                        category="bad_checkpoint")
    return out


def export_checkpoint(directory: str, out_file: str) -> Dict[str, Any]:
    """Writes :func:`unsharded_state` of ``directory`` to ``out_file`` atomically; returns a summary."""
    state = unsharded_state(directory)
    if storage.is_remote(out_file):
        with storage.local_output(out_file) as local:
            torch.save(state, local)
            size = os.path.getsize(local)
        return {"out": redact_uri(out_file), "tables": len(state["tables"]) + len(state["raw_tables"]),
                "dense_tensors": len(state["dense"]),
                "bytes": size, "step": state["meta"].get("step")}
    os.makedirs(os.path.dirname(os.path.abspath(out_file)) or ".", exist_ok=True)
    tmp = out_file + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, out_file)
    return {"out": out_file, "tables": len(state["tables"]) + len(state["raw_tables"]),
            "dense_tensors": len(state["dense"]),
            "bytes": os.path.getsize(out_file), "step": state["meta"].get("step")}


def _reshard_rank(rank: int, world_size: int, src: str, out: str, extra_meta: Dict[str, Any]) -> Dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from rayemb.checkpoint.exchange import row_range
    from rayemb.checkpoint.raw_files import reshard_raw_files
    from rayemb.checkpoint.store import _file_digests, _row_sharded

    meta = verify(src, hashes=rank == 0)
    reader = SafeFileSystemReader(src)
    request: Dict[str, Any] = {}
    for key, entry in reader.metadata().state_dict_metadata.items():
        shape, dtype = list(entry.size), entry.properties.dtype
        if key.startswith("tables."):
            lo, hi = row_range(shape[0], rank, world_size)
            request[key] = _row_sharded(torch.zeros([hi - lo] + shape[1:], dtype=dtype), shape[0], rank, world_size)
        else:
            request[key] = torch.zeros(shape, dtype=dtype)
    dcp.load(request, storage_reader=reader)
    dcp.save(request, storage_writer=dcp.FileSystemWriter(out, sync_files=True))
    # the raw-id tables: part r holds the ids rank r owns in the new world
    mine = reshard_raw_files(src, out, meta, rank, world_size)
    mine += [n for n in os.listdir(out) if n.startswith(f"__{rank}_") and n.endswith(".distcp")]
    if rank == 0:
        mine.append(".metadata")
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, _file_digests(out, mine))
    if rank == 0:
        doc = {**meta, **extra_meta, "world_size": world_size, "rng": [],
               "files": {n: info for g in gathered for n, info in g.items()},
               "resharded_from": {"path": os.path.abspath(src), "world_size": meta["world_size"]}}
        tmp = os.path.join(out, META_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(out, META_FILE))
        return doc
    return {}


def reshard_checkpoint(directory: str, world_size: int, out: str, plan_file: Optional[str] = None) -> Dict[str, Any]:
    """Rewrites ``directory`` for ``world_size`` ranks into ``out`` (must not exist); returns the new meta.json.

    With ``plan_file`` (a job's plan.json) the new checkpoint records that
    plan's placements and fingerprint (the tables must match the checkpoint's).
    """
    from rayemb.multiprocess import run_multiprocess

    if storage.is_remote(directory) or storage.is_remote(out):
        return _reshard_remote(directory, world_size, out, plan_file)
    if world_size < 1:
        raise DataError(f"--world-size {world_size} < 1. Use at least one rank.", category="bad_config")
    if os.path.exists(out):
        raise DataError(f"Output {out!r} exists. Choose a new directory (reshard never overwrites).",
                        category="bad_config")
    meta = verify(directory)
    SafeFileSystemReader(directory).metadata()  # a refused .metadata is one error here, not one per rank
    extra: Dict[str, Any] = {}
    if plan_file:
        with open(plan_file) as f:
            plan = json.load(f)
        tables = plan.get("tables", {})
        held = set(meta["tables"]) | set(meta.get("compression", {}))  # compressed: held as T__q, T__r / T__block
        unknown = sorted(set(tables) - held)
        if unknown:
            raise DataError(f"Plan {plan_file!r} places tables {unknown[:5]} that checkpoint {directory!r} does not "
                            "hold. Use the plan.json of a job over the same schema.", category="bad_config")
        extra["placements"] = {t: v.get("placement") for t, v in tables.items()}
        extra["plan_world_size"] = plan.get("world_size")
    tmp_out = out + ".partial"
    shutil.rmtree(tmp_out, ignore_errors=True)
    try:
        docs = run_multiprocess(_reshard_rank, world_size, src=os.path.abspath(directory), out=tmp_out,
                                extra_meta=extra)
        os.replace(tmp_out, out)
    finally:
        shutil.rmtree(tmp_out, ignore_errors=True)
    return docs[0]


def _reshard_remote(directory: str, world_size: int, out: str, plan_file: Optional[str]) -> Dict[str, Any]:
    """:func:`reshard_checkpoint` with a remote source and/or output: through local copies, uploaded when done."""
    import tempfile

    if storage.exists(out):
        raise DataError(f"Output {redact_uri(out)!r} exists. Choose a new directory (reshard never overwrites).",
                        category="bad_config")
    verify(directory, hashes=False)
    with storage.local_copy(directory, prefix="rayemb-reshard-src-") as src, \
            tempfile.TemporaryDirectory(prefix="rayemb-reshard-out-") as tmp:
        local_out = os.path.join(tmp, "checkpoint") if storage.is_remote(out) else out
        doc = reshard_checkpoint(src, world_size, local_out, plan_file)
        if storage.is_remote(directory):  # record where it came from, not the temporary download
            doc["resharded_from"]["path"] = redact_uri(directory)
            tmp_meta = os.path.join(local_out, META_FILE + ".tmp")
            with open(tmp_meta, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
            os.replace(tmp_meta, os.path.join(local_out, META_FILE))
        if storage.is_remote(out):
            storage.upload_dir(local_out, out)
    return doc


__all__ = ["export_checkpoint", "reshard_checkpoint", "unsharded_state"]
