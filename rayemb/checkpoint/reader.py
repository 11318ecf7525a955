"""Reading a logical checkpoint without a process group: its meta.json, its intactness, its tensors.

A checkpoint (:mod:`rayemb.checkpoint.store` writes it) is complete when its
``meta.json`` (written last) is there and of :data:`FORMAT`; it is intact when
every file that ``meta.json`` lists has its size and SHA-256 (:func:`verify`).
DCP's ``.metadata`` is a pickle: it is read by
:mod:`rayemb.checkpoint.safe_reader`, which resolves only the classes DCP
metadata holds; ``meta.json`` is JSON.

Checkpoints may live on remote storage (``s3://bucket/runs/ray_results/<job>/checkpoint_...``,
where Ray Train uploads them): :func:`read_meta`, :func:`verify` and
:func:`checkpoints_newest_first` read them there (hashes streamed, nothing
downloaded); loading needs a local copy (:func:`rayemb.storage.local_copy`).
A read the store does not answer (an ``OSError`` other than a missing file) is
tried again with exponential backoff (:data:`STORAGE_TRIES`, :data:`STORAGE_RETRY_S`), then
raised as a :class:`DataError` (``storage``) naming the checkpoint: it never
makes a checkpoint look absent::

    >>> meta = verify("runs/ray_results/job/checkpoint_000003")      # doctest: +SKIP
    >>> CheckpointMeta.from_dict(meta).step, len(meta["tables"])    # doctest: +SKIP
    (300, 26)
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional, TypeVar

import torch

from rayemb import storage
from rayemb.checkpoint.meta import CheckpointMeta
from rayemb.checkpoint.safe_reader import DCP_METADATA, SafeFileSystemReader
from rayemb.errors import DataError
from rayemb.logs import redact_uri

logger = logging.getLogger(__name__)

FORMAT = "rayemb-logical-v1"
META_FILE = "meta.json"
#: a checkpoint read the store did not answer is tried up to STORAGE_TRIES times, waiting
#: STORAGE_RETRY_FIRST_S, then twice as long each time, for at most STORAGE_RETRY_S in all; then it fails
STORAGE_TRIES = 5
STORAGE_RETRY_FIRST_S = 1.0
STORAGE_RETRY_S = 60.0

_T = TypeVar("_T")


def _io_error(path: str, e: OSError) -> DataError:
    """A local filesystem error as the ``storage`` error a remote one is (retried, never a verdict)."""
    return DataError(f"Cannot read {redact_uri(path)!r} ({type(e).__name__}: {e}). Check that the filesystem "
                     "holding it is mounted and readable from this process.", category="storage")


def with_storage_retries(fn: Callable[[], _T], directory: str) -> _T:
    """``fn()``, tried again with exponential backoff while it raises :class:`DataError` ``storage``.

    The store not answering says nothing about the checkpoint ``directory``: after
    :data:`STORAGE_TRIES` tries (or :data:`STORAGE_RETRY_S`) the last error is raised,
    naming the checkpoint. Other errors (a corrupt checkpoint) are raised at once.
    """
    from rayemb.tracking.backoff import Backoff

    backoff = Backoff(initial_s=STORAGE_RETRY_FIRST_S, max_s=max(STORAGE_RETRY_S, STORAGE_RETRY_FIRST_S))
    start, tries = time.monotonic(), 0
    while True:
        tries += 1
        try:
            return fn()
        except DataError as e:
            if e.category != "storage":
                raise
            last = e
        delay = backoff.next_delay_s(finishing=False)
        if tries >= STORAGE_TRIES or time.monotonic() - start + delay > STORAGE_RETRY_S:
            break
        logger.warning("checkpoint %s: the store did not answer (%s); trying again in %.1f s",
                       redact_uri(directory), last.message.split(". ", 1)[0], delay)
        time.sleep(delay)
    raise DataError(f"Checkpoint {redact_uri(directory)!r} could not be read: the store did not answer in {tries} "
                    f"tries over {time.monotonic() - start:.0f} s. {last.message} This says nothing about the "
                    "checkpoint itself: run again when the store answers.", category="storage")


def _read_meta_once(directory: str) -> Optional[Dict[str, Any]]:
    path = storage.join(directory, META_FILE)
    try:
        raw = storage.read_bytes(path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as e:
        raise _io_error(path, e) from None
    try:
        meta = json.loads(raw.decode("utf-8"))
    except ValueError:  # JSON or UTF-8: a damaged meta.json is not a checkpoint
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def read_meta(directory: str) -> Optional[Dict[str, Any]]:
    """``meta.json`` of a checkpoint; None when there is none or it is not one of :data:`FORMAT` (damaged).

    A store that does not answer is tried again, then :class:`DataError` ``storage`` (never None).
    """
    return with_storage_retries(lambda: _read_meta_once(directory), directory)


def verify(directory: str, hashes: bool = True, shown: Optional[str] = None) -> Dict[str, Any]:
    """``meta.json`` of a complete, intact checkpoint; :class:`DataError` (``bad_checkpoint``) naming what is wrong.

    Checks every file ``meta.json`` lists exists with its size and (``hashes``) its SHA-256.
    ``directory`` may be a URI: sizes from the store, hashes streamed. ``shown``: the
    name messages use (e.g. the URI a local download came from). A store that does not
    answer is tried again, then :class:`DataError` ``storage``.
    """
    return with_storage_retries(lambda: _verify_once(directory, hashes, shown), shown or directory)


def _verify_once(directory: str, hashes: bool, shown: Optional[str]) -> Dict[str, Any]:
    fix = ("Use another checkpoint_* directory (an earlier one of the same job), or start fresh without "
           "--resume-from / train.resume_from.")
    shown = redact_uri(shown or directory)
    if not storage.isdir(directory):
        raise DataError(f"Checkpoint {shown!r} does not exist. {fix}", category="bad_checkpoint")
    meta = _read_meta_once(directory)
    if meta is None:
        raise DataError(f"Checkpoint {shown!r} has no readable {META_FILE} of format {FORMAT} (an incomplete "
                        f"write, or not a rayemb checkpoint). {fix}", category="bad_checkpoint")
    problems = []
    for name, info in sorted(meta.get("files", {}).items()):
        path = storage.join(directory, name)
        size = storage.size_and_mtime_ns(path)[0] if storage.isfile(path) else None
        if size is None:
            problems.append(f"{name} is missing")
        elif size != info["bytes"]:
            problems.append(f"{name} has {size} bytes, {info['bytes']} were written")
        elif hashes and storage.sha256(path) != info["sha256"]:
            problems.append(f"{name} is corrupt (SHA-256 differs from the one written)")
    if DCP_METADATA not in meta.get("files", {}):
        problems.append(f"{DCP_METADATA} is not listed")
    if problems:
        raise DataError(f"Checkpoint {shown!r}: {'; '.join(problems)}. {fix}", category="bad_checkpoint")
    return meta


def _shapes(md: Any) -> Dict[str, List[int]]:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return {k: list(v.size) for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


def state_shapes(directory: str, shown: Optional[str] = None) -> Dict[str, List[int]]:
    """Global shape of every tensor in a DCP checkpoint (from ``.metadata``, read safely; no tensor data read)."""
    return _shapes(SafeFileSystemReader(directory, shown).metadata())


def read_unsharded(directory: str, keys: Optional[List[str]] = None, shown: Optional[str] = None
                   ) -> Dict[str, torch.Tensor]:
    """Every tensor of a checkpoint (or ``keys``) as a full plain tensor, without a process group.

    ``shown``: the name messages use for ``directory`` (e.g. the URI a download came from).
    """
    import torch.distributed.checkpoint as dcp

    reader = SafeFileSystemReader(directory, shown)
    entries = reader.metadata().state_dict_metadata
    out = {k: torch.zeros(list(v.size), dtype=v.properties.dtype)
           for k, v in entries.items() if keys is None or k in keys}
    dcp.load(out, storage_reader=reader, no_dist=True)
    return out


def _entries(parent: str) -> List[str]:
    """Names under ``parent``; [] when it does not exist, :class:`DataError` ``storage`` when it cannot be listed."""
    if storage.is_remote(parent):
        return storage.listdir(parent)
    try:
        return sorted(os.listdir(parent))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise _io_error(parent, e) from None


def checkpoints_newest_first(parent: str) -> List[str]:
    """Complete-looking logical checkpoints directly under ``parent`` (those with a meta.json), newest step first.

    ``parent`` may be a URI; the checkpoints are then URIs too. A store that does not
    answer is tried again, then :class:`DataError` ``storage`` (never an empty list).
    """
    found = []
    remote = storage.is_remote(parent)
    for name in with_storage_retries(lambda: _entries(parent), parent):
        path = storage.join(parent, name)
        meta = read_meta(path) if remote or os.path.isdir(path) else None
        if meta is not None:
            found.append((CheckpointMeta.from_dict(meta, shown=redact_uri(path)).step, name, path))
    return [p for _, _, p in sorted(found, reverse=True)]


__all__ = ["FORMAT", "META_FILE", "STORAGE_RETRY_FIRST_S", "STORAGE_RETRY_S", "STORAGE_TRIES", "checkpoints_newest_first",
           "read_meta", "read_unsharded", "state_shapes", "verify", "with_storage_retries"]
