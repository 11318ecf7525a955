"""A local autoscaling Ray cluster on Ray's fake multi-node provider, owned by the caller.

Ray's own helper (``ray.cluster_utils.AutoscalingCluster``) runs ``ray stop --force``
before starting and to stop — that kills every Ray on the machine, not only its
own — and reads ``fake_multi_node/example.yaml``, which the Ray 2.60 wheel does not
ship. This module does the same thing without either::

    from cluster.fake_autoscaler import FakeAutoscalingCluster

    with FakeAutoscalingCluster(head_cpus=2, worker_node_types={
            "cpu_worker": {"resources": {"CPU": 2}, "min_workers": 0, "max_workers": 2}}) as cluster:
        cluster.connect()        # ray.init(address=cluster.address) on 127.0.0.1 (see ``connect``)
        ...                      # demand a node: the autoscaler starts one within seconds
        ray.shutdown()
    # every process the cluster started is gone here (``stop`` raises if one is left)

How it works
------------
``start`` writes a complete autoscaler config (provider ``type: fake_multinode``,
``gcs_address`` pointing at the head, the node types given plus ``ray.head.default``)
into a private directory and runs ``ray start --head --block --autoscaling-config=...``
as a child in its own session (``start_new_session=True``), with
``RAY_FAKE_CLUSTER=1``, ``AUTOSCALER_UPDATE_INTERVAL_S=1``, ``HOME`` and
``--temp-dir`` inside the private directory (nothing touches ``~/.ray`` or
``/tmp/ray``), everything bound to 127.0.0.1 (GCS, client-server, agent and metrics
ports picked free; the rest Ray picks at random, except the autoscaler's metrics port
44217 — if it is taken the autoscaler logs it and goes on), no dashboard, and no token
auth (``RAY_AUTH_*`` and ``RAY_ADDRESS`` are removed from its environment).

The head runs the autoscaler (``monitor.py``). The fake provider starts a worker
node *inside the monitor process* (``ray._private.node.Node``: a raylet and its
agents, children of the monitor) and stops it with ``kill_all_processes`` when the
node has been idle for ``idle_timeout_minutes``. ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
in the head's environment makes those nodes bind 127.0.0.1 too (Ray's
``get_node_ip_address`` then answers the loopback address instead of the host's
outward address). All fake nodes share that address, so Ray Train gives every rank
``node_rank=0``: node boundaries that matter need real or emulated nodes.

``stop`` takes the driver off first if it is connected to this cluster, then sends
SIGTERM to the session's process group, waits, and SIGKILLs whatever of it is left:
the processes it kills are the head's process tree (``psutil`` ``children(recursive=True)``)
and any process in the session the head leads (orphans re-parented to init keep
their session) — never processes found by name. It then checks that none of them is
alive and raises ``RuntimeError`` naming any that is. The private directory is
removed unless ``keep_dir=True`` (its ``head.log`` and ``t/session_latest/logs`` help
when a start fails).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HEAD_NODE_TYPE = "ray.head.default"  # the fake provider's name for the head's type

#: environment variables removed from the head's environment (another cluster's address, token auth)
_SCRUBBED_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_enable_autoscaler_v2")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def autoscaling_config(gcs_address: str, head_resources: Dict[str, float], worker_node_types: Dict[str, Any],
                       idle_timeout_minutes: float = 1.0, upscaling_speed: float = 1.0,
                       max_workers: Optional[int] = None) -> Dict[str, Any]:
    """A complete autoscaler config for the fake multi-node provider (what ``example.yaml`` would fill in).

    ``worker_node_types``: ``{name: {"resources": {...}, "min_workers": m, "max_workers": n}}``;
    ``node_config`` defaults to ``{}``. The autoscaler reads this file as it is (no defaults merged).
    """
    types = {}
    for name, spec in worker_node_types.items():
        spec = dict(spec)
        spec.setdefault("node_config", {})
        spec.setdefault("min_workers", 0)
        if "max_workers" not in spec:
            raise ValueError(f"node type {name!r} needs max_workers")
        types[name] = spec
    types[HEAD_NODE_TYPE] = {"resources": dict(head_resources), "node_config": {}, "max_workers": 0}
    total = max_workers if max_workers is not None else sum(int(t["max_workers"]) for t in worker_node_types.values())
    return {
        "cluster_name": "rayemb-fake",
        "max_workers": total,
        "provider": {"type": "fake_multinode", "gcs_address": gcs_address, "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True},
        "available_node_types": types,
        "head_node_type": HEAD_NODE_TYPE,
        "auth": {},
        "upscaling_speed": upscaling_speed,
        "idle_timeout_minutes": idle_timeout_minutes,
        "docker": {},
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [],
    }


def _psutil():
    """psutil: Ray vendors it (``ray/thirdparty_files``, put on ``sys.path`` by ``import ray``)."""
    import ray  # noqa: F401

    import psutil

    return psutil


def _ray_cli() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "ray")  # the ray of this interpreter's environment
    found = here if os.access(here, os.X_OK) else shutil.which("ray")
    if not found:
        raise RuntimeError("no `ray` command next to this Python or on PATH")
    return found


class FakeAutoscalingCluster:
    """A head on 127.0.0.1 plus an autoscaler that adds fake worker nodes (module docstring).

    Args:
        head_cpus: CPUs of the head node (``--num-cpus``).
        worker_node_types: autoscaler node types, ``{name: {"resources": {"CPU": 2}, "min_workers": 0,
            "max_workers": 2}}``; ``resources`` may hold ``object_store_memory`` (bytes).
        head_object_store_memory: bytes of the head's object store.
        idle_timeout_minutes: how long a worker node stays up with nothing on it.
        env: extra environment for every process of the cluster (Ray workers included).
        base_dir: where the private directory goes (a short path: Ray's socket paths live under it).
        keep_dir: keep the private directory after ``stop``.
    """

    def __init__(self, head_cpus: int = 2, worker_node_types: Optional[Dict[str, Any]] = None,
                 head_object_store_memory: int = 300 * 2**20, idle_timeout_minutes: float = 1.0,
                 env: Optional[Dict[str, str]] = None, base_dir: str = "/tmp", keep_dir: bool = False):
        self.head_cpus = head_cpus
        self.worker_node_types = worker_node_types or {
            "cpu_worker": {"resources": {"CPU": 2}, "min_workers": 0, "max_workers": 2}}
        self.head_object_store_memory = head_object_store_memory
        self.idle_timeout_minutes = idle_timeout_minutes
        self.extra_env = dict(env or {})
        self.base_dir = base_dir
        self.keep_dir = keep_dir
        self.dir: Optional[str] = None
        self.address: Optional[str] = None
        self.proc: Optional[subprocess.Popen] = None
        self._log = None
        self._seen: Dict[int, float] = {}  # pid -> create_time of every process of ours seen so far
        self.sigkilled: List[str] = []

    # ---- start ---- #

    @property
    def log_path(self) -> Optional[str]:
        return os.path.join(self.dir, "head.log") if self.dir else None

    @property
    def temp_dir(self) -> Optional[str]:
        """Ray's ``--temp-dir`` of this cluster (Ray sessions, logs, sockets of every node)."""
        return os.path.join(self.dir, "t") if self.dir else None

    def start(self, timeout_s: float = 120.0, attempts: int = 3) -> str:
        """Starts the head (and its autoscaler); returns the GCS address ``127.0.0.1:port``.

        Retries with fresh ports when the head exits early (a port taken in between); raises
        ``RuntimeError`` with the head's log tail when it does not come up within ``timeout_s``
        (after stopping what it started).
        """
        if self.proc is not None:
            raise RuntimeError("already started")
        self.dir = tempfile.mkdtemp(prefix="rfa", dir=self.base_dir)
        os.makedirs(os.path.join(self.dir, "home"))
        last = ""
        try:
            for _ in range(attempts):
                try:
                    self._start_once(timeout_s)
                    return self.address
                except _HeadExited as e:
                    last = str(e)
                    self._kill_all(grace_s=5.0)
        except BaseException:  # timed out, interrupted, or something unexpected: leave nothing running
            self.stop(grace_s=5.0)
            raise
        self.stop()
        raise RuntimeError(f"the fake autoscaling head did not start after {attempts} attempts:\n{last}")

    def _start_once(self, timeout_s: float) -> None:
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        config_path = os.path.join(self.dir, "autoscaling.json")
        with open(config_path, "w") as f:
            json.dump(autoscaling_config(self.address, {"CPU": self.head_cpus}, self.worker_node_types,
                                         idle_timeout_minutes=self.idle_timeout_minutes), f, indent=1)
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env.update({
            "HOME": os.path.join(self.dir, "home"),
            "RAY_TMPDIR": self.dir,
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # fake worker nodes on 127.0.0.1, like the head
            "RAY_USAGE_STATS_ENABLED": "0",
        })
        env.update(self.extra_env)
        cmd = [_ray_cli(), "start", "--head", "--block", f"--autoscaling-config={config_path}",
               "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={self.head_cpus}", "--num-gpus=0",
               f"--object-store-memory={self.head_object_store_memory}", f"--temp-dir={self.temp_dir}",
               "--include-dashboard=false", f"--ray-client-server-port={free_port()}",
               f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
               "--disable-usage-stats"]
        if self._log is not None:
            self._log.close()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, env=env, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._remember()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._remember()
            if self.proc.poll() is not None:
                raise _HeadExited(f"`ray start --head` exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self._head_ready():
                return
            time.sleep(1.0)
        raise RuntimeError(f"the fake autoscaling head did not come up within {timeout_s:.0f}s:\n{self.log_tail()}")

    def _head_ready(self) -> bool:
        """The head has said it started and its GCS lists it alive; the autoscaler process is running."""
        try:
            with open(self.log_path, "rb") as f:
                if b"Ray runtime started" not in f.read():
                    return False
        except OSError:
            return False
        if not any("monitor.py" in " ".join(_cmdline(pid)) for pid in self._seen):
            return False
        return len(self.alive_nodes(timeout_s=5)) >= 1

    def log_tail(self, chars: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-chars:]
        except (OSError, TypeError):
            return ""

    # ---- driver ---- #

    def connect(self, **init_kwargs: Any) -> Any:
        """``ray.init`` this process to the cluster as a driver on 127.0.0.1; returns ``ray.init``'s context.

        A plain ``ray.init(address="127.0.0.1:port")`` does not reach this head: Ray rewrites a loopback
        address to the host's outward address (``resolve_ip_for_localhost``) unless Ray clusters are
        "disabled" (``ray_constants.ENABLE_RAY_CLUSTER``, from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``, read
        when Ray is imported), and the head's GCS listens on 127.0.0.1 only. This flips that flag in
        this process for the duration of the call (once connected, Ray uses the node's recorded address).
        """
        import ray
        import ray._private.ray_constants as ray_constants

        saved = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
        try:
            return ray.init(address=self.address, _node_ip_address="127.0.0.1", **init_kwargs)
        finally:
            ray_constants.ENABLE_RAY_CLUSTER = saved

    # ---- state ---- #

    def alive_nodes(self, timeout_s: float = 10.0) -> List[Dict[str, Any]]:
        """The alive nodes as the GCS lists them (no driver needed): ``{"node_id", "ip", "resources"}``."""
        from ray._raylet import GcsClient

        try:
            infos = GcsClient(address=self.address).get_all_node_info(timeout=timeout_s)
        except Exception:  # noqa: BLE001 - not up (yet): no nodes
            return []
        out = []
        for node_id, info in infos.items():
            if info.state != 0:  # GcsNodeInfo.ALIVE
                continue
            out.append({"node_id": node_id.hex() if hasattr(node_id, "hex") else str(node_id),
                        "ip": info.node_manager_address, "resources": dict(info.resources_total)})
        return out

    def wait_for_nodes(self, count: int, timeout_s: float = 180.0) -> List[Dict[str, Any]]:
        """Waits until at least ``count`` nodes are alive; returns them. Raises ``TimeoutError`` with the
        autoscaler's log tail when they are not."""
        deadline = time.monotonic() + timeout_s
        nodes = self.alive_nodes()
        while len(nodes) < count:
            self._remember()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(nodes)} alive nodes after {timeout_s:.0f}s, wanted {count}; "
                                   f"autoscaler log:\n{self.monitor_log_tail()}")
            time.sleep(1.0)
            nodes = self.alive_nodes()
        self._remember()
        return nodes

    def monitor_log_tail(self, chars: int = 4000) -> str:
        path = os.path.join(self.temp_dir or "", "session_latest", "logs", "monitor.log")
        try:
            with open(path, "rb") as f:
                return f.read().decode(errors="replace")[-chars:]
        except OSError:
            return f"(no {path})"

    @property
    def recorded(self) -> Dict[int, float]:
        """Every process of this cluster seen so far (``processes``, ``wait_for_nodes``, ``stop`` look):
        ``{pid: create_time}`` — after ``stop``, what it killed and checked."""
        return dict(self._seen)

    def processes(self) -> List[int]:
        """PIDs of the alive processes of this cluster: the head's process tree and its session."""
        self._remember()
        return [pid for pid, created in self._seen.items() if _alive(pid, created)]

    def _remember(self) -> None:
        """Records every process of ours: the head, its descendants, and the members of its session."""
        psutil = _psutil()
        if self.proc is None:
            return
        found = []
        try:
            head = psutil.Process(self.proc.pid)
            found.append(head)
            found.extend(head.children(recursive=True))
        except psutil.Error:
            pass
        sid = self.proc.pid  # start_new_session: the head leads its own session
        for p in psutil.process_iter(["pid"]):
            try:
                if p.pid != os.getpid() and os.getsid(p.pid) == sid:
                    found.append(p)
            except (OSError, psutil.Error):
                continue
        for p in found:
            try:
                self._seen.setdefault(p.pid, p.create_time())
            except psutil.Error:
                continue

    # ---- stop ---- #

    def stop(self, grace_s: float = 15.0) -> None:
        """Stops every process of the cluster (module docstring); raises ``RuntimeError`` if one survives."""
        try:
            import ray

            if ray.is_initialized() and self.address and _driver_address() == self.address:
                ray.shutdown()
        except Exception:  # noqa: BLE001 - the processes go regardless
            pass
        left = self._kill_all(grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.dir and not self.keep_dir and not left:
            shutil.rmtree(self.dir, ignore_errors=True)
        if left:
            raise RuntimeError(f"processes of the fake cluster still alive after stop: {left} (dir {self.dir})")

    def _kill_all(self, grace_s: float) -> List[str]:
        if self.proc is None:
            return []
        self._remember()
        pgid = self.proc.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        for pid in self.processes():
            _signal(pid, self._seen[pid], signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self._remember()
            if not self.processes():
                break
            time.sleep(0.25)
        #: what was still alive after the SIGTERM grace period (SIGKILLed), for a look at slow shutdowns
        self.sigkilled = [f"{pid} {' '.join(_cmdline(pid))[:100]}" for pid in self.processes()]
        for _ in range(3):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for pid in self.processes():
                _signal(pid, self._seen[pid], signal.SIGKILL)
            time.sleep(0.5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        left = [f"{pid} {' '.join(_cmdline(pid))[:120]}" for pid in self.processes()]
        self.proc = None
        return left

    def __enter__(self) -> "FakeAutoscalingCluster":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class _HeadExited(RuntimeError):
    pass


def _driver_address() -> Optional[str]:
    import ray

    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001
        return None


def _alive(pid: int, created: float) -> bool:
    psutil = _psutil()
    try:
        p = psutil.Process(pid)
        return p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(pid: int, created: float, sig: int) -> None:
    if _alive(pid, created):  # the same process, not a reused PID
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _cmdline(pid: int) -> List[str]:
    psutil = _psutil()
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


__all__ = ["FakeAutoscalingCluster", "autoscaling_config", "free_port", "HEAD_NODE_TYPE"]
