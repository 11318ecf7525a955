"""jobs/bench/host_cpu.py: which process is whose, windows of samples, and a live sample of a busy child."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests._bench import load_bench as _load

hc = _load("host_cpu")
mn = _load("multinode")


@pytest.mark.parametrize("cmdline, cls", [
    ("ray::RayTrainWorker.train_fn_with_final_checkpoint_flush", "rank"),
    ("ray::_RayTrainWorker__execute.get_next", "rank"),
    ("ray::IDLE", "ray_idle"),
    ("ray::ReadParquet->SplitBlocks(4)", "ray_task"),
    ("ray::DashboardAgent", "ray_system"),
    ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=/t", "ray_system"),
    ("/venv/bin/python -u /venv/lib/python3.11/site-packages/ray/_private/log_monitor.py", "ray_system"),
    ("ray-dashboard-NodeHead-0 (/venv/bin/python -B -c ...)", "ray_system"),
    ("/venv/bin/python -m rayemb.cli train --config jobs/configs/synth_small.yaml", "driver"),
    ("/usr/sbin/sshd -D", "other"),
])
def test_classify_by_the_current_command_line(cmdline, cls):
    assert hc.classify(cmdline) == cls


def test_summary_averages_the_samples_that_end_inside_the_window():
    samples = [(0.0, 1.0, {"rank": 100.0, "idle": 100.0, "canary_ms": 9.0}),
               (1.0, 2.0, {"rank": 50.0, "ray_system": 30.0, "idle": 120.0, "canary_ms": 0.5}),
               (2.0, 3.0, {"rank": 150.0, "steal": 10.0, "idle": 40.0, "canary_ms": 0.7}),
               (2.5, 3.0, {"rank": 100.0, "idle": 80.0, "canary_ms": 5.0}),
               (3.0, 4.0, {"rank": 0.0, "idle": 200.0})]
    s = hc.summarize(samples[:3] + samples[4:], 1.5, 3.0)
    assert s["samples"] == 2 and s["rank"] == 100.0 and s["ray_system"] == 15.0
    assert s["canary_ms"] == 0.7  # the upper median of [0.5, 0.7]
    assert hc.summarize(samples, 1.5, 3.0)["canary_ms"] == 0.7  # a median: one slow sample does not move it
    assert s["idle"] == 80.0 and s["steal"] == 5.0 and s["other"] == 0.0
    assert hc.summarize(samples, 10.0, 20.0) is None
    shares = mn.cpu_shares({**s, "driver": 4.0, "other": 1.0})
    assert shares == {"ranks_cpu": 100.0, "others_cpu": 20.0, "idle_cpu": 80.0, "canary_ms": 0.7}
    assert mn.cpu_shares(None) == {"ranks_cpu": None, "others_cpu": None, "idle_cpu": None, "canary_ms": None}
    row = mn.row_of({"variant": "auto", "host_cpu": s, "samples_per_s": 1.0}, 100.0)
    assert (row["ranks_cpu"], row["others_cpu"]) == (100.0, 15.0)


@pytest.mark.timing
def test_a_busy_child_shows_up_as_about_one_core():
    """A real sample: a child spinning for 3 s is one core busy, counted under its class ('other')."""
    with hc.HostCpu(interval_s=0.5) as cpu:
        child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\n"
                                                        "while time.time() - t < 3: pass"])
        t0 = time.time()
        child.wait(timeout=30)
        t1 = time.time()
    s = cpu.summary(t0 + 0.6, t1)
    assert s is not None and s["samples"] >= 3
    assert s["other"] >= 60.0 and s["rank"] == 0.0
    assert 0.0 < s["canary_ms"] < 1000.0
    # every core-second is somewhere: processes + idle + iowait + softirq + steal ~ the machine's capacity
    total = sum(s[k] for k in hc.CLASSES + hc.STAT_FIELDS)
    assert 0.8 * 100 * os.cpu_count() <= total <= 1.15 * 100 * os.cpu_count()
