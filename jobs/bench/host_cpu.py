"""What shares the cores while a benchmark runs: a once-a-second ``/proc`` sampler, by process class.

A step on this 2-core machine slows whenever something else takes CPU: Ray's own
processes on every emulated node, the kernel shaping the links (softirq), other
tenants of the host (steal). A benchmark that starts :class:`HostCpu` can say,
for each run, where the cores went during exactly that run's timed windows::

    with HostCpu() as cpu:
        t0 = time.time(); run(); t1 = time.time()
        print(cpu.summary(t0, t1))   # {"rank": 61.0, "ray_system": 9.5, ..., "idle": 40.2}

Every figure is a mean over the samples whose interval ends inside ``[t0, t1]``,
in percent of one core (the machine has ``os.cpu_count() * 100``): processes by
class (:func:`classify`, from each sample's own ``/proc/<pid>/cmdline``, since
Ray renames its workers as they take work) and, from ``/proc/stat``, ``idle``,
``iowait``, ``softirq``, ``steal``. And ``canary_ms``: how long a fixed piece of
memory-bound work (:func:`canary`, about a millisecond) took at each sample, best
of three -- the host's own speed, which a virtual machine's neighbours change
without any process here (or ``steal``) showing it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

#: process classes, in the order tables print them
CLASSES = ("rank", "ray_task", "ray_idle", "ray_system", "driver", "other")
#: /proc/stat fields reported (of the aggregate ``cpu`` line)
STAT_FIELDS = ("idle", "iowait", "softirq", "steal")
#: what summaries report besides CLASSES and STAT_FIELDS
SPEED_FIELDS = ("canary_ms",)
_STAT_ORDER = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_RAY_SYSTEM = ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "runtime_env", "agent.py",
               "ray start", "ray/_private", "DashboardAgent", "RuntimeEnvAgent")

Sample = Tuple[float, float, Dict[str, float]]  # (interval start, interval end, {class or stat field: % of a core})


def classify(cmdline: str) -> str:
    """The class of a process from its current command line (Ray rewrites it: ``ray::<Actor>.<method>``)."""
    if "TrainWorker" in cmdline or "train_fn" in cmdline:
        return "rank"
    if cmdline.startswith("ray::IDLE"):
        return "ray_idle"
    if cmdline.startswith("ray::") and "Agent" not in cmdline:
        return "ray_task"
    if "rayemb.cli" in cmdline:
        return "driver"
    if any(s in cmdline for s in _RAY_SYSTEM) or cmdline.startswith("ray-dashboard"):
        return "ray_system"
    return "other"


def canary(buf: "object", tries: int = 3) -> float:
    """Milliseconds of a fixed memory-bound update of ``buf`` (a float32 numpy array), the best of ``tries``."""
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        for _ in range(4):
            buf *= 1.0000001  # type: ignore[operator]
        best = min(best, time.perf_counter() - t)
    return 1e3 * best


def summarize(samples: Sequence[Sample], t0: float, t1: float) -> Optional[Dict[str, float]]:
    """Mean of every key over the samples whose interval ends in ``[t0, t1]`` (None when there is none)."""
    inside = [s for s in samples if t0 <= s[1] <= t1]
    if not inside:
        return None
    keys = list(CLASSES) + list(STAT_FIELDS)
    out: Dict[str, float] = {k: round(sum(s[2].get(k, 0.0) for s in inside) / len(inside), 1) for k in keys}
    for k in SPEED_FIELDS:  # a median: one sample that lost its core to a rank would skew a mean
        vals = sorted(s[2][k] for s in inside if k in s[2])
        if vals:
            out[k] = round(vals[len(vals) // 2], 3)
    out["samples"] = len(inside)
    return out


def _proc_times() -> Dict[int, int]:
    """utime + stime (clock ticks) of every process; processes that vanish while read are skipped."""
    ticks: Dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rfind(")") + 2:].split()
        ticks[int(name)] = int(fields[11]) + int(fields[12])
    return ticks


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _stat_ticks() -> Dict[str, int]:
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    return {k: int(v) for k, v in zip(_STAT_ORDER, parts)}


class HostCpu:
    """A daemon thread sampling every ``interval_s``; :attr:`samples` grows until :meth:`stop`."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.samples: List[Sample] = []
        self._hz = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="host-cpu", daemon=True)

    def __enter__(self) -> "HostCpu":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.interval_s)

    def summary(self, t0: float, t1: float) -> Optional[Dict[str, float]]:
        return summarize(list(self.samples), t0, t1)

    def _loop(self) -> None:
        import numpy as np

        buf = np.ones(1 << 20, dtype=np.float32)  # 4 MiB: the canary's working set (past L2)
        me = os.getpid()
        prev, prev_stat, t_prev = _proc_times(), _stat_ticks(), time.time()
        while not self._stop.wait(self.interval_s):
            cur, cur_stat, t = _proc_times(), _stat_ticks(), time.time()
            sample = self._sample(prev, cur, prev_stat, cur_stat, t - t_prev, me)
            sample["canary_ms"] = round(canary(buf), 3)
            self.samples.append((t_prev, t, sample))
            prev, prev_stat, t_prev = cur, cur_stat, t

    def _sample(self, prev: Mapping[int, int], cur: Mapping[int, int], prev_stat: Mapping[str, int],
                cur_stat: Mapping[str, int], dt: float, me: int) -> Dict[str, float]:
        pct: Dict[str, float] = {k: 0.0 for k in CLASSES}
        for pid, ticks in cur.items():
            used = ticks - prev.get(pid, ticks)
            if used > 0 and pid != me:
                pct[classify(_cmdline(pid))] += 100.0 * used / self._hz / dt
        for k in STAT_FIELDS:
            pct[k] = 100.0 * (cur_stat[k] - prev_stat[k]) / self._hz / dt
        return {k: round(v, 1) for k, v in pct.items()}
