"""What the emulated-cluster tests share: whether this machine can emulate nodes, and a driver snippet that holds
the head's CPUs so Ray schedules the work on the other nodes."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def cannot_emulate() -> str:
    """Why emulated nodes cannot run here ('' when they can): network namespaces and tc need root and iproute2."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "needs iproute2 (ip, tc)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` is not available here"
    return ""


#: skips a test where nodes cannot be emulated, saying why
needs_emulation = pytest.mark.skipif(bool(cannot_emulate()), reason=cannot_emulate() or "ok")

#: Python run by a driver in the head's namespace (after `init_ray()`): an actor takes every CPU of the head, so
#: Ray Data's tasks and actors that follow run on the other nodes
HOLD_HEAD_CPUS = r"""
head = ray.get_runtime_context().get_node_id()
cpus = next(n["Resources"]["CPU"] for n in ray.nodes() if n["NodeID"] == head)

@ray.remote
class Hold:
    def ready(self):
        return True

hold = Hold.options(num_cpus=cpus, scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
ray.get(hold.ready.remote())
"""


def up_cluster(prefix: str, **kwargs):
    """An EmulatedCluster named ``prefix-<pid>`` brought up, trying another name (another derived subnet) where a
    cluster already on this machine holds the first one's."""
    from cluster.emulate import EmulatedCluster, EmulateError

    for suffix in ("", "b", "c"):
        cluster = EmulatedCluster(f"{prefix}-{os.getpid()}{suffix}", **kwargs)
        try:
            return cluster.up()
        except EmulateError as e:
            if "overlaps" not in str(e) or suffix == "c":
                raise


def kill_node(cluster, k: int):
    """Every process of node ``k`` SIGKILLed (``EmulatedCluster.kill_node``); the PIDs killed. A raylet may fork a
    worker between the listing of the node's processes and the kill: that one outlives the kill, and a second round
    takes it."""
    from cluster.emulate import EmulateError

    try:
        return cluster.kill_node(k)
    except EmulateError as e:
        if "survived SIGKILL" not in str(e):
            raise
        return cluster.kill_node(k)


def down(cluster) -> None:
    """``cluster.down()``, every node SIGKILLed first: a test's cluster has nothing to flush, and down's SIGTERM
    waits out the grace period (10 s) whenever a GCS hangs in its shutdown, as it mostly does after a job."""
    if cluster.status()["recorded"]:
        try:
            for k in range(cluster.nodes):
                kill_node(cluster, k)
        except Exception:  # noqa: BLE001 - down() below stops what is left, by SIGTERM then SIGKILL
            pass
    cluster.down()
