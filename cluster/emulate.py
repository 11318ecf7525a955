#!/usr/bin/env python3
"""An emulated multi-node Ray cluster on one Linux machine: network namespaces, shaped links.

Each "node" is a network namespace on a private Linux bridge, with one veth
link shaped by ``tc tbf`` in both directions (plus ``netem`` delay when asked)
and a real Ray node inside (``ray start --block``; node 0 is the head). Every
node's interface has the same name (``emu0``), and every Ray process gets
``GLOO_SOCKET_IFNAME=emu0``, so gloo collectives cross the shaped links.
Needs root (``ip netns``, ``tc``). Docs: docs/cluster.md.

    cluster/emulate.sh up --nodes 3 --cpus-per-node 1 --bandwidth-mbit 200 [--latency-ms 1]
    cluster/emulate.sh exec -- python jobs/train.py --config jobs/configs/synth_small.yaml
    cluster/emulate.sh status
    cluster/emulate.sh down

Python::

    from cluster.emulate import EmulatedCluster
    with EmulatedCluster("bench", nodes=2, cpus_per_node=1, bandwidth_mbit=100) as c:
        subprocess.run(c.exec_argv(["python", "driver.py"]), check=True)

Processes are stopped by PID only: the ``ray start`` PIDs ``up`` recorded (signalled
only while the PID still has its recorded start time) and the processes running
inside the cluster's own namespaces; never ``ray stop``, never by process name.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
DEFAULT_NAME = "rayemb-emu"
IFNAME = "emu0"  # the interface name every node's namespace has
GCS_PORT = 6379
DASHBOARD_PORT = 8265
AGENT_PORT = 52365  # Ray's default dashboard-agent port: every namespace has its own ports
SUBNET_PREFIX = "10.213"  # clusters get 10.213.<k>.0/24, k derived from the name
FIRST_NODE_HOST = 10  # node k is <subnet>.(10 + k); the bridge (the host) is <subnet>.1
MAX_NODES = 200
DEFAULT_OBJECT_STORE_BYTES = 200_000_000
START_ATTEMPTS = 3  # a `ray start` can time out under CPU load: retried
NODE_START_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0  # Ray's GCS can hang in shutdown (flushing metrics to a dead agent): then SIGKILL
STATE_FILE = "state.json"
TOKEN_FILE = "auth_token"
ENV_FILE = "env.sh"
MAX_SOCKET_DIR = 40  # a node's temp dir + "/session_<date>_<pid>/sockets/raylet.<n>" < 108 bytes
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_STARTED = "Ray runtime started."


class EmulateError(RuntimeError):
    """A user-facing failure: the message says what went wrong and how to fix it."""


# ---------------------------------------------------------------- pure pieces: names, addresses, env


def short_name(name: str) -> str:
    """8-character prefix of everything a cluster creates: 4 characters of NAME + 4 hex of its hash."""
    check_name(name)
    letters = re.sub(r"[^a-z0-9]", "", name.lower())[:4]
    return letters + hashlib.sha1(name.encode()).hexdigest()[: 8 - len(letters)]


def check_name(name: str) -> None:
    if not _NAME_RE.match(name or ""):
        raise EmulateError(f"cluster name {name!r} is not valid: use 1-63 letters, digits, '.', '_' or '-'"
                           " starting with a letter or digit")


def default_subnet(name: str) -> ipaddress.IPv4Network:
    """10.213.<k>.0/24 with k in 1..254 derived from NAME (two names rarely share one; `up` checks)."""
    k = 1 + int(hashlib.sha1(name.encode()).hexdigest(), 16) % 254
    return ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{k}.0/24")


def _proc_start_time(pid: int) -> Optional[int]:
    """Start time of a live process in clock ticks since boot (/proc/<pid>/stat field 22); None if gone.

    A zombie counts as gone (it runs nothing; its parent reaps it).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _proc_pgid(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[2])


