"""A save's canonical tensors in memory-mapped files, so that they are page cache and not anonymous memory.

One ``dcp.save`` writes a rank's whole canonical share of the table state
(:mod:`rayemb.checkpoint.exchange`), so that share must exist somewhere while
DCP writes it. Held in ordinary tensors it is anonymous memory, which the
kernel cannot give back without swap: on a host or a container near its limit,
the save is what gets the rank OOM-killed. :class:`Staging` hands out tensors
backed by shared mappings of files in a folder beside the checkpoint directory
(``.<name>.staging-<rank>-<pid>``, on the same local disk the checkpoint is
written to before it is persisted): the exchange writes received rows into
them, DCP writes from them, and the kernel writes their pages back and drops
them under pressure like any page cache. Anonymous memory stays what the
exchange's rounds hold.

Each file is allocated in full (``posix_fallocate``) before it is mapped, so a
full disk is a :class:`~rayemb.errors.TrainingError` naming the folder and the
bytes needed, not a ``SIGBUS`` on a write into the mapping. Each file is
unlinked as soon as it is mapped: its blocks live as long as the tensor does,
and a rank that dies leaves no file behind. The folder is removed when the
:class:`Staging` closes, also on an error; then the local variables of the
frames the error left (below the ``with``) are cleared, so that the traceback
an error carries up does not keep the staged tensors, their page cache and
their disk blocks alive.

Example::

    >>> with Staging("/tmp/rayemb-ckpt-x1y2", rank=0) as staging:
    ...     rows = staging.zeros((1000, 64), torch.float16)   # file-backed
    ...     rows[:10] = 1.0
"""

from __future__ import annotations

import errno
import os
import shutil
import traceback
from types import TracebackType
from typing import Optional, Sequence, Type

import torch

from rayemb.errors import TrainingError


def staging_folder(directory: str, rank: int) -> str:
    """The folder beside ``directory`` that rank ``rank`` of this process stages a save of it in."""
    path = os.path.abspath(directory)
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.staging-{rank}-{os.getpid()}")


class Staging:
    """Tensors backed by files of a staging folder beside a checkpoint directory; a context manager."""

    def __init__(self, directory: str, rank: int) -> None:
        self.folder = staging_folder(directory, rank)
        self._count = 0
        os.makedirs(self.folder)

    def zeros(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A zero-filled tensor of ``shape`` and ``dtype`` in a shared mapping of a file of its own (unlinked)."""
        numel = 1
        for n in shape:
            numel *= int(n)
        if numel == 0:  # a file of no bytes cannot be mapped
            return torch.zeros(tuple(shape), dtype=dtype)
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        path = os.path.join(self.folder, f"{self._count}.bin")
        self._count += 1
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise TrainingError(
                    f"A checkpoint save stages this rank's share of the table state in {self.folder!r} (the "
                    f"checkpoint's local disk) and needs {nbytes / 2**20:.0f} MiB more there: the disk is full. "
                    "Free space on it (a save needs about the rank's share of the table state, then the same "
                    "again for the checkpoint files), or point the job's storage at a larger disk.",
                    category="checkpoint_disk") from None
        finally:
            os.close(fd)
        try:
            tensor = torch.from_file(path, shared=True, size=numel, dtype=dtype)
        finally:
            os.unlink(path)  # the mapping keeps the blocks; nothing outlives the tensor, even a killed process
        return tensor.view(tuple(shape))

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "Staging":
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], error: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()
        if tb is not None:
            traceback.clear_frames(tb)  # the frame of the with statement runs on and is left as it is


__all__ = ["Staging", "staging_folder"]
