"""Driver-side MLflow writer that never slows or fails training.

rayemb's driver is the only MLflow writer (DESIGN.md §7). Every ``log_*`` call
of :class:`RunLogger` only appends a record to an in-memory buffer and returns;
one background thread drains the buffer in batches through an explicit
``MlflowClient(tracking_uri)`` and run id (``MlflowClient.log_batch``). When the
tracking server is away the thread moves the buffer to a local JSONL *spill
file*, retries with exponential backoff, and on reconnect replays the spill
file first, then the buffer. Every metric point keeps the step and the
wall-clock timestamp of the ``log_metrics`` call, so a replayed curve is the
curve the job produced. Nothing here raises into the caller: failures are
logged and, at the end, reported by the return value of :meth:`RunLogger.finish`.

Why a thread and our own retries: MLflow's REST client retries a failed call up
to 7 times with exponential backoff (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
``..._BACKOFF_FACTOR``) and waits up to 120 s per request
(``MLFLOW_HTTP_REQUEST_TIMEOUT``), so one synchronous call can block for
minutes while a server restarts. :class:`RunLogger` sets lower defaults for
these knobs (only where the user has not set them: they are process-wide
environment variables read by ``mlflow.utils.rest_utils.http_request`` on every
call) and keeps all calls off the caller's thread.

Memory is bounded: at most ``max_buffer`` records stay in memory; beyond that
(a server that hangs rather than refuses) the caller appends the record to the
spill file itself, which costs one small buffered file write.

Replay is idempotent: MLflow drops a metric point whose (key, timestamp, step,
value) is already stored, re-logging a param with the same value is allowed,
and tags overwrite. A batch that failed half-way can therefore be resent.

Example::

    >>> rl = RunLogger("sqlite:////tmp/out/mlflow.db", "synth", run_name="dp-vs-hybrid").start()
    >>> rl.log_params({"train": {"epochs": 2}})       # param train.epochs + metric param.train.epochs
    >>> rl.log_metrics({"loss": 0.69, "auc": 0.51}, step=0)
    >>> rl.finish()                                    # True once everything reached the store
    True
"""

from __future__ import annotations

import atexit
import getpass
import json
import logging
import math
import numbers
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections import deque
from pathlib import Path
from typing import Any, Deque, Dict, Iterable, List, Mapping, Optional, Tuple

from rayemb.constants import MLFLOW_DB_FILE, TRACKING_URI_ENV_VAR
from rayemb.logs import redact_text, redact_uri

logger = logging.getLogger(__name__)

# ---- TAG NAMES ---- #
TAG_GIT_COMMIT = "rayemb.git_commit"
TAG_GIT_DIRTY = "rayemb.git_dirty"
TAG_VERSION = "rayemb.version"
TAG_CLUSTER_SHAPE = "rayemb.cluster_shape"
TAG_PLAN_FINGERPRINT = "rayemb.plan_fingerprint"
TAG_FAILURE_REASON = "rayemb.failure_reason"
#: what a run is: "train" (default), "sweep" (a sweep's parent) or "comparison" (from `rayemb compare`)
TAG_KIND = "rayemb.kind"
TAG_PARENT_RUN_ID = "mlflow.parentRunId"
TAG_RUN_NAME = "mlflow.runName"
#: numeric config values are also logged as metrics under this prefix (see RunLogger.log_params)
PARAM_METRIC_PREFIX = "param."

# ---- MLFLOW CLIENT KNOBS (process-wide env vars; set only if the user has not) ---- #
#: one attempt per call: RunLogger retries with its own backoff, off the caller's thread
DEFAULT_MLFLOW_HTTP_MAX_RETRIES = 0
#: seconds one REST call may take before it counts as an outage (MLflow's default: 120)
DEFAULT_MLFLOW_HTTP_TIMEOUT_S = 10
_CLIENT_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(DEFAULT_MLFLOW_HTTP_MAX_RETRIES),
    "MLFLOW_HTTP_REQUEST_TIMEOUT": str(DEFAULT_MLFLOW_HTTP_TIMEOUT_S),
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # MLflow prints "View run ... at: <tracking URI>" with any credentials in it; rayemb prints its own, redacted
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}