def _netns_inode(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _all_pids() -> List[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _pids_in_netns(inode: int) -> List[int]:
    """Every process whose network namespace has this inode (what `ip netns pids` does)."""
    out = []
    for pid in _all_pids():
        if pid != os.getpid() and _netns_inode(f"/proc/{pid}/ns/net") == inode:
            out.append(pid)
    return out


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise EmulateError(f"`{shlex.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def _log(msg: str) -> None:
    print(f"emulate: {msg}", file=sys.stderr, flush=True)


def _ray_bin() -> str:
    beside = Path(sys.executable).parent / "ray"
    return str(beside if beside.exists() else REPO / ".venv" / "bin" / "ray")


class EmulatedCluster:
    """N Ray nodes in N network namespaces on one bridge, links shaped by tc; see the module docstring.

    ``up()`` starts it (refuses if a cluster of that name is already up, unless
    ``replace=True``; leftovers of a crashed or partial one are cleaned first),
    ``down()`` stops it (idempotent), ``env()`` is the client environment,
    ``exec_argv(cmd)`` runs a command in the head's namespace with that env, ``kill_node(k)`` loses
    node k at once (every process SIGKILLed) and ``start_node(k)`` starts it again.
    """

    def __init__(self, name: str = DEFAULT_NAME, nodes: int = 2, cpus_per_node: int = 1,
                 bandwidth_mbit: float = 100, latency_ms: Optional[float] = None,
                 state_dir: Optional[str] = None, subnet: Optional[str] = None,
                 object_store_bytes: int = DEFAULT_OBJECT_STORE_BYTES, gloo_ifname: bool = True,
                 node_local_dirs: Sequence[str] = ()):
        check_name(name)
        if not 1 <= int(nodes) <= MAX_NODES:
            raise EmulateError(f"--nodes {nodes}: need 1..{MAX_NODES}")
        if int(cpus_per_node) != cpus_per_node or cpus_per_node < 1:
            raise EmulateError(f"--cpus-per-node {cpus_per_node}: need a whole number >= 1 (Ray's --num-cpus)")
        if bandwidth_mbit <= 0:
            raise EmulateError("--bandwidth-mbit must be positive")
        if latency_ms is not None and latency_ms < 0:
            raise EmulateError("--latency-ms must be >= 0")
        self.name = name
        self.nodes = int(nodes)
        self.cpus_per_node = int(cpus_per_node)
        self.bandwidth_mbit = bandwidth_mbit
        self.latency_ms = latency_ms or None
        self.object_store_bytes = int(object_store_bytes)
        #: export GLOO_SOCKET_IFNAME to the nodes (False: leave it to the job, as rayemb's RayembTorchConfig does)
        self.gloo_ifname = bool(gloo_ifname)
        #: directories each node but the head sees as an empty disk of its own (a tmpfs in a private mount
        #: namespace), as the local disks of a real cluster's machines: what a process on another node writes
        #: there, the head and the drivers never see. Every other path stays shared.
        self.node_local_dirs = [os.path.abspath(d) for d in node_local_dirs]
        self.short = short_name(name)
        self.state_dir = Path(state_dir).resolve() if state_dir else REPO / "runs" / "emulate" / name
        try:
            self.subnet = ipaddress.IPv4Network(subnet) if subnet else default_subnet(name)
        except ValueError as e:
            raise EmulateError(f"--subnet {subnet!r}: {e}") from None
        if self.subnet.prefixlen > 24 or not self.subnet.is_private:
            raise EmulateError(f"--subnet {self.subnet}: need a private IPv4 network of /24 or larger")
        tmp_base = os.environ.get("RAY_TMPDIR") or "/tmp"
        self.tmp_root = os.path.join(tmp_base, f"{self.short}")
        self._children: List[subprocess.Popen] = []  # `ray start`s this object launched (reaped on exit)

    # ---- names and addresses (pure)
    @property
    def bridge(self) -> str:
        return f"{self.short}-br"

    @property
    def bridge_ip(self) -> str:
        return str(self.subnet.network_address + 1)

    def ns(self, k: int) -> str:
        return f"{self.short}-n{k}"

    def host_veth(self, k: int) -> str:
        return f"{self.short}-v{k}"

    def node_ip(self, k: int) -> str:
        return str(self.subnet.network_address + FIRST_NODE_HOST + k)

    @property
    def head_ip(self) -> str:
        return self.node_ip(0)

    def node_tmp(self, k: int) -> str:
        return os.path.join(self.tmp_root, str(k))

    def node_home(self, k: int) -> Path:
        return self.state_dir / "home" / f"n{k}"

    @property
    def token_path(self) -> Path:
        return self.state_dir / TOKEN_FILE

    @property
    def shared_dir(self) -> Path:
        return self.state_dir / "shared"

    @property
    def env_path(self) -> Path:
        return self.state_dir / ENV_FILE

    @property
    def state_path(self) -> Path:
        return self.state_dir / STATE_FILE

    def env(self) -> Dict[str, str]:
        """What a Ray client of this cluster needs (written to env.sh)."""
        return {
            "RAY_ADDRESS": f"{self.head_ip}:{GCS_PORT}",
            "RAY_API_SERVER_ADDRESS": f"http://{self.head_ip}:{DASHBOARD_PORT}",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
            "RAYEMB_SHARED_DIR": str(self.shared_dir),
            "RAYEMB_EMULATE_HEAD_NS": self.ns(0),
        }

    def env_sh_text(self) -> str:
        lines = [f"# client environment for the emulated Ray cluster {self.name!r} ({self.nodes} node(s),"
                 f" {self.bandwidth_mbit:g} mbit{f', {self.latency_ms:g} ms' if self.latency_ms else ''});"
                 f" written by cluster/emulate.py up"]
        lines += ["unset RAY_AUTH_TOKEN  # it would win over RAY_AUTH_TOKEN_PATH"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in self.env().items()]
        return "\n".join(lines) + "\n"

    def node_env(self, k: int, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """Environment of node k's `ray start` (every Ray process of the node inherits it)."""
        env = dict(os.environ if base is None else base)
        for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN", "RAY_NODE_IP_ADDRESS"):
            env.pop(var, None)
        bin_dir = os.path.dirname(_ray_bin())
        env.update({
            "HOME": str(self.node_home(k)),
            "RAY_TMPDIR": self.node_tmp(k),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAYEMB_SHARED_DIR": str(self.shared_dir),
            "RAYEMB_WORKSPACE": str(REPO),
            "PATH": bin_dir + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
        })
        if self.gloo_ifname:
            env["GLOO_SOCKET_IFNAME"] = IFNAME
        else:
            env.pop("GLOO_SOCKET_IFNAME", None)
        return env

    def ray_start_argv(self, k: int) -> List[str]:
        argv = [_ray_bin(), "start", "--node-ip-address", self.node_ip(k),
                "--num-cpus", str(self.cpus_per_node), "--num-gpus", "0",
                "--object-store-memory", str(self.object_store_bytes),
                "--temp-dir", self.node_tmp(k), "--disable-usage-stats", "--block"]
        if k == 0:
            argv[2:2] = ["--head", "--port", str(GCS_PORT), "--include-dashboard", "true",
                         "--dashboard-host", self.head_ip, "--dashboard-port", str(DASHBOARD_PORT)]
        else:
            argv[2:2] = ["--address", f"{self.head_ip}:{GCS_PORT}"]
        return argv

    def node_start_argv(self, k: int) -> List[str]:
        """Node k's `ray start`, on node-local tmpfs mounts of ``node_local_dirs`` when it is not the head."""
        argv = self.ray_start_argv(k)
        if k == 0 or not self.node_local_dirs:
            return argv
        mounts = " && ".join(f"mount -t tmpfs -o size=1g,mode=0755 rayemb-node-local {shlex.quote(d)}"
                             for d in self.node_local_dirs)
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh",
                *argv]

    def tc_argvs(self, dev: str) -> List[List[str]]:
        """tc commands shaping egress of `dev`: tbf at the rate, after netem delay (half the latency)."""
        rate_bytes = self.bandwidth_mbit * 1e6 / 8
        burst = max(32 * 1024, int(rate_bytes / 250))  # at least one timer tick (HZ=250) of data
        tbf = ["tbf", "rate", f"{self.bandwidth_mbit:g}mbit", "burst", str(burst), "latency", "50ms"]
        if not self.latency_ms:
            return [["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", *tbf]]
        half_us = max(1, round(self.latency_ms * 1000 / 2))
        return [["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "netem",
                 "delay", f"{half_us}us", "limit", "100000"],
                ["tc", "qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", *tbf]]

    def node_exec_argv(self, k: int, cmd: Sequence[str]) -> List[str]:
        """`cmd` inside node k's namespace (no environment changes)."""
        return ["ip", "netns", "exec", self.ns(k), *cmd]

    def exec_argv(self, cmd: Sequence[str]) -> List[str]:
        """`cmd` inside the head's namespace with the client env, GLOO_SOCKET_IFNAME and the venv on PATH."""
        env = dict(self.env())
        if self.gloo_ifname:
            env["GLOO_SOCKET_IFNAME"] = IFNAME
        env["RAYEMB_WORKSPACE"] = str(REPO)
        env["PATH"] = os.path.dirname(_ray_bin()) + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
        unset = ["-u", "RAY_AUTH_TOKEN"] + ([] if self.gloo_ifname else ["-u", "GLOO_SOCKET_IFNAME"])
        return self.node_exec_argv(0, ["env", *unset, *(f"{k}={v}" for k, v in env.items()),
                                       *cmd])

    # ---- state
    def _load_state(self) -> Optional[dict]:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return None

    def _save_state(self, state: dict) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.state_path)

    def _new_state(self) -> dict:
        return {
            "schema_version": 1, "name": self.name, "short": self.short, "status": "starting",
            "nodes": self.nodes, "cpus_per_node": self.cpus_per_node, "bandwidth_mbit": self.bandwidth_mbit,
            "latency_ms": self.latency_ms, "subnet": str(self.subnet), "ifname": IFNAME,
            "bridge": self.bridge, "bridge_ip": self.bridge_ip,
            "node": [{"ns": self.ns(k), "ip": self.node_ip(k), "host_veth": self.host_veth(k),
                      "tmp": self.node_tmp(k), "netns_inode": None, "procs": []} for k in range(self.nodes)],
            "env": self.env(), "created": time.time(),
        }

    @staticmethod
    def _proc_alive(rec: dict) -> bool:
        return _proc_start_time(rec["pid"]) == rec["start_time"]

    # ---- lifecycle
    def is_up(self) -> bool:
        """Whether a cluster of this name has any process alive (recorded or inside its namespaces)."""
        return bool(self._live_pids(self._load_state()))

    def _live_pids(self, state: Optional[dict]) -> List[int]:
        pids = set()
        for ns in self._existing_namespaces():
            ino = _netns_inode(f"/run/netns/{ns}")
            if ino is not None:
                pids.update(_pids_in_netns(ino))
        for node in (state or {}).get("node", []):
            for rec in node.get("procs", []):
                if self._proc_alive(rec):
                    pids.add(rec["pid"])
        return sorted(pids)

    def _existing_namespaces(self) -> List[str]:
        out = _run(["ip", "netns", "list"], check=False).stdout
        names = [line.split()[0] for line in out.splitlines() if line.strip()]
        return [n for n in names if n.startswith(f"{self.short}-n")]

    def _existing_links(self) -> List[str]:
        out = _run(["ip", "-o", "link", "show"], check=False).stdout
        names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
        return [n for n in names if n.startswith(f"{self.short}-")]

    def up(self, replace: bool = False, timeout_s: float = READY_TIMEOUT_S) -> "EmulatedCluster":
        _require_root()
        state = self._load_state()
        if self._live_pids(state):
            if not replace:
                head = (state or {}).get("env", {}).get("RAY_ADDRESS", self.head_ip)
                raise EmulateError(
                    f"an emulated cluster named {self.name!r} is already up (head {head}, state"
                    f" {self.state_path}); stop it with `cluster/emulate.sh down --name {self.name}`"
                    " or start over with `up --replace`")
            _log(f"replacing the running cluster {self.name!r}")
        if state or self._existing_namespaces() or self._existing_links():
            self.down(quiet=not replace)
        self._check_subnet_free()
        for k in range(self.nodes):
            if len(self.node_tmp(k)) > MAX_SOCKET_DIR:
                raise EmulateError(
                    f"node temp dir {self.node_tmp(k)} is too long for Ray's unix sockets (< 108 bytes in"
                    f" all); set RAY_TMPDIR to a short directory (e.g. /tmp)")
        state = self._new_state()
        self._save_state(state)
        try:
            self._prepare_dirs()
            self._create_network(state)
            self._start_nodes(state, timeout_s)
            self._wait_ready(timeout_s)
        except BaseException:
            _log("start-up failed; removing what was created (logs stay in"
                 f" {self.state_dir / 'logs'})")
            try:
                self.down(quiet=True)
            except Exception as e:  # report the original error
                _log(f"clean-up after the failed start also failed: {e}")
            raise
        state["status"] = "up"
        self._save_state(state)
        old = os.umask(0o077)
        try:
            self.env_path.write_text(self.env_sh_text())
        finally:
            os.umask(old)
        os.chmod(self.env_path, 0o600)
        _log(f"cluster {self.name!r} is up: {self.nodes} node(s), head {self.head_ip}"
             + (f", workers ..{self.node_ip(self.nodes - 1)}" if self.nodes > 1 else "")
             + f", {self.bandwidth_mbit:g} mbit per node link; client env {self.env_path}")
        return self

    def _prepare_dirs(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.state_dir / "logs", ignore_errors=True)  # a previous cluster's
        (self.state_dir / "logs").mkdir()
        self.shared_dir.mkdir(exist_ok=True)
        for d in self.node_local_dirs:  # the mount points; the head's own copy is the host's directory
            os.makedirs(d, exist_ok=True)
        for k in range(self.nodes):
            home = self.node_home(k)
            if home.exists():
                shutil.rmtree(home)
            home.mkdir(parents=True)
            if os.path.exists(self.node_tmp(k)):
                shutil.rmtree(self.node_tmp(k))
            os.makedirs(self.node_tmp(k), mode=0o700)
        tok = self.token_path
        if not (tok.exists() and re.fullmatch(r"[0-9a-f]{64}", tok.read_text().strip())):
            tmp = tok.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            os.replace(tmp, tok)
            _log(f"created auth token {tok} (mode 0600)")
        os.chmod(tok, 0o600)

    def _check_subnet_free(self) -> None:
        addrs = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout.splitlines()
        routes = _run(["ip", "-4", "route", "show", "table", "all"], check=False).stdout.splitlines()
        for line in addrs + routes:
            for tok in line.split():
                try:
                    net = ipaddress.IPv4Network(tok, strict=False)
                except ValueError:
                    continue
                # a /24 (or narrower) already in use here; a broader route such as 10.0.0.0/8 is fine
                if "/" in tok and net.prefixlen >= self.subnet.prefixlen and net.overlaps(self.subnet):
                    raise EmulateError(
                        f"subnet {self.subnet} (derived from the name {self.name!r}) overlaps {tok} already"
                        f" on this machine ({line.strip()}); pick another --name or pass --subnet")

    def _create_network(self, state: dict) -> None:
        _log(f"creating bridge {self.bridge} ({self.bridge_ip}/{self.subnet.prefixlen}) and"
             f" {self.nodes} namespaces, links {self.bandwidth_mbit:g} mbit"
             + (f", {self.latency_ms:g} ms one-way between nodes" if self.latency_ms else ""))
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.bridge_ip}/{self.subnet.prefixlen}", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for k in range(self.nodes):
            ns, veth, peer = self.ns(k), self.host_veth(k), f"{self.short}-p{k}"
            _run(["ip", "netns", "add", ns])
            state["node"][k]["netns_inode"] = _netns_inode(f"/run/netns/{ns}")
            self._save_state(state)
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
            _run(["ip", "link", "set", peer, "netns", ns])
            _run(["ip", "link", "set", veth, "master", self.bridge])
            _run(["ip", "link", "set", veth, "up"])
            inside = ["ip", "netns", "exec", ns]
            _run([*inside, "ip", "link", "set", peer, "name", IFNAME])
            _run([*inside, "ip", "addr", "add", f"{self.node_ip(k)}/{self.subnet.prefixlen}", "dev", IFNAME])
            _run([*inside, "ip", "link", "set", IFNAME, "up"])
            _run([*inside, "ip", "link", "set", "lo", "up"])
            # no default route on purpose: with one, DNS queries leave for a server they cannot reach
            # and every lookup (e.g. torch c10d's reverse lookup of a peer) stalls for the resolver's
            # timeout; without one they fail at once. Nodes reach each other and the host (bridge_ip).
            for argv in self.tc_argvs(veth):  # traffic into the node
                self._tc(argv)
            for argv in self.tc_argvs(IFNAME):  # traffic out of the node
                self._tc([*inside, *argv])

    def _tc(self, argv: List[str]) -> None:
        proc = _run(argv, check=False)
        if proc.returncode == 0:
            return
        kind = "netem" if "netem" in argv else "tbf" if "tbf" in argv else None
        if kind and "unknown" in proc.stderr.lower():
            raise EmulateError(
                f"this kernel has no `{kind}` qdisc (sch_{kind}): `{shlex.join(argv)}` says"
                f" {proc.stderr.strip()!r}. Load it (modprobe sch_{kind})"
                + (", or run without --latency-ms (bandwidth shaping alone needs only tbf)" if kind == "netem"
                   else ""))
        raise EmulateError(f"`{shlex.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")

    def _launch(self, k: int, attempt: int) -> subprocess.Popen:
        log_path = self.state_dir / "logs" / f"n{k}.log"
        with open(log_path, "ab") as log:
            log.write(f"\n===== attempt {attempt}: {shlex.join(self.node_start_argv(k))}\n".encode())
            log.flush()
            return subprocess.Popen(self.node_exec_argv(k, self.node_start_argv(k)), env=self.node_env(k),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=str(REPO))

    def _start_nodes(self, state: dict, timeout_s: float) -> None:
        for k in range(self.nodes):
            self._start_node(state, k, timeout_s)

    def _start_node(self, state: dict, k: int, timeout_s: float) -> None:
        for attempt in range(1, START_ATTEMPTS + 1):
            _log(f"starting ray {'head' if k == 0 else 'worker'} node {k} in {self.ns(k)} at"
                 f" {self.node_ip(k)} (attempt {attempt}/{START_ATTEMPTS})")
            log_path = self.state_dir / "logs" / f"n{k}.log"
            offset = log_path.stat().st_size if log_path.exists() else 0
            proc = self._launch(k, attempt)
            self._children.append(proc)
            rec = {"pid": proc.pid, "pgid": proc.pid, "start_time": _proc_start_time(proc.pid),
                   "attempt": attempt}
            state["node"][k]["procs"].append(rec)
            self._save_state(state)
            why = self._wait_started(proc, log_path, offset + 1, max(timeout_s, NODE_START_TIMEOUT_S))
            if why is None:
                return
            _log(f"node {k} did not start: {why}")
            self._stop_node(state["node"][k], grace_s=10)
            if attempt == START_ATTEMPTS:
                raise EmulateError(f"ray node {k} did not start after {START_ATTEMPTS} attempts ({why});"
                                   f" see {log_path} and {self.node_tmp(k)}/session_latest/logs")

    @staticmethod
    def _wait_started(proc: subprocess.Popen, log_path: Path, offset: int, timeout_s: float) -> Optional[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(log_path, "rb") as f:
                f.seek(offset)
                if _STARTED.encode() in f.read():
                    return None
            if proc.poll() is not None:
                return f"`ray start` exited with {proc.returncode}"
            time.sleep(0.5)
        return f"`ray start` printed no '{_STARTED}' within {timeout_s:.0f} s"

    def _wait_ready(self, timeout_s: float) -> None:
        """Until the GCS lists every node alive at its address and the head's dashboard and agent answer."""
        want = sorted(self.node_ip(k) for k in range(self.nodes))
        code = (
            "import json, sys, time\n"
            "from ray._raylet import GcsClient\n"
            "c = GcsClient(address=sys.argv[1])\n"
            "deadline = time.monotonic() + float(sys.argv[2]); want = json.loads(sys.argv[3]); got = []\n"
            "while time.monotonic() < deadline:\n"
            "    try:\n"
            "        infos = c.get_all_node_info(timeout=10).values()\n"
            "        got = sorted(i.node_manager_address for i in infos if i.state == 0)\n"
            "    except Exception as e:\n"
            "        got = [repr(e)]\n"
            "    if got == want: break\n"
            "    time.sleep(1)\n"
            "print(json.dumps(got))\n"
        )
        env = dict(os.environ)
        env.update(self.env())
        env.pop("RAY_AUTH_TOKEN", None)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", code, f"{self.head_ip}:{GCS_PORT}", str(timeout_s),
                               json.dumps(want)], env=env, capture_output=True, text=True, timeout=timeout_s + 60)
        try:
            got = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            got = None
        if got != want:
            raise EmulateError(
                f"the cluster did not show {self.nodes} alive nodes {want} within {timeout_s:.0f} s (GCS"
                f" answered {got}; {proc.stderr.strip()[-500:]}). See the node logs in"
                f" {self.state_dir / 'logs'}; if nodes cannot reach {self.head_ip}, check that the bridge"
                f" {self.bridge} forwards (a firewall with bridge-nf-call-iptables=1 may drop bridged traffic)")
        left = max(10.0, timeout_s - (time.monotonic() - t0))
        deadline = time.monotonic() + left
        while time.monotonic() < deadline:
            if _http_status(f"http://{self.head_ip}:{DASHBOARD_PORT}/api/version") is not None and \
                    _http_status(f"http://{self.head_ip}:{AGENT_PORT}/api/healthz") == 200:
                return
            time.sleep(1)
        raise EmulateError(f"the head's dashboard (:{DASHBOARD_PORT}) or dashboard agent (:{AGENT_PORT}) on"
                           f" {self.head_ip} did not answer within {left:.0f} s; see"
                           f" {self.node_tmp(0)}/session_latest/logs/dashboard*.log")

    # ---- losing and restarting nodes
    def _up_state(self, k: int) -> dict:
        _require_root()
        state = self._load_state()
        if not state or state.get("status") != "up":
            raise EmulateError(f"cluster {self.name!r} is not up (no state in {self.state_path}): start it with"
                               " `up` first")
        if not 0 <= k < len(state["node"]):
            raise EmulateError(f"node {k}: cluster {self.name!r} has nodes 0..{len(state['node']) - 1}")
        return state

    def kill_node(self, k: int) -> List[int]:
        """SIGKILLs every process of node k at once, as a machine that loses power: no process shuts down,
        nothing is flushed. For the head that is the GCS, raylet, dashboard, every Ray worker and every driver
        or job running in its namespace. Its namespace and link stay: :meth:`start_node` starts Ray there
        again. Returns the PIDs it killed (none when the node was down already).
        """
        state = self._up_state(k)
        node = state["node"][k]

        def pids() -> List[int]:
            for child in self._children:
                child.poll()  # reap
            return self._node_pids(node)

        killed = pids()
        _log(f"killing node {k} ({self.ns(k)}): {len(killed)} processes")
        for pid in killed:
            _signal(pid, signal.SIGKILL)
        if not _wait_gone(pids, 10.0):
            raise EmulateError(f"processes {pids()} of node {k} of cluster {self.name!r} survived SIGKILL")
        return killed

    def start_node(self, k: int, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Starts node k's Ray again, in its namespace at its address, after :meth:`kill_node`.

        A head started again is a new head: its GCS starts empty (no external store), so the other nodes'
        raylets belong to a cluster that is gone; kill and start them too. Once every node runs again, waits
        as :meth:`up` does until the GCS lists them all alive and the head's dashboard and agent answer.
        """
        state = self._up_state(k)
        live = self._node_pids(state["node"][k])
        if live:
            raise EmulateError(f"node {k} of cluster {self.name!r} is running ({len(live)} processes): stop it with"
                               f" kill_node({k}) first")
        self._start_node(state, k, timeout_s)
        if all(any(self._proc_alive(r) for r in n["procs"]) for n in state["node"]):
            self._wait_ready(timeout_s)

    # ---- stopping
    def _stop_node(self, node: dict, grace_s: float = STOP_GRACE_S) -> None:
        """Stops one node's processes (a failed start attempt), leaving its namespace in place."""
        self._terminate([node], grace_s)

    def _node_pids(self, node: dict) -> List[int]:
        """The node's processes: all inside its namespace, and its recorded `ray start`s still alive."""
        pids = set()
        ino = _netns_inode(f"/run/netns/{node['ns']}")
        if ino is not None and ino == node.get("netns_inode", ino):
            pids.update(_pids_in_netns(ino))
        elif node.get("netns_inode") is not None:  # namespace file gone: its inode *and* our process group
            groups = {r["pgid"] for r in node.get("procs", [])}
            for pid in _pids_in_netns(node["netns_inode"]):
                if _proc_pgid(pid) in groups:
                    pids.add(pid)
        for rec in node.get("procs", []):
            if self._proc_alive(rec):
                pids.add(rec["pid"])
        return sorted(pids)

    def _terminate(self, nodes: List[dict], grace_s: float) -> None:
        """SIGTERM every process of these nodes at once (as `ray stop` would, but only ours), then SIGKILL.

        Signalling only the `ray start --block` leaders lets each shut its children down one by one,
        which takes 30 s or more after a Ray Train run; the whole set at once stops in a few seconds.
        """
        def pids() -> List[int]:
            for child in self._children:
                child.poll()  # reap
            return sorted({p for n in nodes for p in self._node_pids(n)})

        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            left = pids()
            if not left:
                return
            for pid in left:
                _signal(pid, sig)
            if _wait_gone(pids, wait_s):
                return
        left = [p for n in nodes for p in self._node_pids(n)]
        if left:
            raise EmulateError(f"processes {left} of cluster {self.name!r} survived SIGKILL")

    def down(self, quiet: bool = False) -> None:
        """Stops what `up` started and removes its namespaces, links, bridge and Ray temp dirs; safe to repeat.

        Keeps the state dir's token, node logs and shared dir.
        """
        _require_root()
        state = self._load_state() or {}
        nodes = list(state.get("node", []))
        known = {n["ns"] for n in nodes}
        for ns in self._existing_namespaces():  # e.g. state file lost: found by the name prefix
            if ns not in known:
                nodes.append({"ns": ns, "netns_inode": _netns_inode(f"/run/netns/{ns}"), "procs": []})
        live = [p for n in nodes for p in self._node_pids(n)]
        if live and not quiet:
            _log(f"stopping cluster {self.name!r}: {len(live)} processes")
        self._terminate(nodes, STOP_GRACE_S)
        for ns in self._existing_namespaces():
            _run(["ip", "netns", "del", ns], check=False)
        links = self._existing_links()
        for link in sorted(links, key=lambda n: n.endswith("-br")):  # veths, then the bridge
            if link in self._existing_links():
                _run(["ip", "link", "del", link], check=False)
        still = self._existing_namespaces() + self._existing_links()
        if still:
            raise EmulateError(f"could not remove {still}; see `ip netns list` and `ip link`")
        for n in nodes:
            tmp = n.get("tmp")
            if tmp and os.path.basename(os.path.dirname(tmp)) == self.short:
                shutil.rmtree(tmp, ignore_errors=True)
        if os.path.basename(self.tmp_root) == self.short:  # <RAY_TMPDIR or /tmp>/<short>: ours by name
            shutil.rmtree(self.tmp_root, ignore_errors=True)
        for p in (self.env_path, self.state_path):
            if p.exists():
                p.unlink()
        if not quiet:
            _log(f"cluster {self.name!r} is down")

    # ---- status
    def status(self) -> dict:
        state = self._load_state()
        out = {"name": self.name, "state_dir": str(self.state_dir), "recorded": state is not None,
               "namespaces": self._existing_namespaces(), "links": self._existing_links(), "nodes": []}
        for k, node in enumerate((state or {}).get("node", [])):
            alive = [r["pid"] for r in node["procs"] if self._proc_alive(r)]
            shaping = {}
            if node["ns"] in out["namespaces"]:
                shaping["in"] = _run(["tc", "qdisc", "show", "dev", node["host_veth"]], check=False).stdout.strip()
                shaping["out"] = _run(self.node_exec_argv(k, ["tc", "qdisc", "show", "dev", IFNAME]),
                                      check=False).stdout.strip()
            out["nodes"].append({"node": k, "ns": node["ns"], "ip": node["ip"], "ray_start_pids": alive,
                                 "pids_in_namespace": self._node_pids(node), "shaping": shaping})
        out["up"] = bool(state) and state.get("status") == "up" and all(n["ray_start_pids"] for n in out["nodes"])
        if state:
            out["env"] = state.get("env")
        return out

    def __enter__(self) -> "EmulatedCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pids_fn, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if not pids_fn():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)


def _http_status(url: str) -> Optional[int]:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


def _require_root() -> None:
    if os.geteuid() != 0:
        raise EmulateError("the emulated cluster needs root (ip netns, tc): run it with sudo")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise EmulateError("`ip` and `tc` (package iproute2) are needed")


# ---------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cluster/emulate.sh", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  cluster/emulate.sh up --nodes 2 --cpus-per-node 1 --bandwidth-mbit 100\n"
               "  cluster/emulate.sh exec -- python -c 'import ray; ray.init(); print(ray.nodes())'\n"
               "  cluster/emulate.sh down\nsee docs/cluster.md")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp):
        sp.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
        sp.add_argument("--state-dir", default=None, help="default: runs/emulate/<NAME> in the repo")

    up = sub.add_parser("up", help="create the namespaces and links, start a Ray node in each")
    common(up)
    up.add_argument("--nodes", type=int, required=True)
    up.add_argument("--cpus-per-node", type=int, required=True, help="Ray's --num-cpus of each node")
    up.add_argument("--bandwidth-mbit", type=float, required=True, help="rate of each node's link, each way")
    up.add_argument("--latency-ms", type=float, default=None, help="added one-way delay between two nodes")
    up.add_argument("--subnet", default=None, help="IPv4 /24 to use (default: 10.213.<k>.0/24 from NAME)")
    up.add_argument("--object-store-mb", type=int, default=DEFAULT_OBJECT_STORE_BYTES // 1_000_000)
    up.add_argument("--replace", action="store_true", help="stop a running cluster of this name first")
    up.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for the nodes")
    for name, text in (("down", "stop the Ray nodes, remove namespaces, links, bridge"),
                       ("status", "nodes, addresses, live processes, shaping (exit 1 when not up)"),
                       ("env", "print the client environment (env.sh)")):
        common(sub.add_parser(name, help=text))
    sub.choices["status"].add_argument("--json", action="store_true")
    ex = sub.add_parser("exec", help="run a command in the head's namespace with the client environment")
    common(ex)
    ex.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _main(args)
    except EmulateError as e:
        print(f"emulate {args.cmd}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _state_cluster(args) -> EmulatedCluster:
    """The cluster a down/status/env/exec means: the recorded one (its size, subnet), else defaults."""
    c = EmulatedCluster(args.name, state_dir=args.state_dir)
    state = c._load_state()
    if state:
        c = EmulatedCluster(args.name, nodes=state["nodes"], cpus_per_node=state["cpus_per_node"],
                            bandwidth_mbit=state["bandwidth_mbit"], latency_ms=state["latency_ms"],
                            state_dir=args.state_dir, subnet=state["subnet"])
    return c


def _main(args) -> int:
    if args.cmd == "up":
        c = EmulatedCluster(args.name, args.nodes, args.cpus_per_node, args.bandwidth_mbit, args.latency_ms,
                            args.state_dir, args.subnet, args.object_store_mb * 1_000_000)
        c.up(replace=args.replace, timeout_s=args.timeout)
        sys.stdout.write(c.env_sh_text())
        return 0
    c = _state_cluster(args)
    if args.cmd == "down":
        c.down()
        return 0
    if args.cmd == "status":
        st = c.status()
        if args.json:
            print(json.dumps(st, indent=1))
        elif not st["recorded"] and not st["namespaces"]:
            print(f"cluster {args.name!r}: not up")
        else:
            print(f"cluster {args.name!r}: {'up' if st['up'] else 'NOT fully up'} (state {st['state_dir']})")
            for n in st["nodes"]:
                print(f"  node {n['node']}: {n['ns']} {n['ip']} ray start pid {n['ray_start_pids'] or 'dead'},"
                      f" {len(n['pids_in_namespace'])} processes in the namespace")
                for way, text in n["shaping"].items():
                    for line in text.splitlines():
                        print(f"    {way:3s} {line}")
            expected = {c.bridge} | {c.ns(n["node"]) for n in st["nodes"]}
            expected |= {c.host_veth(n["node"]) for n in st["nodes"]}
            leftovers = [x for x in st["namespaces"] + st["links"] if x not in expected]
            if leftovers:
                print(f"  also present: {' '.join(leftovers)}")
        return 0 if st["up"] else 1
    if args.cmd == "env":
        if not c.env_path.exists():
            raise EmulateError(f"cluster {args.name!r} is not up (no {c.env_path})")
        sys.stdout.write(c.env_path.read_text())
        return 0
    if args.cmd == "exec":
        cmd = list(args.command)
        if cmd and cmd[0] == "--":
            cmd = cmd[1:]
        if not cmd:
            raise EmulateError("exec needs a command: cluster/emulate.sh exec -- CMD ARGS...")
        if not c.is_up():
            raise EmulateError(f"cluster {args.name!r} is not up: start it with `cluster/emulate.sh up ...`")
        argv = c.exec_argv(cmd)
        os.execvp(argv[0], argv)
    return 2


if __name__ == "__main__":
    sys.exit(main())
