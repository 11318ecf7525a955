"""Training on more data than the workers' memory: a streamed job under a cgroup memory limit, and the
streamed data path's rows/s per worker CPU.

    python jobs/bench/streamed_memory.py --rows 40000000 --runs 5 \
        [--out bench-results/streamed_memory_<YYYY-MM-DD>_<commit7>.json]

Needs root and cgroup v1's memory controller (``/sys/fs/cgroup/memory``); on another machine it says
why it cannot run.

**Memory.** A synthetic dataset (:mod:`rayemb.data.synthetic`: 2 multi-hot tables of ``--pooling`` ids
per row, ``--cardinality`` rows each, near-uniform ids, so that parquet keeps about 5 bytes of each 8-byte
id) is written by ``--gen-procs`` generators side by side. A Ray head (``ray start --head --block``)
joins a new memory cgroup, a child of this process's own, before it starts anything, so every process it
starts is created inside: GCS, raylet and its agents, Ray Train's actors and workers, Ray Data's read
tasks. The object store is capped (``--store-mib``) and counted inside the limit: it lives in /dev/shm
pages, which cgroup v1 charges to the cgroup of the process that first touches them (the raylet and the
workers, all inside). Objects that do not fit go to fallback and spill files on disk, whose page cache
is charged too but is reclaimable. A real ``rayemb train`` job (``data.in_memory`` left to its default,
1 worker, 1 epoch) runs against the head from outside the cgroup.

The limit starts at a ceiling (``--ceiling-gib``, protecting the machine while the job starts). Once
the job has trained ``--tighten-at`` of its epoch, it becomes the peak so far of what the cgroup's
processes hold (anonymous memory plus shmem, sampled; not the page cache, which reading the dataset and
spilling fill up to any ceiling and which the kernel reclaims at the limit) plus a headroom
of 1/``--ratio`` of the data the job has still to read (the rest of the train split and the whole valid
split, the smaller of its parquet and converted sizes), at most ``--headroom-mib``; peak and failure
count are reset there. The job must then finish the epoch without an OOM kill: after that point it reads
at least ``--ratio`` x more data than it was given memory beyond what it held when training began. The
job writes a checkpoint every ``0.8 x --tighten-at`` of the epoch, so that peak holds one: a checkpoint
adds a transient of several hundred MiB to the worker whatever the data's size, and the epoch end writes
one too. The record also gives the whole dataset over the workers' share of the final limit (the limit
less the object store and Ray's daemons, measured on the idle head); ``--share-ratio`` (4) makes the
verdict ask it too. On the 2-core development machine Ray's processes with one worker take about 4 GiB
before any data, so that share is about 5 GiB with the default headroom and the default ``--rows``
(about 24 GiB of parquet, 40 GiB converted) is sized for it.

``memory.failcnt`` counts every charge that met the limit, including those served by reclaiming page
cache (parquet pages, spill files); an OOM kill is ``oom_kill`` of ``memory.oom_control``. Peak usage
cannot pass the limit in cgroup v1 (the kernel reclaims or kills first), so the record also keeps the
sampled peak of what cannot be reclaimed: anonymous memory plus shmem (the object store).

**Rows/s.** On the same head (limit back at the ceiling), an actor of 1 CPU iterates a
:class:`~rayemb.train.worker.data_loader.RankBatches` over a Ray Data shard of the train split
(``streaming_split``, as Ray Train hands a rank its shard) with the job's converter, every table hybrid
with the statistics' heavy hitters as hot ids (the remap a hybrid plan runs): Ray Data's read, the
conversion and the hybrid remap, without a training step. Batch 512 and 8192 alternate over ``--runs``
rounds after a warm-up pass; each pass is timed from its first batch to its last (Ray Data's start is
left out and reported apart). Per worker CPU: rows/s over the actor's 1 CPU; ``worker_cpu_busy``, the
share of that CPU the actor used (below 1: it waited for Ray Data's read tasks, which run on the head's
other ``--cpus``), and ``rows_per_worker_cpu_s``, rows per second of the actor's own CPU time. ``--data``
runs both parts on an existing dataset instead, e.g. one's own, whose rows/s is the one that matters.

Writes ``{"schema_version": 1, "setup", "memory": {...}, "runs": [...], "rows": [...], "verdict"}``
and prints a table. The verdict FAILs when the memory row or a rate row is missing, the job did not
finish every step streamed under the limit, or a rate row has a failed run or fewer than 3 runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, spread  # noqa: E402
from host_cpu import _cmdline  # noqa: E402

from cluster.fake_autoscaler import free_port  # noqa: E402

MIB, GIB = 2**20, 2**30
CGROUP_MEMORY = "/sys/fs/cgroup/memory"
BATCH_SIZES = (512, 8192)
MIN_RUNS = 3
RATIO = 4.0
#: the job's progress line, e.g. "rayemb: epoch 1/1 step 120/439 (27%) ..."
PROGRESS = re.compile(r"epoch \d+/\d+ step (\d+)/(\d+)")
#: what the job prints when it streams (rayemb/train/driver/trainer.py)
STREAMED_LINE = "data streamed from Ray Data"
#: environment that would point the head or the driver at another cluster
_SCRUBBED_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "MLFLOW_TRACKING_URI")
COLUMNS = [("row", "<10", "{}"), ("runs", ">4", "{}"), ("failed", ">6", "{}"), ("rows/s", ">10", "{:,.0f}"),
           ("min", ">10", "{:,.0f}"), ("max", ">10", "{:,.0f}"), ("/worker CPU", ">11", "{:,.0f}"),
           ("busy", ">5", "{:.2f}"), ("rows/CPU-s", ">10", "{:,.0f}"), ("M ids/s", ">8", "{:.2f}"),
           ("MB/s", ">7", "{:.0f}"), ("start s", ">7", "{:.1f}")]
KEYS = ["row", "runs", "failed", "rows_per_s", "rows_per_s_min", "rows_per_s_max", "per_worker_cpu",
        "worker_cpu_busy", "rows_per_worker_cpu_s", "m_ids_per_s", "mb_per_s", "start_s"]


def default_out(repo: str = _REPO) -> str:
    """``bench-results/streamed_memory_<YYYY-MM-DD>_<commit7>.json``."""
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=repo, capture_output=True, text=True,
                            check=False).stdout.strip() or "unknown"
    return os.path.join(repo, "bench-results", f"streamed_memory_{datetime.date.today().isoformat()}_{commit}.json")


# ---- the memory cgroup ---- #


def own_memory_cgroup() -> Optional[str]:
    """This process's cgroup-v1 memory cgroup folder, or None without one."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if "memory" in controllers.split(","):
                    return os.path.join(CGROUP_MEMORY, path.lstrip("/"))
    except OSError:
        return None
    return None


