"""cluster/emulate.py: an emulated multi-node Ray cluster (network namespaces, shaped veth links).

The pure pieces (names, addresses, env.sh, commands) are tested everywhere; the
cluster tests need root and `ip netns` (CI runs as root) and start one 2-node
cluster for the module: 1 CPU per node, 100 mbit links. Collectives across the
namespaces (gloo, one Ray Train rank per node) run in tests/cluster/test_multinode_job.py,
whose 3-node job trains over them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from _emulated import down, needs_emulation

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from cluster import emulate  # noqa: E402
from cluster.emulate import IFNAME, EmulateError, EmulatedCluster  # noqa: E402

BANDWIDTH_MBIT = 100


# ---------------------------------------------------------------- pure pieces (no root needed)


def test_names_are_short_stable_and_distinct():
    a, b = emulate.short_name("rayemb-emu"), emulate.short_name("rayemb-emu2")
    assert a == emulate.short_name("rayemb-emu") and a != b and len(a) == 8
    c = EmulatedCluster("a-very-long-cluster-name-for-a-benchmark", nodes=200)
    for name in (c.bridge, c.host_veth(199), c.ns(199), f"{c.short}-p199", IFNAME):
        assert len(name) <= 15, name  # Linux interface names
    assert c.bridge.startswith(c.short) and c.ns(0).startswith(c.short) and c.host_veth(3).startswith(c.short)
    with pytest.raises(EmulateError, match="not valid"):
        EmulatedCluster("bad name/with slash")


def test_subnet_derives_from_name():
    s1, s2 = emulate.default_subnet("rayemb-emu"), emulate.default_subnet("bench-4")
    assert s1 == emulate.default_subnet("rayemb-emu") and s1 != s2
    for s in (s1, s2):
        assert s.prefixlen == 24 and str(s).startswith("10.213.")
    c = EmulatedCluster("x", nodes=3, subnet="10.99.7.0/24")
    assert (c.bridge_ip, c.head_ip, c.node_ip(2)) == ("10.99.7.1", "10.99.7.10", "10.99.7.12")
    with pytest.raises(EmulateError, match="private"):
        EmulatedCluster("x", subnet="8.8.8.0/24")
    with pytest.raises(EmulateError, match="1.."):
        EmulatedCluster("x", nodes=0)
    with pytest.raises(EmulateError, match="whole number"):
        EmulatedCluster("x", cpus_per_node=0.5)


def test_env_and_env_sh(tmp_path):
    c = EmulatedCluster("envtest", nodes=2, cpus_per_node=1, bandwidth_mbit=50, latency_ms=2,
                        state_dir=str(tmp_path / "st"), subnet="10.99.8.0/24")
    env = c.env()
    assert env == {
        "RAY_ADDRESS": "10.99.8.10:6379",
        "RAY_API_SERVER_ADDRESS": "http://10.99.8.10:8265",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(tmp_path / "st" / "auth_token"),
        "RAYEMB_SHARED_DIR": str(tmp_path / "st" / "shared"),
        "RAYEMB_EMULATE_HEAD_NS": c.ns(0),
    }
    text = c.env_sh_text()
    exports = dict(re.findall(r"^export (\w+)=(.*)$", text, re.M))
    assert exports == env  # no value here needs quoting
    out = subprocess.run(["bash", "-c", f"{text}\nenv"], capture_output=True, text=True, check=True,
                         env={**os.environ, "RAY_AUTH_TOKEN": "other-clusters"}).stdout.splitlines()
    assert f"RAY_ADDRESS={env['RAY_ADDRESS']}" in out
    assert not any(line.startswith("RAY_AUTH_TOKEN=") for line in out)


def test_node_env_isolates_each_node(tmp_path):
    c = EmulatedCluster("envtest", nodes=2, state_dir=str(tmp_path))
    base = {"PATH": "/usr/bin", "HOME": "/root", "RAY_ADDRESS": "1.2.3.4:6379", "RAY_AUTH_TOKEN": "secret",
            "KEEP": "1"}
    env = c.node_env(1, base)
    assert env["GLOO_SOCKET_IFNAME"] == IFNAME
    assert env["HOME"] == str(tmp_path / "home" / "n1") and env["RAY_TMPDIR"] == c.node_tmp(1)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "auth_token")
    assert env["RAYEMB_SHARED_DIR"] == str(tmp_path / "shared") and env["KEEP"] == "1"
    assert "RAY_ADDRESS" not in env and "RAY_AUTH_TOKEN" not in env
    assert env["PATH"].endswith(os.pathsep + "/usr/bin")
    assert c.node_tmp(0) != c.node_tmp(1) and os.path.dirname(c.node_tmp(0)) == c.tmp_root


def test_ray_start_commands():
    c = EmulatedCluster("cmdtest", nodes=3, cpus_per_node=2, subnet="10.99.9.0/24")
    head, worker = c.ray_start_argv(0), c.ray_start_argv(2)
    assert head[1:3] == ["start", "--head"] and worker[1] == "start" and "--head" not in worker

    def opt(argv, flag):
        return argv[argv.index(flag) + 1]

    assert opt(head, "--node-ip-address") == "10.99.9.10" and opt(head, "--port") == "6379"
    assert opt(head, "--dashboard-host") == "10.99.9.10"
    assert opt(worker, "--address") == "10.99.9.10:6379" and opt(worker, "--node-ip-address") == "10.99.9.12"
    for argv, k in ((head, 0), (worker, 2)):
        assert opt(argv, "--num-cpus") == "2" and opt(argv, "--num-gpus") == "0"
        assert opt(argv, "--temp-dir") == c.node_tmp(k) and argv[-1] == "--block"
        assert "--disable-usage-stats" in argv
    assert c.node_exec_argv(2, ["true"]) == ["ip", "netns", "exec", c.ns(2), "true"]
    ex = c.exec_argv(["python", "x.py"])
    assert ex[:7] == ["ip", "netns", "exec", c.ns(0), "env", "-u", "RAY_AUTH_TOKEN"]
    assert ex[-2:] == ["python", "x.py"]
    assert "RAY_ADDRESS=10.99.9.10:6379" in ex and f"GLOO_SOCKET_IFNAME={IFNAME}" in ex


def test_shaping_commands():
    plain = EmulatedCluster("tctest", bandwidth_mbit=100).tc_argvs("dev0")
    assert len(plain) == 1 and plain[0][:7] == ["tc", "qdisc", "replace", "dev", "dev0", "root", "handle"]
    assert plain[0][plain[0].index("rate") + 1] == "100mbit" and "tbf" in plain[0]
    netem, tbf = EmulatedCluster("tctest", bandwidth_mbit=25, latency_ms=3).tc_argvs("dev0")
    assert "netem" in netem and netem[netem.index("delay") + 1] == "1500us"  # half the one-way latency per end
    assert tbf[tbf.index("parent") + 1] == "1:1" and tbf[tbf.index("rate") + 1] == "25mbit"


def test_cli_help_and_status_of_absent_cluster(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        emulate.main(["--help"])
    assert e.value.code == 0
    assert emulate.main(["status", "--name", "absent-x", "--state-dir", str(tmp_path)]) == 1
    assert "not up" in capsys.readouterr().out


# ---------------------------------------------------------------- a real 2-node cluster (root)




needs_root = needs_emulation


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # a HOME of this module's own: the suite's other stream runs Ray in other processes under the real HOME, so
    # whether emulate.py leaves ~/.ray behind is only decidable in a HOME nothing else writes to
    home = str(tmp_path_factory.mktemp("home"))
    state_dir = str(tmp_path_factory.mktemp("emu"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", home)
        c = None
        for suffix in ("", "b", "c"):  # another cluster on this machine may hold the derived subnet
            c = EmulatedCluster(f"emutest-{os.getpid()}{suffix}", nodes=2, cpus_per_node=1,
                                bandwidth_mbit=BANDWIDTH_MBIT, state_dir=state_dir)
            try:
                t0 = time.monotonic()
                c.up()
                print(f"cluster up in {time.monotonic() - t0:.1f} s")
                break
            except EmulateError as e:
                if "overlaps" not in str(e) or suffix == "c":
                    raise
        yield c
        down(c)  # nodes SIGKILLed first: down's own SIGTERM path is tested below, and waits out a hung GCS here


def _driver(cluster, tmp_path, code: str, timeout: float) -> dict:
    """Runs `code` as a Ray driver inside the head's namespace; returns what it printed after RESULT."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(code))
    proc = subprocess.run(cluster.exec_argv([sys.executable, str(script)]), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"driver failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                           f"{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@needs_root
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nodes_tasks_and_environment(cluster, tmp_path):
    out = _driver(cluster, tmp_path, """
        import json, os, ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        ray.init(logging_level="WARNING")
        nodes = [n for n in ray.nodes() if n["Alive"]]

        @ray.remote(num_cpus=1)
        def where():
            import os, ray
            return [ray.util.get_node_ip_address(), os.environ.get("GLOO_SOCKET_IFNAME"),
                    os.environ.get("RAYEMB_SHARED_DIR"), os.environ.get("RAY_AUTH_MODE")]

        tasks = {n["NodeManagerAddress"]: ray.get(where.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote())
            for n in nodes}
        print("RESULT " + json.dumps({"nodes": sorted(n["NodeManagerAddress"] for n in nodes), "tasks": tasks}))
    """, timeout=120)
    ips = [cluster.node_ip(0), cluster.node_ip(1)]
    assert out["nodes"] == sorted(ips)
    for ip in ips:
        assert out["tasks"][ip] == [ip, IFNAME, str(cluster.shared_dir), "token"]


@needs_root
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_links_are_shaped(cluster):
    """5 MB from node 0 to node 1 cannot go faster than the 100 mbit links (an unshaped veth does GB/s)."""
    size, port = 5_000_000, 23456
    server = subprocess.Popen(cluster.node_exec_argv(1, [sys.executable, "-c", textwrap.dedent(f"""
        import socket
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("{cluster.node_ip(1)}", {port})); s.listen(1); s.settimeout(60)
        c, _ = s.accept(); n = 0
        while True:
            b = c.recv(1 << 20)
            if not b: break
            n += len(b)
        c.sendall(str(n).encode()); c.close()
    """)]))
    try:
        client = subprocess.run(cluster.node_exec_argv(0, [sys.executable, "-c", textwrap.dedent(f"""
            import socket, time
            for _ in range(200):
                try:
                    c = socket.create_connection(("{cluster.node_ip(1)}", {port}), timeout=60); break
                except OSError:
                    time.sleep(0.05)
            data = b"x" * {size}; t0 = time.monotonic()
            c.sendall(data); c.shutdown(socket.SHUT_WR); ack = c.recv(64)
            print(ack.decode(), time.monotonic() - t0)
        """)]), capture_output=True, text=True, timeout=60, check=True)
    finally:
        server.wait(timeout=30)
    received, seconds = client.stdout.split()
    ideal = size / (BANDWIDTH_MBIT * 1e6 / 8)
    print(f"{size} bytes in {float(seconds):.3f} s ({size / float(seconds) / 1e6:.1f} MB/s; link {ideal:.3f} s)")
    assert int(received) == size
    assert float(seconds) >= 0.8 * ideal


@needs_root
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_env_file_token_and_status(cluster):
    assert stat.S_IMODE(os.stat(cluster.env_path).st_mode) == 0o600
    assert cluster.env_path.read_text() == cluster.env_sh_text()
    assert stat.S_IMODE(os.stat(cluster.token_path).st_mode) == 0o600
    assert re.fullmatch(r"[0-9a-f]{64}", cluster.token_path.read_text())
    st = cluster.status()
    assert st["up"] and [n["ip"] for n in st["nodes"]] == [cluster.node_ip(0), cluster.node_ip(1)]
    for n in st["nodes"]:
        assert "tbf" in n["shaping"]["in"] and "tbf" in n["shaping"]["out"]
    with pytest.raises(EmulateError, match="already up"):
        EmulatedCluster(cluster.name, nodes=2, state_dir=str(cluster.state_dir)).up()


@needs_root
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_job_submit_from_the_host(cluster, tmp_path):
    """The host reaches the head's dashboard over the bridge: `ray job submit` with env.sh works."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(cluster.env())
    (tmp_path / "job.py").write_text("import os, ray\nray.init()\n"
                                     "print('JOBOUT', len(ray.nodes()), os.environ['GLOO_SOCKET_IFNAME'])\n")
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    proc = subprocess.run([ray_bin, "job", "submit", "--working-dir", str(tmp_path), "--", "python", "job.py"],
                          env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"JOBOUT 2 {IFNAME}" in proc.stdout


@needs_root
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_down_after_a_crash_removes_everything_and_repeats(cluster):
    state = json.loads(cluster.state_path.read_text())
    recorded = [r for n in state["node"] for r in n["procs"]]
    # a crash: the worker's `ray start` dies without cleaning up; and a stray namespace of ours
    os.kill(state["node"][1]["procs"][-1]["pid"], signal.SIGKILL)
    subprocess.run(["ip", "netns", "add", f"{cluster.short}-n9"], check=True)
    t0 = time.monotonic()
    cluster.down()
    print(f"down in {time.monotonic() - t0:.1f} s")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert cluster.short not in netns and cluster.short not in links
    for r in recorded:
        assert emulate._proc_start_time(r["pid"]) != r["start_time"], f"pid {r['pid']} still runs"
    for n in state["node"]:
        assert not os.path.exists(n["tmp"])
        assert not emulate._pids_in_netns(n["netns_inode"])
    assert not cluster.env_path.exists() and not cluster.state_path.exists()
    cluster.down()  # again: nothing to do, still succeeds
    assert emulate.main(["status", "--name", cluster.name, "--state-dir", str(cluster.state_dir)]) == 1
    assert not os.path.exists(os.path.join(os.environ["HOME"], ".ray"))  # the module's own HOME (its fixture)
