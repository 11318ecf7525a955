"""Spawn N local gloo ranks and run a function in each, for distributed tests and benchmarks.

Modelled on TorchRec's ``MultiProcessTestBase``.

``run_multiprocess(fn, world_size, **kwargs)`` picks a free 127.0.0.1 port,
spawns ``world_size`` ranks with ``torch.multiprocessing`` (spawn), runs the
module-level ``fn(rank=..., world_size=..., **kwargs)`` in each inside
:func:`process_group` (creates and destroys the gloo group), asserts every
exit code is 0 (showing each failing rank's traceback), and returns the
per-rank return values (which must pickle).

Example::

    def _per_rank(rank, world_size, n):
        t = torch.full((n,), float(rank)); dist.all_reduce(t); return t.tolist()

    assert run_multiprocess(_per_rank, 2, n=3)[0] == [1.0, 1.0, 1.0]
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import traceback
from typing import Any, Callable, Iterator, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: default wall-clock limit for one multi-process run
DEFAULT_TIMEOUT_S = 300.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def process_group(rank: int, world_size: int, port: int, backend: str = "gloo") -> Iterator[dist.ProcessGroup]:
    """Creates the default process group on 127.0.0.1:``port`` and destroys it on exit."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
    )
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _entry(rank: int, world_size: int, port: int, backend: str, threads: int,
           fn: Callable[..., Any], kwargs: dict, resq: Any) -> None:
    # Ranks share the machine's few cores: one intra-op thread each avoids oversubscription.
    torch.set_num_threads(threads)
    try:
        with process_group(rank, world_size, port, backend):
            result = fn(rank=rank, world_size=world_size, **kwargs)
        resq.put((rank, True, result))
    except BaseException:
        resq.put((rank, False, traceback.format_exc()))
        raise


def run_multiprocess(
    fn: Callable[..., Any],
    world_size: int,
    *,
    backend: str = "gloo",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    threads_per_rank: int = 1,
    **kwargs: Any,
) -> List[Any]:
    """Runs ``fn`` on ``world_size`` spawned ranks; asserts all exit 0; returns results by rank."""
    ctx = mp.get_context("spawn")
    resq = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world_size, port, backend, threads_per_rank, fn, kwargs, resq))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict = {}
    errors: List[str] = []
    try:
        # Drain results before join: a child blocks on exit until its queued data is read.
        for _ in range(world_size):
            rank, ok, payload = resq.get(timeout=timeout_s)
            if ok:
                results[rank] = payload
            else:
                errors.append(f"--- rank {rank} ---\n{payload}")
                break
    except queue.Empty:
        errors.append(f"timed out after {timeout_s:.0f}s waiting for ranks")
    for p in procs:
        p.join(timeout=30 if not errors else 5)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    codes = [p.exitcode for p in procs]
    assert not errors and codes == [0] * world_size, f"exit codes {codes}\n" + "\n".join(errors)
    return [results[r] for r in range(world_size)]


__all__ = ["DEFAULT_TIMEOUT_S", "free_port", "process_group", "run_multiprocess"]
