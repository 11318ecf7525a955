"""Timing a GPU kernel's work for the calibration's CUDA compute probes.

A step of the default job is launch-bound on a GPU: the host's time to enqueue its kernels hides their work, so
wall-clock probes read the same time for 256 ids as for a million. These time the kernels alone (CUDA events
behind a sleep kernel) and grow the probe until its work is well above timing jitter.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable

logger = logging.getLogger("rayemb.train.calibration.calibrate")

#: The CPU's probe sizes (256 vs 8192 ids, 1k vs 50k replicated rows) are too small to time on a GPU. On CUDA
#: each probe grows by GPU_GROWTH from the CPU's small size until its kernels take GPU_TIME_RATIO x the small
#: size's time, capped so that no probe tensor exceeds GPU_MAX_ELEMS floats (256 MiB; about 1 GiB peak for all).
GPU_MAX_IDS = 2**20
GPU_MAX_ELEMS = 2**26
GPU_GROWTH = 4
GPU_TIME_RATIO = 2.0


def gpu_timed(fn: Callable[[], Any], device: Any, repeats: int) -> float:
    """Median seconds, over ``repeats`` calls, of the GPU work that ``fn`` enqueues, without the host's time to
    launch it.

    Each call is queued behind a sleep kernel that outlasts the host's enqueueing, so the CUDA events around
    the call time its kernels back to back. Wall-clock timing cannot see a kernel's work while the host's
    launches take longer than the kernels."""
    import torch

    fn()
    torch.cuda.synchronize(device)
    t = time.perf_counter()
    fn()
    host_s = time.perf_counter() - t
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe_cycles = 1_000_000
    start.record()
    torch.cuda._sleep(probe_cycles)
    end.record()
    torch.cuda.synchronize(device)
    cycles_per_s = probe_cycles / max(start.elapsed_time(end) / 1e3, 1e-9)
    sleep_cycles = int(cycles_per_s * max(3.0 * host_s, 1e-3))
    times = []
    for _ in range(repeats):
        torch.cuda._sleep(sleep_cycles)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def grown_slope(step_at: Callable[[int], Callable[[], None]], x0: int, x_max: int, timed: Callable[..., float],
                what: str) -> float:
    """Seconds per unit of x (ids, rows) on a GPU: times ``step_at(x0)`` (``timed``: the kernels' time,
    :func:`gpu_timed`), then x0 x4, x16, ... until a step takes GPU_TIME_RATIO x the first one's time or x
    reaches ``x_max``; the slope through those two points, clamped at zero. Growing until the time doubles
    keeps the difference above timing jitter on any GPU without probing more than needed."""
    t0 = timed(step_at(x0))
    x, t = x0, t0
    while x < x_max and t < GPU_TIME_RATIO * t0:
        x = min(x * GPU_GROWTH, x_max)
        t = timed(step_at(x))
    logger.info("CUDA compute probe %s: %d -> %d, %.3f -> %.3f ms", what, x0, x, t0 * 1e3, t * 1e3)
    return max((t - t0) / max(x - x0, 1), 0.0)
