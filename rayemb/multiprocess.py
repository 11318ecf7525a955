"""Spawn N local gloo ranks and run a function in each, for distributed tests and benchmarks.

Modelled on TorchRec's ``MultiProcessTestBase``.

``run_multiprocess(fn, world_size, **kwargs)`` picks a free 127.0.0.1 port,
starts ``world_size`` ranks with ``torch.multiprocessing``, runs the
module-level ``fn(rank=..., world_size=..., **kwargs)`` in each inside
:func:`process_group` (creates and destroys the gloo group), asserts every
exit code is 0 (showing each failing rank's traceback), and returns the
per-rank return values (which must pickle).

CPU (gloo) ranks are forked from a forkserver that imported torch, TorchRec and
FBGEMM once: importing TorchRec costs seconds of CPU, and a run of many short
multi-process calls (a test suite, a benchmark's repeats) would pay it in
every rank of every call. Each rank still gets the caller's current
environment, ``sys.path`` and working directory, as a spawned rank would.
NCCL ranks are spawned: nothing CUDA-related is touched before the child.

Example::

    def _per_rank(rank, world_size, n):
        t = torch.full((n,), float(rank)); dist.all_reduce(t); return t.tolist()

    assert run_multiprocess(_per_rank, 2, n=3)[0] == [1.0, 1.0, 1.0]
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import socket
import sys
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


#: imported once by the forkserver that CPU ranks fork from (a module that fails to import is skipped)
PRELOAD = ["torch", "torch.distributed", "fbgemm_gpu", "torchrec", "torchrec.distributed", "rayemb.multiprocess"]


def _context(backend: str) -> Any:
    if backend != "gloo":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # no effect once this process's forkserver runs: it keeps its imports
    return ctx


def _caller_state() -> dict:
    # The forkserver holds the environment and sys.path of the moment it started; a rank must see the
    # caller's of now, and unpickle fn and its arguments only after that (their module may be on a newer path).
    return {"environ": dict(os.environ), "sys_path": list(sys.path), "cwd": os.getcwd()}


def _entry(rank: int, world_size: int, port: int, backend: str, threads: int,
           payload: bytes, resq: Any, state: dict) -> None:
    os.environ.clear()
    os.environ.update(state["environ"])
    sys.path[:] = state["sys_path"]
    os.chdir(state["cwd"])
    # Ranks share the machine's few cores: one intra-op thread each avoids oversubscription.
    torch.set_num_threads(threads)
    try:
        fn, kwargs = pickle.loads(payload)
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
    """Runs ``fn`` on ``world_size`` local ranks; asserts all exit 0; returns results by rank."""
    ctx = _context(backend)
    resq = ctx.Queue()
    port = free_port()
    state, payload = _caller_state(), pickle.dumps((fn, kwargs))
    procs = [
        ctx.Process(target=_entry, args=(r, world_size, port, backend, threads_per_rank, payload, resq, state))
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