# ---- BATCHING AND BACKOFF ---- #
#: MLflow's log_batch limits (mlflow/utils/validation.py: MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH)
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAMS_TAGS_PER_BATCH = 100
_MAX_PARAM_VAL_LENGTH = 6000
_MAX_TAG_VAL_LENGTH = 8000
_MAX_KEY_LENGTH = 250
#: records popped from memory per drain round
_DRAIN_CHUNK = 1000
#: wake the writer early once this many records wait
_EARLY_FLUSH_RECORDS = 1000
_BACKOFF_INITIAL_S = 0.5
_BACKOFF_MAX_S = 30.0
#: while finishing, retry at least this often so a returning server is seen quickly
_BACKOFF_MAX_FINISHING_S = 1.0
DEFAULT_SYSTEM_METRICS_INTERVAL_S = 10.0
_TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")

_INVALID_KEY_CHARS = re.compile(r"[^\w\-. :/]")


def default_tracking_uri(output_dir: str) -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else an absolute sqlite URI under ``output_dir``.

    The sqlite URI is absolute (``sqlite:////abs/dir/mlflow.db``) so that every
    process, whatever its working directory, opens the same database.
    """
    env = os.environ.get(TRACKING_URI_ENV_VAR)
    if env:
        return env
    return f"sqlite:///{os.path.abspath(os.path.join(output_dir, MLFLOW_DB_FILE))}"


def _sqlite_path(tracking_uri: str) -> Optional[str]:
    """The database file of a ``sqlite:///`` URI, or None for other stores and in-memory sqlite."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = tracking_uri[len("sqlite:///"):].split("?", 1)[0]
    return None if path in ("", ":memory:") else path


def ensure_store(tracking_uri: str) -> None:
    """Creates the sqlite database (and its folder) of ``tracking_uri``; no-op for servers.

    Call it once in the driver before anything else opens the store: MLflow
    creates the schema on first open, and several processes doing that at once
    race on the migrations and fail.
    """
    path = _sqlite_path(tracking_uri)
    if path is None:
        return
    _set_client_env_defaults()
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    from mlflow import MlflowClient

    MlflowClient(tracking_uri).search_experiments(max_results=1)


def _git(args: List[str], cwd: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def standard_tags() -> Dict[str, str]:
    """Tags every rayemb run carries: code version, git commit, library versions, host.

    The git commit is the one of the checkout rayemb is imported from (else of
    the working directory), ``"unknown"`` outside a git repository. MLflow's own
    ``mlflow.source.git.commit`` is set too, so the UI shows it.
    """
    import importlib.metadata as md

    import rayemb

    tags: Dict[str, str] = {TAG_VERSION: str(getattr(rayemb, "__version__", "unknown"))}
    commit, dirty = None, None
    for cwd in (os.path.dirname(os.path.abspath(rayemb.__file__)), os.getcwd()):
        commit = _git(["rev-parse", "HEAD"], cwd)
        if commit:
            status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
            dirty = None if status is None else str(bool(status)).lower()
            break
    tags[TAG_GIT_COMMIT] = commit or "unknown"
    tags[TAG_GIT_DIRTY] = dirty or "unknown"
    if commit:
        tags["mlflow.source.git.commit"] = commit
    for dist in ("torch", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu", "ray", "mlflow"):
        try:
            tags[f"rayemb.lib.{dist}"] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    tags["rayemb.python"] = sys.version.split()[0]
    try:
        tags["mlflow.user"] = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        pass
    tags["mlflow.source.name"] = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return tags


def flatten(params: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"train": {"epochs": 2}}`` -> ``{"train.epochs": 2}`` (leaves keep their type)."""
    out: Dict[str, Any] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _clean_key(key: Any) -> str:
    """A key MLflow accepts: invalid characters become ``_``, at most 250 characters."""
    return _INVALID_KEY_CHARS.sub("_", str(key))[:_MAX_KEY_LENGTH]


def _set_client_env_defaults() -> None:
    for name, value in _CLIENT_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)


# ---- HOST METRICS ---- #


class _HostSampler:
    """Host CPU and memory utilisation in percent: psutil if installed, else /proc (Linux).

    CPU% over an interval is ``100 * (1 - d_idle / d_total)`` from two
    ``/proc/stat`` readings (idle includes iowait); memory% is
    ``100 * (1 - MemAvailable / MemTotal)`` from ``/proc/meminfo``. Names follow
    MLflow's own system metrics so the UI groups them.
    """

    def __init__(self) -> None:
        try:
            import psutil  # type: ignore[import-not-found]

            self._psutil = psutil
            psutil.cpu_percent(interval=None)  # first call primes the counters
        except ImportError:
            self._psutil = None
        self._last_cpu = self._proc_stat()

    @staticmethod
    def _proc_stat() -> Optional[Tuple[int, int]]:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return idle, sum(fields)

    def sample(self) -> Dict[str, float]:
        out: Dict[str, float] = {}
        if self._psutil is not None:
            out["system/cpu_utilization_percentage"] = float(self._psutil.cpu_percent(interval=None))
            out["system/system_memory_usage_percentage"] = float(self._psutil.virtual_memory().percent)
            return out
        now = self._proc_stat()
        if now is not None and self._last_cpu is not None and now[1] > self._last_cpu[1]:
            d_idle, d_total = now[0] - self._last_cpu[0], now[1] - self._last_cpu[1]
            out["system/cpu_utilization_percentage"] = 100.0 * (1.0 - d_idle / d_total)
        self._last_cpu = now
        try:
            info = {}
            with open("/proc/meminfo") as f:
                for line in f:
                    name, rest = line.split(":", 1)
                    info[name] = int(rest.split()[0])
            out["system/system_memory_usage_percentage"] = 100.0 * (1.0 - info["MemAvailable"] / info["MemTotal"])
        except (OSError, KeyError, ValueError, ZeroDivisionError):
            pass
        return out


# ---- RUN LOGGER ---- #


class RunLogger:
    """Driver-side MLflow writer: asynchronous, batched, bounded, never raises into training.

    Args:
        tracking_uri: MLflow tracking URI (absolute ``sqlite:////…`` or ``http://host:port``).
        experiment: experiment name; created if missing (for sqlite stores its
            artifacts go next to the database, under ``mlartifacts/``).
        run_name: MLflow run name.
        tags: extra run tags (e.g. :data:`TAG_CLUSTER_SHAPE`, :data:`TAG_PLAN_FINGERPRINT`);
            they override :func:`standard_tags`.
        parent_run_id: makes this run a child (tag ``mlflow.parentRunId``), e.g. in a sweep.
        spill_dir: folder of the spill file (default: the system temp folder).
        flush_interval_s: the writer sends what waits at least this often.
        max_buffer: records held in memory; beyond it, records go straight to the spill file.
        system_metrics_interval_s: host CPU/memory % are logged this often (None: never).

    Attributes:
        run_id: set by :meth:`start` when the store answered; ``None`` while the
            server is unreachable (the run is created on reconnect).
        spill_path: the JSONL spill file (it exists only while something is spilled).
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        run_name: Optional[str] = None,
        tags: Optional[Dict[str, str]] = None,
        parent_run_id: Optional[str] = None,
        spill_dir: Optional[str] = None,
        flush_interval_s: float = 1.0,
        max_buffer: int = 100_000,
        *,
        system_metrics_interval_s: Optional[float] = DEFAULT_SYSTEM_METRICS_INTERVAL_S,
    ) -> None:
        self.tracking_uri = tracking_uri
        #: the URI as logs and messages show it: credentials replaced by ***
        self.shown_uri = redact_uri(tracking_uri)
        self.experiment = experiment
        self.run_name = run_name
        self.parent_run_id = parent_run_id
        self.flush_interval_s = max(0.01, float(flush_interval_s))
        self.max_buffer = max(1, int(max_buffer))
        self.system_metrics_interval_s = system_metrics_interval_s
        self.run_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self._tags = dict(tags or {})
        self.spill_path = os.path.join(os.path.abspath(spill_dir) if spill_dir else tempfile.gettempdir(),
                                       f"rayemb-mlflow-spill-{uuid.uuid4().hex[:12]}.jsonl")

        self._buf: Deque[Dict[str, Any]] = deque()
        self._cv = threading.Condition()
        self._spill_lock = threading.Lock()
        self._spill_offset = 0  # bytes of the spill file already replayed
        self._spill_pending = False
        self._client: Any = None
        self._thread: Optional[threading.Thread] = None
        self._started = False
        self._connected = False
        self._outage_logged = False
        self._backoff_s = _BACKOFF_INITIAL_S
        self._next_attempt = 0.0
        self._finishing = False
        self._abandon = False
        self._final_status = "FINISHED"
        self._done = threading.Event()
        self._delivered = False
        self._finish_result: Optional[bool] = None
        self._sampler: Optional[_HostSampler] = None
        self._next_sample = 0.0
        self._sample_step = 0
        self.dropped = 0  # records MLflow rejected as invalid (not outages); logged as warnings

    # ---- caller side: cheap, never raises ---- #

    def start(self) -> "RunLogger":
        """Creates the experiment (if needed) and the run, then starts the writer thread.

        One attempt is made synchronously so that :attr:`run_id` is usually known
        on return; if the store is unreachable the writer keeps trying.
        """
        if self._started:
            return self
        self._started = True
        try:
            _set_client_env_defaults()
            self._tags = {**standard_tags(), **{k: str(v) for k, v in self._tags.items()}}
            if self.system_metrics_interval_s:
                self._sampler = _HostSampler()
                self._next_sample = time.monotonic() + self.system_metrics_interval_s
            self._try_connect()
        except Exception as e:
            logger.warning("rayemb tracking: could not start MLflow run (%s: %s); will retry", type(e).__name__, _short(e))
        self._thread = threading.Thread(target=self._writer, name="rayemb-mlflow-writer", daemon=True)
        self._thread.start()
        atexit.register(_finish_at_exit, weakref.ref(self))
        return self

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Logs a (nested) config as flattened params; numbers also as metrics ``param.<key>``.

        MLflow stores params as strings, so a filter like ``params.train.epochs > 2``
        compares text; the metric copy (step 0) makes ``metrics.`param.train.epochs` > 2`` work.
        Booleans are logged as 0/1 metrics.
        """
        try:
            recs: List[Dict[str, Any]] = []
            ts = _now_ms()
            for key, value in flatten(params).items():
                key = _clean_key(key)
                recs.append({"k": "p", "key": key, "v": str(redact_uri(value))[:_MAX_PARAM_VAL_LENGTH]})
                if isinstance(value, numbers.Real) and math.isfinite(float(value)):
                    mkey = _clean_key(PARAM_METRIC_PREFIX + key)
                    recs.append({"k": "m", "key": mkey, "v": float(value), "ts": ts, "step": 0})
            self._enqueue(recs)
        except Exception as e:
            logger.warning("rayemb tracking: log_params failed (%s: %s)", type(e).__name__, _short(e))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Enqueues one point per metric at ``step``, stamped with the current time; returns at once."""
        try:
            ts = _now_ms()
            recs = []
            for key, value in metrics.items():
                try:
                    v = float(value)
                except (TypeError, ValueError):
                    logger.warning("rayemb tracking: metric %r has non-numeric value %r; skipped", key, value)
                    continue
                recs.append({"k": "m", "key": _clean_key(key), "v": v, "ts": ts, "step": int(step)})
            self._enqueue(recs)
        except Exception as e:
            logger.warning("rayemb tracking: log_metrics failed (%s: %s)", type(e).__name__, _short(e))

    def log_artifact(self, local_path: str, artifact_path: Optional[str] = None) -> None:
        """Uploads a file (or folder) later; it must still exist when the writer gets to it."""
        try:
            self._enqueue([{"k": "a", "path": os.path.abspath(local_path), "dst": artifact_path}])
        except Exception as e:
            logger.warning("rayemb tracking: log_artifact failed (%s: %s)", type(e).__name__, _short(e))

    def log_text(self, text: str, artifact_file: str) -> None:
        """Stores ``text`` as the artifact ``artifact_file`` (e.g. ``"config.yaml"``)."""
        try:
            self._enqueue([{"k": "x", "text": redact_text(str(text)), "file": artifact_file}])
        except Exception as e:
            logger.warning("rayemb tracking: log_text failed (%s: %s)", type(e).__name__, _short(e))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Sets run tags (values become strings, truncated to MLflow's 8000 characters)."""
        try:
            self._enqueue([{"k": "t", "key": _clean_key(k), "v": redact_text(str(v))[:_MAX_TAG_VAL_LENGTH]}
                           for k, v in tags.items()])
        except Exception as e:
            logger.warning("rayemb tracking: set_tags failed (%s: %s)", type(e).__name__, _short(e))

    def finish(self, status: str = "FINISHED", reason: Optional[str] = None, timeout_s: float = 60.0) -> bool:
        """Flushes everything, then sets the run's terminal status; waits at most ``timeout_s``.

        ``status`` is ``"FINISHED"``, ``"FAILED"`` or ``"KILLED"``; for FAILED the
        ``reason`` becomes the tag :data:`TAG_FAILURE_REASON`. Returns True if
        every record and the status reached the store. On False the
        undelivered records stay in :attr:`spill_path` (logged as a warning).
        Calling it again returns the first result.
        """
        if self._finish_result is not None:
            return self._finish_result
        try:
            status = str(status).upper()
            if status not in _TERMINAL_STATUSES:
                logger.warning("rayemb tracking: unknown run status %r; using FAILED", status)
                status = "FAILED"
            if status == "FAILED":
                self.set_tags({TAG_FAILURE_REASON: reason or "unknown"})
            if not self._started:
                self.start()
            with self._cv:
                self._final_status = status
                self._finishing = True
                self._next_attempt = 0.0
                self._cv.notify_all()
            done = self._done.wait(timeout=max(0.0, float(timeout_s)))
            if not done:
                with self._cv:
                    self._abandon = True
                    self._cv.notify_all()
                self._done.wait(timeout=2.0)
            ok = bool(done and self._delivered)
            if not ok:
                logger.warning(
                    "rayemb tracking: run %s not fully written to %s within %.0f s; undelivered records are in %s",
                    self.run_id, self.shown_uri, timeout_s, self.spill_path,
                )
        except Exception as e:
            logger.warning("rayemb tracking: finish failed (%s: %s)", type(e).__name__, _short(e))
            ok = False
        self._finish_result = ok
        return ok

    def _enqueue(self, recs: List[Dict[str, Any]]) -> None:
        if not recs:
            return
        with self._cv:
            if self._finish_result is not None or self._abandon:
                logger.warning("rayemb tracking: %d records logged after finish(); written to %s",
                               len(recs), self.spill_path)
                overflow = recs
            elif len(self._buf) + len(recs) <= self.max_buffer:
                self._buf.extend(recs)
                if len(self._buf) >= _EARLY_FLUSH_RECORDS:
                    self._cv.notify_all()
                return
            else:
                overflow = recs
        self._spill(overflow)

    # ---- writer thread ---- #

    def _writer(self) -> None:
        try:
            while True:
                with self._cv:
                    # finishing and connected: no pause; otherwise sleep until there is work or a retry is due
                    busy = self._finishing and self._connected
                    if not busy and not self._abandon and len(self._buf) < _EARLY_FLUSH_RECORDS:
                        self._cv.wait(timeout=self._wait_s())
                    finishing, abandon = self._finishing, self._abandon
                if abandon:
                    self._spill_all_memory()
                    return
                self._sample_host()
                if not self._connected and time.monotonic() >= self._next_attempt:
                    self._try_connect()
                if self._connected:
                    self._drain()
                else:
                    self._spill_all_memory()
                if finishing and self._connected and self._nothing_pending():
                    if self._terminate():
                        self._delivered = True
                        return
        except Exception:  # a bug here must not take the job down; leave the data on disk
            logger.exception("rayemb tracking: writer thread crashed; records kept in %s", self.spill_path)
            self._spill_all_memory()
        finally:
            self._done.set()

    def _wait_s(self) -> float:
        wait = self.flush_interval_s
        if not self._connected:
            wait = min(wait, max(0.01, self._next_attempt - time.monotonic()))
        if self._sampler is not None:
            wait = min(wait, max(0.01, self._next_sample - time.monotonic()))
        return wait

    def _sample_host(self) -> None:
        if self._sampler is None or time.monotonic() < self._next_sample:
            return
        self._next_sample = time.monotonic() + float(self.system_metrics_interval_s or 0)
        try:
            sample = self._sampler.sample()
        except Exception:
            return
        if sample:
            ts = _now_ms()
            recs = [{"k": "m", "key": k, "v": v, "ts": ts, "step": self._sample_step} for k, v in sample.items()]
            self._sample_step += 1
            with self._cv:
                self._buf.extend(recs)

    def _get_client(self) -> Any:
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(self.tracking_uri)
        return self._client

    def _try_connect(self) -> bool:
        """Creates the run if needed (or checks the store answers); schedules the next try on failure."""
        try:
            client = self._get_client()
            if self.run_id is None:
                self._create_run(client)
            else:
                client.get_run(self.run_id)
        except Exception as e:
            self._connected = False
            cap = _BACKOFF_MAX_FINISHING_S if self._finishing else _BACKOFF_MAX_S
            delay = min(self._backoff_s, cap)
            self._next_attempt = time.monotonic() + delay
            self._backoff_s = min(self._backoff_s * 2.0, _BACKOFF_MAX_S)
            if not self._outage_logged:
                logger.warning(
                    "rayemb tracking: MLflow at %s unreachable (%s: %s); buffering to %s and retrying",
                    self.shown_uri, type(e).__name__, _short(e), self.spill_path,
                )
                self._outage_logged = True
            return False
        if self._outage_logged:
            logger.info("rayemb tracking: MLflow at %s reachable again; replaying buffered records", self.shown_uri)
        self._connected, self._outage_logged, self._backoff_s = True, False, _BACKOFF_INITIAL_S
        return True

    def _create_run(self, client: Any) -> None:
        from mlflow.exceptions import MlflowException

        exp = client.get_experiment_by_name(self.experiment)
        if exp is None:
            try:
                self.experiment_id = client.create_experiment(
                    self.experiment, artifact_location=self._artifact_location())
            except MlflowException:  # another process created it first
                exp = client.get_experiment_by_name(self.experiment)
                if exp is None:
                    raise
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                logger.warning("rayemb tracking: experiment %r was deleted; restoring it", self.experiment)
                client.restore_experiment(exp.experiment_id)
            self.experiment_id = exp.experiment_id
        tags = dict(self._tags)
        if self.parent_run_id:
            tags[TAG_PARENT_RUN_ID] = self.parent_run_id
        run = client.create_run(self.experiment_id, tags=tags, run_name=self.run_name)
        self.run_id = run.info.run_id
        logger.info("rayemb tracking: MLflow run %s (%s) in experiment %r at %s",
                    self.run_id, run.info.run_name, self.experiment, self.shown_uri)

    def _artifact_location(self) -> Optional[str]:
        """For sqlite stores, artifacts live next to the database (MLflow's default is ./mlruns of the cwd)."""
        path = _sqlite_path(self.tracking_uri)
        if path is None:
            return None
        slug = re.sub(r"[^\w.-]", "_", self.experiment) or "experiment"
        return (Path(path).resolve().parent / "mlartifacts" / slug).as_uri()

    def _nothing_pending(self) -> bool:
        with self._cv:
            return not self._buf and not self._spill_pending

    def _drain(self) -> None:
        """Replays the spill file, then sends the in-memory buffer; stops at the first outage."""
        if not self._replay_spill():
            return
        while True:
            with self._cv:
                batch = [self._buf.popleft() for _ in range(min(_DRAIN_CHUNK, len(self._buf)))]
            if not batch:
                return
            if not self._send(batch):
                self._spill(batch)
                self._spill_all_memory()
                return

    def _replay_spill(self) -> bool:
        while True:
            with self._spill_lock:
                if not self._spill_pending:
                    return True
                batch, new_offset = [], self._spill_offset
                with open(self.spill_path, "rb") as f:
                    f.seek(self._spill_offset)
                    for line in f:
                        new_offset += len(line)
                        if line.strip():
                            batch.append(json.loads(line))
                        if len(batch) >= _DRAIN_CHUNK:
                            break
                if not batch:
                    os.remove(self.spill_path)  # fully replayed; the next outage starts a new file
                    self._spill_offset, self._spill_pending = 0, False
                    return True
            if not self._send(batch):
                return False
            with self._spill_lock:
                self._spill_offset = new_offset

    def _spill(self, recs: Iterable[Dict[str, Any]]) -> None:
        try:
            with self._spill_lock:
                os.makedirs(os.path.dirname(self.spill_path), exist_ok=True)
                with open(self.spill_path, "a", encoding="utf-8") as f:
                    for r in recs:
                        f.write(json.dumps(r) + "\n")
                self._spill_pending = True
        except Exception as e:  # disk full or unwritable folder: the records are lost, the job goes on
            logger.error("rayemb tracking: cannot write spill file %s (%s: %s); records lost", self.spill_path,
                         type(e).__name__, e)

    def _spill_all_memory(self) -> None:
        with self._cv:
            recs = list(self._buf)
            self._buf.clear()
        if recs:
            self._spill(recs)

    def _send(self, batch: List[Dict[str, Any]]) -> bool:
        """Writes ``batch``; False on an outage. Records MLflow rejects as invalid are dropped (logged)."""
        try:
            self._send_unchecked(batch)
            return True
        except Exception as e:
            err = e
        # Outage or bad data? If the store answers a probe, it was the data.
        try:
            self._get_client().get_run(self.run_id)
        except Exception:
            self._connected = False
            self._next_attempt = time.monotonic() + _BACKOFF_INITIAL_S
            if not self._outage_logged:
                logger.warning("rayemb tracking: MLflow at %s unreachable (%s: %s); buffering to %s",
                               self.shown_uri, type(err).__name__, _short(err), self.spill_path)
                self._outage_logged = True
            return False
        for rec in batch:
            try:
                self._send_unchecked([rec])
            except Exception as e:
                self.dropped += 1
                logger.warning("rayemb tracking: MLflow rejected %s (%s: %s); dropped", _describe(rec),
                               type(e).__name__, _short(e))
        return True

    def _send_unchecked(self, batch: List[Dict[str, Any]]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        client = self._get_client()
        metrics = [Metric(r["key"], r["v"], r["ts"], r["step"]) for r in batch if r["k"] == "m"]
        params: Dict[str, Any] = {}
        for r in (r for r in batch if r["k"] == "p"):
            if r["key"] not in params:
                params[r["key"]] = Param(r["key"], r["v"])
            elif params[r["key"]].value != r["v"]:  # params are immutable in MLflow: the first value stays
                self.dropped += 1
                logger.warning("rayemb tracking: param %r logged again with another value %r; dropped",
                               r["key"], r["v"])
        tags = {r["key"]: RunTag(r["key"], r["v"]) for r in batch if r["k"] == "t"}  # last value wins
        for i in range(0, len(metrics), _MAX_METRICS_PER_BATCH):
            client.log_batch(self.run_id, metrics=metrics[i:i + _MAX_METRICS_PER_BATCH], synchronous=True)
        plist, tlist = list(params.values()), list(tags.values())
        for i in range(0, max(len(plist), len(tlist)), _MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(self.run_id, params=plist[i:i + _MAX_PARAMS_TAGS_PER_BATCH],
                             tags=tlist[i:i + _MAX_PARAMS_TAGS_PER_BATCH], synchronous=True)
        for r in batch:
            if r["k"] == "a":
                if os.path.isdir(r["path"]):
                    client.log_artifacts(self.run_id, r["path"], r["dst"])
                elif os.path.exists(r["path"]):
                    client.log_artifact(self.run_id, r["path"], r["dst"])
                else:
                    logger.warning("rayemb tracking: artifact %s no longer exists; skipped", r["path"])
            elif r["k"] == "x":
                client.log_text(self.run_id, r["text"], r["file"])

    def _terminate(self) -> bool:
        try:
            self._get_client().set_terminated(self.run_id, status=self._final_status)
            return True
        except Exception as e:
            logger.warning("rayemb tracking: could not set run status (%s: %s); retrying", type(e).__name__, _short(e))
            self._connected = False
            self._next_attempt = time.monotonic() + _BACKOFF_INITIAL_S
            return False


#: seconds an unfinished run gets to flush when the interpreter exits
_AT_EXIT_TIMEOUT_S = 10.0


def _finish_at_exit(ref: "weakref.ReferenceType[RunLogger]") -> None:
    """A driver that exits without ``finish()`` (an uncaught error) still flushes and ends its run FAILED."""
    rl = ref()
    if rl is not None and rl._finish_result is None:
        rl.finish("FAILED", reason="the driver process exited without finishing the run", timeout_s=_AT_EXIT_TIMEOUT_S)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _short(e: BaseException, limit: int = 300) -> str:
    """One line of an exception's text, credentials in URIs redacted (client errors quote the URL)."""
    s = redact_text(str(e).replace("\n", " "))
    return s if len(s) <= limit else s[:limit] + "…"


def _describe(rec: Dict[str, Any]) -> str:
    kind = {"m": "metric", "p": "param", "t": "tag", "a": "artifact", "x": "text artifact"}.get(rec.get("k"), "record")
    name = rec.get("key") or rec.get("path") or rec.get("file")
    return f"{kind} {name!r}"
