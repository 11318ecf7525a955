"""Reading a checkpoint's DCP ``.metadata`` without running code from it.

``torch.distributed.checkpoint`` writes ``.metadata`` with :mod:`pickle` and its
own reader loads it with ``pickle.load``, which calls whatever the file names.
:class:`SafeFileSystemReader` is DCP's ``FileSystemReader`` with that one read
replaced: a :class:`pickle.Unpickler` whose ``find_class`` hands out only
:data:`ALLOWED_GLOBALS` — the classes a rayemb checkpoint's metadata holds (DCP's
metadata dataclasses, ``torch.Size``, torch dtypes, the layout and
memory-format encodings) — and refuses everything else with a
:class:`~rayemb.errors.DataError`. The metadata must then describe tensors only,
stored in files of the checkpoint directory itself: DCP loads "bytes" entries
with an unrestricted ``torch.load``, and a path outside the directory is not a
rayemb checkpoint.

Tensor data is read by DCP with ``torch.load(..., weights_only=True)`` and
``meta.json`` is JSON, so after this nothing in a checkpoint can call code.

Example::

    >>> import torch.distributed.checkpoint as dcp
    >>> reader = SafeFileSystemReader("runs/ray_results/job/checkpoint_000003")
    >>> sorted(reader.metadata().state_dict_metadata)[:1]     # DataError if the file names other classes
    ['dense.top.0.bias']
    >>> dcp.load(state, storage_reader=reader, no_dist=True)
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any, Dict, FrozenSet, Optional

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from rayemb.errors import DataError
from rayemb.logs import redact_uri

#: DCP's name of the checkpoint-wide metadata file
DCP_METADATA = ".metadata"

#: module -> names a rayemb checkpoint's ``.metadata`` may refer to (found by disassembling the
#: metadata rayemb's save path writes); ``torch`` additionally allows every ``torch.dtype``
ALLOWED_GLOBALS: Dict[str, FrozenSet[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset({
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata", "MetadataIndex",
        "StorageMeta", "_MEM_FORMAT_ENCODING"}),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),  # a layout by name, e.g. "torch.strided"
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath"}),  # the directory DCP wrote to, recorded as a path
}


def _refusal(shown: str, why: str) -> DataError:
    return DataError(
        f"Checkpoint file {shown!r} is not a rayemb checkpoint's metadata: {why}. rayemb refused to load it, since "
        "unpickling it could run code. Checkpoints are trusted input: load only checkpoints your own jobs wrote "
        "(or that you received from someone you trust), e.g. the checkpoint_* directories under the job's "
        "output_dir.", category="bad_checkpoint")


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ALLOWED_GLOBALS` (and torch dtypes)."""

    def __init__(self, file: Any, shown: str) -> None:
        super().__init__(file)
        self._shown = shown

    def find_class(self, module: str, name: str) -> Any:
        if name in ALLOWED_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _refusal(self._shown, f"it refers to {module}.{name}, which DCP metadata never holds")

    def persistent_load(self, pid: Any) -> Any:
        raise _refusal(self._shown, "it holds a persistent reference")


def load_metadata(data: bytes, shown: str) -> Metadata:
    """The DCP :class:`Metadata` pickled in ``data`` (the file ``shown``), or :class:`DataError` (``bad_checkpoint``).

    Only :data:`ALLOWED_GLOBALS` are resolved; the result must be DCP metadata of tensors
    stored in files of the checkpoint's own directory.
    """
    try:
        md = _RestrictedUnpickler(io.BytesIO(data), shown).load()
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged pickle raises about anything
        raise _refusal(shown, f"it does not unpickle ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise _refusal(shown, f"it holds a {type(md).__name__}, not DCP metadata")
    for key, entry in md.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            raise _refusal(shown, f"entry {key!r} is a {type(entry).__name__}; rayemb checkpoints hold tensors only")
    for index, info in (md.storage_data or {}).items():
        path = getattr(info, "relative_path", None)
        if not isinstance(path, str) or not path or path != os.path.basename(path) or path in (".", ".."):
            raise _refusal(shown, f"entry {getattr(index, 'fqn', index)!r} is stored in {path!r}, not in a file of "
                                  "the checkpoint directory")
        if getattr(info, "transform_descriptors", None):
            raise _refusal(shown, f"entry {getattr(index, 'fqn', index)!r} is stored with transforms "
                                  f"{list(info.transform_descriptors)}, which rayemb never writes")
    return md


class SafeFileSystemReader(FileSystemReader):
    """DCP's ``FileSystemReader`` whose metadata is read by :func:`load_metadata` (read once, then reused).

    Pass it as ``storage_reader`` to ``dcp.load``; call :meth:`metadata` first to get a refused
    file's :class:`DataError` as it is (inside ``dcp.load`` DCP wraps errors in its own).
    """

    def __init__(self, path: str, shown: Optional[str] = None) -> None:
        super().__init__(path)
        self._shown = shown
        self._metadata: Optional[Metadata] = None

    def _read(self, rank: Optional[int]) -> Metadata:
        name = DCP_METADATA if rank is None else f"__{rank}{DCP_METADATA}"
        path = self.fs.concat_path(self.path, name)
        with self.fs.create_stream(path, "rb") as f:
            data = f.read()
        shown = f"{self._shown.rstrip('/')}/{name}" if self._shown else str(path)
        return load_metadata(data, redact_uri(shown))

    def metadata(self) -> Metadata:
        """The checkpoint's metadata (``.metadata``), read and checked once."""
        if self._metadata is None:
            self._metadata = self._read(None)
        return self._metadata

    def reset(self, checkpoint_id: Any = None) -> None:
        super().reset(checkpoint_id)
        if checkpoint_id:
            self._metadata = None  # another directory: its own metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        md = self.metadata() if rank is None else self._read(rank)
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


__all__ = ["ALLOWED_GLOBALS", "DCP_METADATA", "SafeFileSystemReader", "load_metadata"]
