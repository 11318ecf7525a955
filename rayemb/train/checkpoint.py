"""Per-rank checkpoints that load with ``torch.load(weights_only=True)``.

TorchRec's sharded state dicts hold ``ShardedTensor`` objects, and unpickling
those needs globals that ``weights_only`` loading rightly refuses (``getattr``
among them, which would allow arbitrary code). So a rank's file holds only
tensors, numbers, strings and containers: every ``ShardedTensor`` is stored as
its local shards (offsets and a plain tensor). Loading walks the live model's
(or optimizer's) own state dict next to the saved one and copies each local
shard into place, checking that the shard layout is the same — a checkpoint of
another plan or world size is refused with a clear error instead of loading
rows into the wrong places.

A checkpoint directory holds ``rank<r>.pt`` for every rank and ``meta.json``
(world size, plan fingerprint, epoch, step, best validation AUC so far).
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any, Dict, List, Optional

from rayemb.errors import DataError

META_FILE = "meta.json"
_SHARDED = "__rayemb_sharded__"


def rank_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}.pt")


def to_plain(value: Any) -> Any:
    """A copy of a (nested) state dict in which every ShardedTensor is its local shards as plain tensors."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if isinstance(value, ShardedTensor):
        return {_SHARDED: True, "shards": [
            {"offsets": [int(o) for o in s.metadata.shard_offsets], "tensor": s.tensor.detach().clone()}
            for s in value.local_shards()
        ]}
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_plain(v) for v in value)
    return value


def fill_from_plain(live: Any, saved: Any, where: str = "") -> Any:
    """``live`` (a state dict of the running model) with the values of ``saved`` (from :func:`to_plain`).

    ShardedTensors of ``live`` get their local shards overwritten in place;
    plain values are taken from ``saved``. Raises :class:`ValueError` naming the
    key when the two do not have the same structure or shard layout.
    """
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if isinstance(live, ShardedTensor):
        if not (isinstance(saved, dict) and saved.get(_SHARDED)):
            raise ValueError(f"{where}: the checkpoint holds a plain value where this plan has a sharded table")
        shards = {tuple(s["offsets"]): s["tensor"] for s in saved["shards"]}
        for s in live.local_shards():
            key = tuple(int(o) for o in s.metadata.shard_offsets)
            if key not in shards or tuple(shards[key].shape) != tuple(s.tensor.shape):
                raise ValueError(f"{where}: shard at offsets {list(key)} of shape {list(s.tensor.shape)} is not "
                                 "in the checkpoint (it was written with another plan or world size)")
            s.tensor.detach().copy_(shards[key])
        return live
    if isinstance(live, dict):
        if not isinstance(saved, dict):
            raise ValueError(f"{where}: expected a mapping in the checkpoint")
        missing = sorted(str(k) for k in live if k not in saved)
        if missing:
            raise ValueError(f"{where or 'state'}: keys {missing[:5]} are not in the checkpoint")
        return {k: fill_from_plain(v, saved[k], f"{where}.{k}" if where else str(k)) for k, v in live.items()}
    if isinstance(live, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(live):
            raise ValueError(f"{where}: list of {len(live)} entries differs in the checkpoint")
        return type(live)(fill_from_plain(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(live, saved)))
    if isinstance(live, torch.Tensor):
        if not isinstance(saved, torch.Tensor) or saved.shape != live.shape:
            raise ValueError(f"{where}: tensor of shape {list(live.shape)} differs in the checkpoint")
        return saved
    return saved


def save_rank(directory: str, rank: int, model: Any, optimizer: Any, extra: Dict[str, Any]) -> str:
    """Writes this rank's ``rank<r>.pt`` atomically (temp file + rename)."""
    import torch

    path = rank_file(directory, rank)
    tmp = f"{path}.tmp"
    torch.save({"model": to_plain(model.state_dict()), "optimizer": to_plain(optimizer.state_dict()), **extra}, tmp)
    os.replace(tmp, path)
    return path


def write_meta(directory: str, meta: Dict[str, Any]) -> None:
    tmp = os.path.join(directory, META_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(directory, META_FILE))


def read_meta(directory: str) -> Optional[Dict[str, Any]]:
    path = os.path.join(directory, META_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def load_rank(directory: str, rank: int, model: Any, optimizer: Any) -> Dict[str, Any]:
    """Loads ``rank<r>.pt`` into the live model and optimizer; returns the file's other entries.

    Raises :class:`DataError` naming the file when it is missing, unreadable or
    of another plan (``weights_only=True``: nothing in the file can run code).
    """
    import torch

    path = rank_file(directory, rank)
    fix = ("Resume from a complete checkpoint of a job with the same config and world size "
           "(train.resume_from), or remove train.resume_from to start fresh.")
    if not os.path.isfile(path):
        raise DataError(f"Checkpoint file {path!r} is missing. {fix}", category="bad_checkpoint")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(fill_from_plain(model.state_dict(), state["model"], "model"))
        optimizer.load_state_dict(fill_from_plain(optimizer.state_dict(), state["optimizer"], "optimizer"))
    except DataError:
        raise
    except Exception as e:  # truncated zip, unpickling refused, shape/layout mismatch
        raise DataError(f"Checkpoint file {path!r} cannot be loaded ({type(e).__name__}: "
                        f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}). {fix}",
                        category="bad_checkpoint") from None
    return {k: v for k, v in state.items() if k not in ("model", "optimizer")}


def check_checkpoint_dir(directory: str, world_size: int, plan_fingerprint: Optional[str] = None) -> Dict[str, Any]:
    """Driver-side check of a checkpoint to resume from, before any work starts.

    Every ``rank<r>.pt`` of ``world_size`` ranks must exist and be an intact
    archive (every member's CRC is read, nothing is unpickled); ``meta.json``
    must name the same world size and, when given, the same plan fingerprint.
    """
    fix = ("Point train.resume_from at a checkpoint_* directory of an earlier job with the same config and "
           "scaling.num_workers (under <output_dir>/ray_results/<job>/), or remove it to start fresh.")
    if not os.path.isdir(directory):
        raise DataError(f"Checkpoint directory {directory!r} (train.resume_from) does not exist. {fix}",
                        category="bad_checkpoint")
    meta = read_meta(directory)
    if meta is None:
        raise DataError(f"Checkpoint directory {directory!r} (train.resume_from) has no readable {META_FILE}. {fix}",
                        category="bad_checkpoint")
    if int(meta.get("world_size", -1)) != world_size:
        raise DataError(f"Checkpoint {directory!r} was written by {meta.get('world_size')} ranks; this job has "
                        f"{world_size}. {fix}", category="bad_checkpoint")
    if plan_fingerprint and meta.get("plan_fingerprint") not in (None, plan_fingerprint):
        raise DataError(f"Checkpoint {directory!r} was written with plan {meta.get('plan_fingerprint')}; this job "
                        f"plans {plan_fingerprint} (a different config, dataset or cluster). {fix}",
                        category="bad_checkpoint")
    problems: List[str] = []
    for r in range(world_size):
        path = rank_file(directory, r)
        if not os.path.isfile(path):
            problems.append(f"{os.path.basename(path)} is missing")
            continue
        try:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
            if bad is not None:
                problems.append(f"{os.path.basename(path)} is corrupt (member {bad})")
        except (zipfile.BadZipFile, OSError) as e:
            problems.append(f"{os.path.basename(path)} is not a readable checkpoint ({e})")
    if problems:
        raise DataError(f"Checkpoint {directory!r} (train.resume_from): {'; '.join(problems)}. {fix}",
                        category="bad_checkpoint")
    return meta
