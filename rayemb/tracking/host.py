"""Host CPU and memory utilisation of the driver, as MLflow system metrics.

Example::

    >>> sampler = HostSampler()
    >>> sampler.sample()          # the CPU figure appears from the second call on (/proc needs two readings)
    {'system/system_memory_usage_percentage': 41.3}
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

#: how often RunLogger logs a host sample by default
DEFAULT_SYSTEM_METRICS_INTERVAL_S = 10.0
#: metric names follow MLflow's own system metrics so the UI groups them
CPU_METRIC = "system/cpu_utilization_percentage"
MEMORY_METRIC = "system/system_memory_usage_percentage"


class HostSampler:
    """Host CPU and memory utilisation in percent: psutil if installed, else /proc (Linux).

    CPU% over an interval is ``100 * (1 - d_idle / d_total)`` from two
    ``/proc/stat`` readings (idle includes iowait); memory% is
    ``100 * (1 - MemAvailable / MemTotal)`` from ``/proc/meminfo``.
    """

    def __init__(self) -> None:
        self._psutil: Any
        try:
            import psutil  # type: ignore[import-not-found]

            self._psutil = psutil
            psutil.cpu_percent(interval=None)  # first call primes the counters
        except ImportError:
            self._psutil = None
        self._last_cpu = self._proc_stat()

    @staticmethod
    def _proc_stat() -> Optional[Tuple[int, int]]:
        """(idle, total) jiffies of all CPUs since boot, or None off Linux."""
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return idle, sum(fields)

    @staticmethod
    def _proc_memory_percent() -> Optional[float]:
        try:
            info = {}
            with open("/proc/meminfo") as f:
                for line in f:
                    name, rest = line.split(":", 1)
                    info[name] = int(rest.split()[0])
            return 100.0 * (1.0 - info["MemAvailable"] / info["MemTotal"])
        except (OSError, KeyError, ValueError, ZeroDivisionError):
            return None

    def sample(self) -> Dict[str, float]:
        """``{metric name: percent}``; a figure that cannot be read is left out."""
        out: Dict[str, float] = {}
        if self._psutil is not None:
            out[CPU_METRIC] = float(self._psutil.cpu_percent(interval=None))
            out[MEMORY_METRIC] = float(self._psutil.virtual_memory().percent)
            return out
        now = self._proc_stat()
        if now is not None and self._last_cpu is not None and now[1] > self._last_cpu[1]:
            d_idle, d_total = now[0] - self._last_cpu[0], now[1] - self._last_cpu[1]
            out[CPU_METRIC] = 100.0 * (1.0 - d_idle / d_total)
        self._last_cpu = now
        memory = self._proc_memory_percent()
        if memory is not None:
            out[MEMORY_METRIC] = memory
        return out