def cgroup_problem() -> str:
    """Why no memory cgroup can be made here ("" when one can)."""
    parent = own_memory_cgroup()
    if parent is None or not os.path.isfile(os.path.join(parent, "memory.limit_in_bytes")):
        return f"no cgroup-v1 memory controller for this process under {CGROUP_MEMORY} (cgroup v2 only, or none)"
    probe = os.path.join(parent, f"rayemb-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as e:
        return f"cannot create a child memory cgroup under {parent}: {e.strerror} (needs root, a writable cgroupfs)"
    return ""


class MemoryCgroup:
    """A child memory cgroup of this process's own (cgroup v1): its limit, peak, failures, OOM kills."""

    def __init__(self, limit_bytes: int, name: Optional[str] = None) -> None:
        parent = own_memory_cgroup()
        if parent is None:
            raise RuntimeError(cgroup_problem())
        self.path = os.path.join(parent, name or f"rayemb-mem-{os.getpid()}-{int(time.time())}")
        os.mkdir(self.path)
        self.set_limit(limit_bytes)

    def _read(self, name: str) -> str:
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def _write(self, name: str, value: Any) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(str(value))

    def set_limit(self, limit_bytes: int) -> None:
        self._write("memory.limit_in_bytes", int(limit_bytes))

    def limit(self) -> int:
        return int(self._read("memory.limit_in_bytes"))

    def usage(self) -> int:
        return int(self._read("memory.usage_in_bytes"))

    def peak(self) -> int:
        return int(self._read("memory.max_usage_in_bytes"))

    def failcnt(self) -> int:
        return int(self._read("memory.failcnt"))

    def oom_control(self) -> Dict[str, int]:
        """``oom_kill_disable``, ``under_oom`` and ``oom_kill`` (the OOM kills inside it so far)."""
        return {k: int(v) for k, v in (ln.split() for ln in self._read("memory.oom_control").splitlines())}

    def stat(self) -> Dict[str, int]:
        return {k: int(v) for k, v in (ln.split() for ln in self._read("memory.stat").splitlines())}

    def reset_peak(self) -> None:
        """Peak usage and failure count start again from now."""
        self._write("memory.max_usage_in_bytes", 0)
        self._write("memory.failcnt", 0)

    def pids(self) -> List[int]:
        return [int(p) for p in self._read("cgroup.procs").split()]

    def join(self) -> None:
        """Moves the calling process in (as ``preexec_fn``: the child joins before it runs anything)."""
        self._write("cgroup.procs", os.getpid())

    def remove(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def process_kind(cmdline: str) -> str:
    """A short name for a process of the head: ``ray::<actor or task>``'s name, else its program."""
    if cmdline.startswith("ray::"):
        return re.split(r"[ .(]", cmdline[5:], maxsplit=1)[0]
    words = cmdline.split() or [""]
    if len(words) > 2 and words[1].endswith("/ray") and words[2] == "start":
        return "ray start"
    if os.path.basename(words[0]).startswith("python"):  # a Python daemon: its module or script
        if "-m" in words[:-1]:
            return words[words.index("-m") + 1]
        return os.path.basename(next((w for w in words[1:] if w.endswith(".py")), words[0]))
    return os.path.basename(words[0])


class MemorySampler:
    """Samples the cgroup every ``interval_s``: usage, anonymous memory + shmem, shmem, and the kinds of
    process in it. ``mark()`` starts the peaks again (when the limit is tightened)."""

    def __init__(self, cgroup: MemoryCgroup, interval_s: float = 0.25) -> None:
        self.cgroup, self.interval_s = cgroup, interval_s
        self.kinds: set = set()
        self.peak_anon_shmem = self.peak_shmem = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cgroup-sampler", daemon=True)
        self._thread.start()

    def mark(self) -> None:
        self.peak_anon_shmem = self.peak_shmem = 0

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                s = self.cgroup.stat()
                self.peak_anon_shmem = max(self.peak_anon_shmem, s["total_rss"] + s["total_shmem"])
                self.peak_shmem = max(self.peak_shmem, s["total_shmem"])
                if n % 4 == 0:
                    self.kinds.update(process_kind(_cmdline(pid)) for pid in self.cgroup.pids())
            except (OSError, KeyError, ValueError):
                pass
            n += 1
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# ---- the head inside it ---- #


def _scrubbed_env(home: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    # Ray rewrites a loopback address to the host's outward one unless this is 0: head and driver both
    # stay on 127.0.0.1
    env.update({"HOME": home, "RAY_TMPDIR": home, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                "RAY_USAGE_STATS_ENABLED": "0"})
    return env


class CgroupHead:
    """``ray start --head --block`` on 127.0.0.1 whose every process lives in ``cgroup``.

    The head joins the cgroup between fork and exec, before it has started anything. ``stop`` sends SIGTERM
    to the head's PID and after a grace period SIGKILLs, by PID, whatever is still in the cgroup: only
    processes the head started can be there.
    """

    def __init__(self, cgroup: MemoryCgroup, cpus: int, store_bytes: int, base_dir: str) -> None:
        self.cgroup, self.cpus, self.store_bytes = cgroup, cpus, store_bytes
        self.dir = tempfile.mkdtemp(prefix="rsm", dir=base_dir)  # short: Ray's socket paths live under it
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self._log = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.dir, "head.log")

    def env(self) -> Dict[str, str]:
        """The environment of a driver of this head."""
        return dict(_scrubbed_env(self.dir), RAY_ADDRESS=self.address)

    def start(self, timeout_s: float = 120.0) -> None:
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        cmd = [ray, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={self.port}",
               f"--num-cpus={self.cpus}", "--num-gpus=0", f"--object-store-memory={self.store_bytes}",
               f"--temp-dir={os.path.join(self.dir, 't')}", "--include-dashboard=false",
               f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
               f"--metrics-export-port={free_port()}", "--disable-usage-stats"]
        self._log = open(self.log_path, "ab")
        # no drain on SIGTERM (nothing here serves traffic): else the head waits out the drain timeout for its
        # idle workers before it stops anything
        env = dict(_scrubbed_env(self.dir), RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
        self.proc = subprocess.Popen(cmd, env=env, cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=self.cgroup.join)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`ray start --head` exited with {self.proc.returncode}:\n{self.log_tail()}")
            with open(self.log_path, "rb") as f:
                if b"Ray runtime started" in f.read():
                    return
            time.sleep(0.5)
        raise RuntimeError(f"the head did not start within {timeout_s:.0f}s:\n{self.log_tail()}")

    def _alive(self) -> List[int]:
        """The cgroup's processes that have not exited (zombies left out)."""
        alive = []
        for pid in self.cgroup.pids():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except (OSError, IndexError):
                continue
        return alive

    def log_tail(self, chars: int = 3000) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-chars:]

    def stop(self, grace_s: float = 20.0) -> List[str]:
        """Stops every process of the head; returns those that needed SIGKILL."""
        if self.proc is None:
            return []
        # the head alone: it stops its daemons in order and exits within seconds, where a SIGTERM to all of them
        # at once (its process group) leaves some running until they are killed
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        # the head is reaped as soon as it exits: a zombie stays listed in the cgroup, and so do its own exited
        # children until init takes them over
        while (self.proc.poll() is None or self._alive()) and time.monotonic() < deadline:
            time.sleep(0.25)
        killed = []
        for _ in range(3):
            for pid in self._alive():
                killed.append(f"{pid} {_cmdline(pid)[:80]}")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if self.proc.poll() is not None and not self._alive():
                break
            time.sleep(0.5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return killed


# ---- the dataset ---- #


def dataset_spec(rows: int, pooling: int, cardinality: int, chunk_rows: int, seed: int) -> Dict[str, Any]:
    """SyntheticSpec fields: 2 multi-hot tables of near-uniform ids (parquet then holds them plain, not as a
    dictionary: its size stays within 2x of the converted size), one part file per ``chunk_rows``."""
    return {"rows": rows, "num_tables": 2, "multi_hot": True, "mean_pooling": float(pooling),
            "cardinalities": [cardinality, cardinality], "zipf_alpha": 0.2, "num_signal_tables": 2,
            "chunk_rows": chunk_rows, "seed": seed}


_GENERATE = ("import json, sys\nfrom rayemb.data.synthetic import SyntheticSpec, generate\n"
             "generate(SyntheticSpec(**json.loads(sys.argv[1])), sys.argv[2])\n")


def generate_dataset(out: str, spec: Mapping[str, Any], procs: int = 2) -> str:
    """The dataset of ``spec`` written by ``procs`` generator processes at once, each ``rows / procs`` rows of
    its own seed, their part files then moved into one dataset (the same schema.yaml)."""
    parts = [os.path.join(out, f".gen{i}") for i in range(procs)]
    running = []
    for i, part in enumerate(parts):
        mine = dict(spec, rows=spec["rows"] // procs + (spec["rows"] % procs if i == 0 else 0), seed=spec["seed"] + i)
        running.append(subprocess.Popen([sys.executable, "-c", _GENERATE, json.dumps(mine), part], cwd=_REPO))
    failed = [p.args for p in running if p.wait() != 0]
    if failed:
        raise RuntimeError(f"dataset generation failed: {failed}")
    for split in ("train", "valid"):
        os.makedirs(os.path.join(out, split), exist_ok=True)
        for i, part in enumerate(parts):
            for name in sorted(os.listdir(os.path.join(part, split))):
                os.replace(os.path.join(part, split, name), os.path.join(out, split, f"g{i}-{name}"))
    os.replace(os.path.join(parts[0], "schema.yaml"), os.path.join(out, "schema.yaml"))
    for part in parts:
        shutil.rmtree(part)
    return out


def converted_bytes_per_row(data_dir: str, sample_rows: int = 4096) -> float:
    """Bytes of the tensors the job's converter makes of one row (dense, labels, KJT values and lengths): a
    lower bound of what holding the converted rows in memory takes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import load_checked, parquet_files

    schema = load_checked(data_dir)
    first = pq.ParquetFile(parquet_files(data_dir, "train")[0])
    batch = BatchConverter(schema)(pa.Table.from_batches([next(first.iter_batches(batch_size=sample_rows))]))
    tensors = [batch.dense, batch.labels, batch.sparse.values(), batch.sparse.lengths()]
    return sum(t.numel() * t.element_size() for t in tensors) / len(batch)


def dataset_sizes(data_dir: str) -> Dict[str, Any]:
    """Rows, parquet bytes and converted bytes of each split."""
    import pyarrow.parquet as pq

    from rayemb.data.schema import parquet_files

    per_row = converted_bytes_per_row(data_dir)
    out: Dict[str, Any] = {"converted_bytes_per_row": per_row}
    for split in ("train", "valid"):
        files = parquet_files(data_dir, split)
        rows = sum(pq.read_metadata(f).num_rows for f in files)
        out[split] = {"rows": rows, "files": len(files), "parquet_bytes": sum(os.path.getsize(f) for f in files),
                      "converted_bytes": int(rows * per_row)}
    out["parquet_bytes"] = out["train"]["parquet_bytes"] + out["valid"]["parquet_bytes"]
    out["converted_bytes"] = out["train"]["converted_bytes"] + out["valid"]["converted_bytes"]
    return out


def still_to_read(sizes: Mapping[str, Any], step: int, steps: int) -> Dict[str, int]:
    """Parquet and converted bytes the job reads after train step ``step`` of ``steps``: the rest of the train
    split and the whole valid split."""
    left = max(0.0, 1.0 - step / steps)
    return {k: int(sizes["train"][k] * left) + sizes["valid"][k] for k in ("parquet_bytes", "converted_bytes")}


# ---- the job under the limit ---- #


def checkpoint_every(steps: int, tighten_at: float) -> int:
    """Steps between the job's checkpoints: the first is written before the limit is tightened, so the peak the
    headroom is added to holds a checkpoint's transient (several hundred MiB of the worker's anonymous memory
    here, whatever the data's size), and every later one, the epoch end's included, is one of the same size."""
    return max(1, int(0.8 * tighten_at * steps))


def job_argv(data_dir: str, out_dir: str, batch_size: int, checkpoint_steps: int,
             in_memory_max_gib: Optional[float] = None) -> List[str]:
    sets = [f"data.path={data_dir}", f"tracking.output_dir={out_dir}", f"data.batch_size={batch_size}",
            "train.epochs=1", "scaling.num_workers=1", "scaling.max_failures=0", "planner.calibrate=false",
            "train.log_every_n_steps=10", f"train.checkpoint_every_n_steps={checkpoint_steps}",
            "tracking.experiment=streamed-memory"]
    if in_memory_max_gib is not None:  # data.in_memory stays null: the job decides against this limit
        sets.append(f"data.in_memory_max_gib={in_memory_max_gib}")
    argv = [sys.executable, "-m", "rayemb", "train", "--config", os.path.join(_REPO, "jobs/configs/synth_small.yaml"),
            "--result-json", os.path.join(out_dir, "result.json")]
    for s in sets:
        argv += ["--set", s]
    return argv


def _in_memory_resolved(result: Mapping[str, Any], out_dir: str) -> Optional[str]:
    """The run's ``data.in_memory_resolved`` parameter, as MLflow keeps it."""
    from mlflow.tracking import MlflowClient

    try:
        run = MlflowClient(f"sqlite:///{out_dir}/mlflow.db").get_run(result["run_id"])
    except Exception:  # noqa: BLE001 - reported as unknown
        return None
    return run.data.params.get("data.in_memory_resolved")


def run_job_under_limit(head: CgroupHead, data_dir: str, out_dir: str, sizes: Mapping[str, Any], batch_size: int,
                        tighten_at: float, ratio: float, timeout_s: float,
                        max_headroom_bytes: Optional[int] = None, allowance_bytes: int = 0,
                        in_memory_max_gib: Optional[float] = None) -> Dict[str, Any]:
    """Runs the job against ``head`` and tightens the cgroup's limit once it has trained ``tighten_at`` of its
    epoch (module docstring); returns what the job and the cgroup showed. ``allowance_bytes``: room added to
    the limit beside the headroom, for transients that do not scale with the data (a checkpoint, the
    validation pass); not counted as headroom."""
    cg = head.cgroup
    sampler = MemorySampler(cg)
    every = checkpoint_every(sizes["train"]["rows"] // batch_size, tighten_at)
    rec: Dict[str, Any] = {"ceiling_bytes": cg.limit(), "store_bytes": head.store_bytes, "checkpoint_every": every}
    t0 = time.monotonic()
    proc = subprocess.Popen(job_argv(data_dir, out_dir, batch_size, every, in_memory_max_gib), cwd=_REPO, env=head.env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(timeout_s, proc.kill)
    watchdog.start()
    lines: List[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            m = PROGRESS.search(line)
            if m and "limit_bytes" not in rec and int(m.group(1)) >= tighten_at * int(m.group(2)):
                step, steps = int(m.group(1)), int(m.group(2))
                left = still_to_read(sizes, step, steps)
                # what the processes hold, not the page cache the cgroup's own peak also counts (parquet pages
                # and spill files fill any ceiling, and the kernel reclaims them at the limit)
                peak, cached_peak = sampler.peak_anon_shmem, cg.peak()
                headroom = min(int(min(left.values()) / ratio), max_headroom_bytes or sys.maxsize)
                cg.set_limit(peak + allowance_bytes + headroom)
                cg.reset_peak()
                sampler.mark()
                limit = cg.limit()  # the kernel rounds it down to whole pages
                rec.update({"tightened_at_step": step, "steps": steps, "peak_before_bytes": peak,
                            "cgroup_peak_before_bytes": cached_peak, "allowance_bytes": allowance_bytes,
                            "headroom_bytes": limit - peak - allowance_bytes, "limit_bytes": limit, "read_after_limit": left,
                            "tightened_after_s": round(time.monotonic() - t0, 1)})
        proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sampler.stop()
    stdout = "".join(lines)
    rec.update({"returncode": proc.returncode, "wall_s": round(time.monotonic() - t0, 1),
                "streamed_line": STREAMED_LINE in stdout, "stdout_tail": stdout[-4000:],
                "peak_bytes": cg.peak(), "failcnt": cg.failcnt(), **cg.oom_control(),
                "peak_anon_shmem_bytes": sampler.peak_anon_shmem, "peak_shmem_bytes": sampler.peak_shmem,
                "process_kinds": sorted(k for k in sampler.kinds if k)})
    result_path = os.path.join(out_dir, "result.json")
    if os.path.exists(result_path):
        with open(result_path) as f:
            result = json.load(f)
        m = result.get("metrics", {})
        rec.update({"status": result.get("status"), "run_id": result.get("run_id"),
                    "trained_steps": m.get("step"), "epoch_steps": m.get("epoch_steps"),
                    "valid_rows": m.get("valid_rows"), "in_memory_resolved": _in_memory_resolved(result, out_dir)})
    return rec


def memory_ratios(rec: Mapping[str, Any], sizes: Mapping[str, Any], idle_head_bytes: int) -> Dict[str, Any]:
    """Data over the headroom the job had after the limit was tightened, and the whole dataset over the
    workers' share of the limit (the limit less the object store and the idle head)."""
    out: Dict[str, Any] = {"idle_head_bytes": idle_head_bytes}
    if rec.get("headroom_bytes"):
        out["read_after_limit_over_headroom"] = min(rec["read_after_limit"].values()) / rec["headroom_bytes"]
    if rec.get("limit_bytes"):
        share = rec["limit_bytes"] - rec["store_bytes"] - idle_head_bytes
        out["workers_share_bytes"] = share
        out["data_over_workers_share"] = min(sizes["parquet_bytes"], sizes["converted_bytes"]) / share
    return out


def memory_problems(rec: Optional[Mapping[str, Any]], ratio: float = RATIO,
                    share_ratio: Optional[float] = None) -> List[str]:
    """Why the memory row does not show a streamed job bounded by the limit ([] when it does)."""
    if rec is None:
        return ["memory: missing"]
    if rec.get("error"):
        return [f"memory: {rec['error']}"]
    problems = []
    if rec.get("returncode") != 0 or rec.get("status") != "FINISHED":
        problems.append(f"the job did not finish (exit {rec.get('returncode')}, status {rec.get('status')})")
    if rec.get("epoch_steps") is None or rec.get("trained_steps") != rec.get("epoch_steps"):
        problems.append(f"trained {rec.get('trained_steps')} of {rec.get('epoch_steps')} steps")
    if not rec.get("streamed_line") or str(rec.get("in_memory_resolved")) != "False":
        problems.append(f"the job did not stream (data.in_memory_resolved={rec.get('in_memory_resolved')})")
    if "limit_bytes" not in rec:
        problems.append("the limit was never tightened (the job printed no progress past the point)")
    else:
        if rec.get("oom_kill", 1) or rec.get("under_oom", 1):
            problems.append(f"OOM: oom_kill={rec.get('oom_kill')} under_oom={rec.get('under_oom')}")
        if rec.get("peak_bytes", 0) > rec["limit_bytes"] or rec.get("peak_anon_shmem_bytes", 0) >= rec["limit_bytes"]:
            problems.append("the peak passed the limit")
        over = rec.get("read_after_limit_over_headroom") or 0.0
        if over < ratio:
            problems.append(f"data read under the limit is {over:.2f}x the headroom, below {ratio:g}x")
    if share_ratio and (rec.get("data_over_workers_share") or 0.0) < share_ratio:
        problems.append(f"the dataset is {rec.get('data_over_workers_share') or 0.0:.2f}x the workers' share of the "
                        f"limit, below {share_ratio:g}x")
    return problems


# ---- rows/s of the streamed path ---- #


def _rate_actor_class():
    import ray

    @ray.remote(num_cpus=1)
    class StreamedReader:
        """One rank's streamed data path with no training step: RankBatches over a Ray Data shard."""

        def __init__(self, schema: Any, hot_ids: Mapping[str, Any], embedding_dim: int) -> None:
            from rayemb.data.batching import BatchConverter
            from rayemb.embedding.remap import HybridRemapper
            from rayemb.contract.tables import table_configs

            remapper = HybridRemapper(table_configs(schema, embedding_dim), dict(hot_ids))
            self.convert = BatchConverter(schema, "error", remap=remapper.remap)

        def run(self, shard: Any, batch_size: int, timeout_s: float) -> Dict[str, Any]:
            import resource

            from rayemb.train.worker.data_loader import RankBatches

            batches = RankBatches(shard, batch_size, self.convert, in_memory=False, first_batch_timeout_s=timeout_s,
                                  split="train", rank=0, cpus_per_worker=1.0)
            t0 = time.perf_counter()
            first = None
            rows = ids = 0
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            for b in batches.epoch(0):
                if first is None:  # timed from the first batch: Ray Data's start-up is reported apart
                    first, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                    continue
                rows += len(b)
                ids += int(b.sparse.values().numel())
            end, cpu1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
            timed = end - (first or end)
            return {"rows": rows, "ids": ids, "start_s": (first or end) - t0, "timed_s": timed, "worker_cpu_s": cpu,
                    # below 1: the worker waited for Ray Data's reads (the rate is the read side's)
                    "worker_cpu_busy": cpu / timed if timed else None,
                    "rows_per_worker_cpu_s": rows / cpu if cpu else None}

    return StreamedReader


def hot_ids_from_stats(stats: Any) -> Dict[str, Any]:
    """Every table hybrid, its hot ids the statistics' heavy hitters (the most a hybrid plan makes hot)."""
    return {name: t.heavy_hitters[:, 0].copy() for name, t in stats.tables.items() if len(t.heavy_hitters)}


def rate_files(data_dir: str, rows: int) -> List[str]:
    """The first train files that hold at least ``rows`` rows (all of them if they hold fewer)."""
    import pyarrow.parquet as pq

    from rayemb.data.schema import parquet_files

    picked, total = [], 0
    for f in parquet_files(data_dir, "train"):
        picked.append(f)
        total += pq.read_metadata(f).num_rows
        if total >= rows:
            break
    return picked


def measure_rates(data_dir: str, stats: Any, rows: int, runs: int, warmup: int, embedding_dim: int,
                  timeout_s: float) -> List[Dict[str, Any]]:
    """Interleaved passes at each batch size on the connected cluster (module docstring); one record per timed
    pass."""
    import pyarrow.parquet as pq
    import ray

    from rayemb.data.schema import load_checked

    ray.data.DataContext.get_current().enable_progress_bars = False  # the passes print one line each
    files = rate_files(data_dir, rows)
    bytes_per_row = sum(os.path.getsize(f) for f in files) / sum(pq.read_metadata(f).num_rows for f in files)
    reader = _rate_actor_class().remote(load_checked(data_dir), hot_ids_from_stats(stats), embedding_dim)
    out = []
    for r in range(warmup + runs):
        for bs in (BATCH_SIZES if r % 2 == 0 else BATCH_SIZES[::-1]):
            shard = ray.data.read_parquet(files).streaming_split(1, equal=True)[0]
            try:
                res = ray.get(reader.run.remote(shard, bs, timeout_s))
                per_s = 1.0 / res["timed_s"] if res["timed_s"] else None
                rec = {"batch_size": bs, **res, "rows_per_s": per_s and res["rows"] * per_s,
                       "ids_per_s": per_s and res["ids"] * per_s,
                       "parquet_mb_per_s": per_s and res["rows"] * bytes_per_row * per_s / 1e6}
            except Exception as e:  # noqa: BLE001 - recorded: the row then counts a failed run
                rec = {"batch_size": bs, "error": f"{type(e).__name__}: {str(e)[:500]}"}
            said = rec.get("error") or f"{rec['rows_per_s'] or 0:,.0f} rows/s ({rec['start_s']:.1f} s to a batch)"
            print(f"[{'warm-up' if r < warmup else r - warmup + 1}] batch {bs}: {said}", flush=True)
            if r >= warmup:
                out.append({"run": r - warmup, **rec})
    return out


def rate_row(batch_size: int, runs: Sequence[Mapping[str, Any]], worker_cpus: float = 1.0) -> Dict[str, Any]:
    """One batch size's row: rows/s (median, min, max), per worker CPU, ids/s, parquet MB/s."""
    mine = [r for r in runs if r.get("batch_size") == batch_size]
    ok = [r for r in mine if "error" not in r and r.get("rows_per_s")]
    rps = spread(r["rows_per_s"] for r in ok)
    ids = spread(r.get("ids_per_s") for r in ok)
    return {"row": f"b{batch_size}", "batch_size": batch_size, "runs": len(ok), "failed": len(mine) - len(ok),
            "rows_per_s": rps["median"], "rows_per_s_min": rps["min"], "rows_per_s_max": rps["max"],
            "rows_per_s_spread": rps, "per_worker_cpu": rps["median"] / worker_cpus if rps["median"] else None,
            "m_ids_per_s": ids["median"] / 1e6 if ids["median"] else None,
            "worker_cpu_busy": spread(r.get("worker_cpu_busy") for r in ok)["median"],
            "rows_per_worker_cpu_s": spread(r.get("rows_per_worker_cpu_s") for r in ok)["median"],
            "mb_per_s": spread(r.get("parquet_mb_per_s") for r in ok)["median"],
            "start_s": spread(r.get("start_s") for r in ok)["median"]}


def verdict(memory: Optional[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]], ratio: float = RATIO,
            share_ratio: Optional[float] = None) -> Dict[str, Any]:
    """PASS when the job streamed every step under the limit (:func:`memory_problems`) and each batch size's
    row has at least MIN_RUNS runs and no failed one; else FAIL, saying why."""
    problems = memory_problems(memory, ratio, share_ratio)
    by = {r.get("batch_size"): r for r in rows}
    for bs in BATCH_SIZES:
        row = by.get(bs)
        if row is None:
            problems.append(f"b{bs}: missing")
        elif row.get("failed"):
            problems.append(f"b{bs}: {row['failed']} failed run(s)")
        elif not row.get("runs") or row.get("rows_per_s") is None:
            problems.append(f"b{bs}: no run")
        elif row["runs"] < MIN_RUNS:
            problems.append(f"b{bs}: {row['runs']} run(s), fewer than the {MIN_RUNS} it needs")
    return {"rule": f"the job trains every step streamed with no OOM kill, reading >= {ratio:g}x its headroom "
                    f"under the limit; every batch size measured >= {MIN_RUNS} times",
            "verdict": "FAIL" if problems else "PASS", "problems": problems}


def memory_line(mem: Mapping[str, Any]) -> str:
    """One printed line of the memory row."""
    if "limit_bytes" not in mem:
        return f"memory: limit never tightened (exit {mem.get('returncode')}, {mem.get('error', '')})"
    allowance = f" + allowance {mem['allowance_bytes'] / MIB:,.0f}" if mem.get("allowance_bytes") else ""
    return (f"memory: limit {mem['limit_bytes'] / MIB:,.0f} MiB (held before {mem['peak_before_bytes'] / MIB:,.0f}"
            f"{allowance} + headroom {mem['headroom_bytes'] / MIB:,.0f}) from step {mem['tightened_at_step']}/{mem['steps']}; "
            f"peak after {mem['peak_bytes'] / MIB:,.0f} MiB (anon+shmem {mem['peak_anon_shmem_bytes'] / MIB:,.0f}, "
            f"shmem {mem['peak_shmem_bytes'] / MIB:,.0f}), failcnt {mem['failcnt']}, oom_kill {mem.get('oom_kill')}; "
            f"read {mem.get('read_after_limit_over_headroom', 0):.2f}x the headroom, dataset "
            f"{mem.get('data_over_workers_share', 0):.2f}x the workers' share; trained {mem.get('trained_steps')}/"
            f"{mem.get('epoch_steps')} steps, {mem.get('status')}")


# ---- the whole run ---- #


def streamed_memory_run(work: str, rows: int, pooling: int, cardinality: int, chunk_rows: int, gen_procs: int,
                        cpus: int, store_bytes: int, ceiling_bytes: int, batch_size: int, tighten_at: float,
                        ratio: float, job_timeout_s: float,
                        then: Optional[Callable[[CgroupHead, str, Dict[str, Any]], Any]] = None,
                        seed: int = 0, data_dir: Optional[str] = None,
                        max_headroom_bytes: Optional[int] = None, allowance_bytes: int = 0,
                        in_memory_max_gib: Optional[float] = None
                        ) -> Tuple[Dict[str, Any], Any]:
    """Dataset (generated, unless ``data_dir`` names one), head in its cgroup, the job under the tightened
    limit; ``then(head, out_dir, memory)`` runs on the same head afterwards (the limit back at the ceiling).
    Returns the memory record and ``then``'s value. Everything the head started is stopped and the cgroup
    removed, whatever happens."""
    t0 = time.monotonic()
    if data_dir is None:
        data_dir = generate_dataset(os.path.join(work, "data"),
                                    dataset_spec(rows, pooling, cardinality, chunk_rows, seed), procs=gen_procs)
    sizes = dataset_sizes(data_dir)
    cg = MemoryCgroup(ceiling_bytes)
    head = CgroupHead(cg, cpus, store_bytes, base_dir="/tmp")
    rec: Dict[str, Any] = {"data": sizes, "dataset_s": round(time.monotonic() - t0, 1)}
    after = None
    try:
        head.start()
        time.sleep(2.0)  # the daemons settle: what the idle head holds
        idle = cg.usage()
        out_dir = os.path.join(work, "out")
        rec.update(run_job_under_limit(head, data_dir, out_dir, sizes, batch_size, tighten_at, ratio, job_timeout_s,
                                       max_headroom_bytes, allowance_bytes, in_memory_max_gib))
        rec.update(memory_ratios(rec, sizes, idle))
        if then is not None:
            cg.set_limit(ceiling_bytes)
            after = then(head, out_dir, rec)
    finally:
        t1 = time.monotonic()
        rec["sigkilled_at_stop"] = head.stop()
        cg.remove()
        rec["stop_s"] = round(time.monotonic() - t1, 1)
    return rec, after


def _job_stats(out_dir: str) -> Any:
    from rayemb.data.stats_io import load_stats_json

    jobs = os.path.join(out_dir, "jobs")
    found = [os.path.join(jobs, j, "stats.json") for j in sorted(os.listdir(jobs))] if os.path.isdir(jobs) else []
    return load_stats_json(found[-1]) if found and os.path.exists(found[-1]) else None


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=40_000_000, help="rows of the dataset (train + valid)")
    p.add_argument("--pooling", type=int, default=64, help="mean ids per row of each of the 2 tables")
    p.add_argument("--cardinality", type=int, default=500_000, help="rows of each table")
    p.add_argument("--chunk-rows", type=int, default=50_000, help="rows per parquet file")
    p.add_argument("--gen-procs", type=int, default=2, help="generator processes")
    p.add_argument("--cpus", type=int, default=2, help="CPUs of the head (1 goes to the worker)")
    p.add_argument("--store-mib", type=int, default=512, help="the object store's cap")
    p.add_argument("--ceiling-gib", type=float, default=12.0, help="the cgroup's limit until it is tightened")
    p.add_argument("--batch-size", type=int, default=4096, help="the job's batch")
    p.add_argument("--tighten-at", type=float, default=0.25, help="share of the epoch trained before the limit "
                                                                    "is tightened")
    p.add_argument("--ratio", type=float, default=RATIO, help="data read under the limit over its headroom")
    p.add_argument("--headroom-mib", type=int, default=1024, help="the headroom's cap")
    p.add_argument("--share-ratio", type=float, default=RATIO,
                   help="the dataset over the workers' share of the limit that the verdict asks (0: none)")
    p.add_argument("--rate-rows", type=int, default=2_000_000, help="rows per rows/s pass")
    p.add_argument("--runs", type=int, default=5, help="timed rows/s passes per batch size")
    p.add_argument("--warmup", type=int, default=1, help="untimed rows/s rounds first")
    p.add_argument("--job-timeout-s", type=float, default=7200.0)
    p.add_argument("--data", default=None, help="an existing dataset to run on instead of a generated one (its "
                                                "rows/s: the shape of one's own data)")
    p.add_argument("--work-dir", default=None, help="dataset and job outputs (default: a new temp folder, removed)")
    p.add_argument("--out", default=None, help="JSON result (default bench-results/streamed_memory_<date>_<commit>"
                                               ".json)")
    args = p.parse_args(argv)

    problem = cgroup_problem()
    if problem:
        print(f"streamed_memory: cannot run here: {problem}", file=sys.stderr)
        return 2
    work = args.work_dir or tempfile.mkdtemp(prefix="rayemb-streamed-memory-")
    os.makedirs(work, exist_ok=True)
    data = os.path.abspath(args.data) if args.data else os.path.join(work, "data")

    def rates(head: CgroupHead, out_dir: str, mem: Mapping[str, Any]) -> List[Dict[str, Any]]:
        os.environ.update(head.env())  # before Ray is imported here: it reads the loopback switch once
        import ray

        from rayemb._ray import init_ray
        from rayemb.data.stats import compute_stats

        init_ray()
        try:
            stats = _job_stats(out_dir) or compute_stats(data)
            return measure_rates(data, stats, args.rate_rows, args.runs, args.warmup, embedding_dim=16,
                                 timeout_s=600.0)
        finally:
            ray.shutdown()

    try:
        mem, runs = streamed_memory_run(
            work, args.rows, args.pooling, args.cardinality, args.chunk_rows, args.gen_procs, args.cpus,
            args.store_mib * MIB, int(args.ceiling_gib * GIB), args.batch_size, args.tighten_at, args.ratio,
            args.job_timeout_s, then=rates, data_dir=data if args.data else None,
            max_headroom_bytes=args.headroom_mib * MIB)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    runs = runs or []
    rows = [rate_row(bs, runs) for bs in BATCH_SIZES]
    target = verdict(mem, rows, args.ratio, args.share_ratio or None)
    doc = {"schema_version": 1,
           "setup": {k: getattr(args, k) for k in ("data", "rows", "pooling", "cardinality", "chunk_rows", "cpus",
                                                   "store_mib", "ceiling_gib", "batch_size", "tighten_at", "ratio",
                                                   "headroom_mib", "share_ratio", "rate_rows", "runs", "warmup")},
           "host": {"cpu_count": os.cpu_count(), "platform": sys.platform, "load_avg_1m": os.getloadavg()[0]},
           "memory": mem, "runs": runs, "rows": rows, "verdict": target}
    footer = memory_line(mem) + f"\nverdict: {target['verdict']}"
    if target["problems"]:
        footer += f" ({'; '.join(target['problems'])})"
    return report(args.out or default_out(), doc, rows, COLUMNS, KEYS, footer=footer)


if __name__ == "__main__":
    sys.exit(main())
