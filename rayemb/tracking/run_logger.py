"""Driver-side MLflow writer that never slows or fails training.

rayemb's driver is the only MLflow writer (workers send their metrics through
:mod:`rayemb.tracking.callback`), so runs are never written concurrently. Every ``log_*`` call
of :class:`RunLogger` only appends a record (:mod:`rayemb.tracking.records`) to
an in-memory buffer and returns; one background thread drains the buffer in
batches through an explicit ``MlflowClient(tracking_uri)`` and run id
(``MlflowClient.log_batch``). When the tracking server is away the thread moves
the buffer to a local JSONL *spill file* (:mod:`rayemb.tracking.spill`),
retries with exponential backoff, and on reconnect replays the spill file
first, then the buffer. Every metric point keeps the step and the wall-clock
timestamp of the ``log_metrics`` call, so a replayed curve is the curve the job
produced. Nothing here raises into the caller: failures are logged and, at the
end, reported by the return value of :meth:`RunLogger.finish`.

Why a thread and our own retries: MLflow's REST client retries a failed call up
to 7 times with exponential backoff (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
``..._BACKOFF_FACTOR``) and waits up to 120 s per request
(``MLFLOW_HTTP_REQUEST_TIMEOUT``), so one synchronous call can block for
minutes while a server restarts. :class:`RunLogger` sets lower defaults for
these knobs (:data:`rayemb.tracking.store.CLIENT_ENV_DEFAULTS`, only where the
user has not set them) and keeps all calls off the caller's thread.

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
import logging
import os
import tempfile
import threading
import time
import uuid
import weakref
from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional

from rayemb.logs import redact_text, redact_uri
from rayemb.tracking import records
from rayemb.tracking.backoff import BACKOFF_INITIAL_S, Backoff
from rayemb.tracking.host import DEFAULT_SYSTEM_METRICS_INTERVAL_S, HostSampler
from rayemb.tracking.records import Record
from rayemb.tracking.spill import SpillFile
from rayemb.tracking.store import artifact_location, set_client_env_defaults
from rayemb.tracking.tags import TAG_FAILURE_REASON, TAG_PARENT_RUN_ID, standard_tags

logger = logging.getLogger(__name__)

#: records popped from memory (or read from the spill file) per send
DRAIN_CHUNK_RECORDS = 1000
#: wake the writer early once this many records wait
EARLY_FLUSH_RECORDS = 1000
#: seconds an unfinished run gets to flush when the interpreter exits
AT_EXIT_TIMEOUT_S = 10.0
TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")
#: characters of an exception's text a log line shows
_ERROR_TEXT_CHARS = 300


class RunLogger:
    """Driver-side MLflow writer: asynchronous, batched, bounded, never raises into training.

    Args:
        tracking_uri: MLflow tracking URI (absolute ``sqlite:////…`` or ``http://host:port``).
        experiment: experiment name; created if missing (for sqlite stores its
            artifacts go next to the database, under ``mlartifacts/``).
        run_name: MLflow run name.
        tags: extra run tags (e.g. :data:`~rayemb.tracking.tags.TAG_CLUSTER_SHAPE`,
            :data:`~rayemb.tracking.tags.TAG_PLAN_FINGERPRINT`); they override
            :func:`~rayemb.tracking.tags.standard_tags`.
        parent_run_id: makes this run a child (tag ``mlflow.parentRunId``), e.g. in a sweep.
        spill_dir: folder of the spill file (default: the system temp folder).
        flush_interval_s: the writer sends what waits at least this often.
        max_buffer: records held in memory; beyond it, records go straight to the spill file.
        system_metrics_interval_s: host CPU/memory % are logged this often (None: never).
        resume_run_id: continue this run (an unfinished job's next attempt): it becomes RUNNING again and
            :attr:`resumed_at_step` is the last step it logged. A run the store no longer has (a store that
            was lost with its head node) is replaced by a new one, with a warning.

    Attributes:
        run_id: set by :meth:`start` when the store answered; ``None`` while the
            server is unreachable (the run is created on reconnect).
        spill_path: the JSONL spill file (it exists only while something is spilled).
        shown_uri: the tracking URI as logs and messages show it (credentials replaced by ``***``).
        dropped: records MLflow rejected as invalid (not outages); each is logged as a warning.
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
        resume_run_id: Optional[str] = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.shown_uri = redact_uri(tracking_uri)
        self.experiment = experiment
        self.run_name = run_name
        self.parent_run_id = parent_run_id
        self.flush_interval_s = max(0.01, float(flush_interval_s))
        self.max_buffer = max(1, int(max_buffer))
        self.system_metrics_interval_s = system_metrics_interval_s
        self.run_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self._resume_run_id = resume_run_id
        #: the largest step of the continued run's training metrics (None: a new run)
        self.resumed_at_step: Optional[int] = None
        self._tags = dict(tags or {})
        self.spill_path = os.path.join(os.path.abspath(spill_dir) if spill_dir else tempfile.gettempdir(),
                                       f"rayemb-mlflow-spill-{uuid.uuid4().hex[:12]}.jsonl")
        self._spill = SpillFile(self.spill_path)

        self._buf: Deque[Record] = deque()
        self._cv = threading.Condition()
        self._client: Any = None
        self._thread: Optional[threading.Thread] = None
        self._started = False
        self._connected = False
        self._outage_logged = False
        self._backoff = Backoff()
        self._next_attempt = 0.0
        self._finishing = False
        self._abandon = False
        self._final_status = "FINISHED"
        self._done = threading.Event()
        self._delivered = False
        self._finish_result: Optional[bool] = None
        self._run_exists = threading.Event()
        self._sampler: Optional[HostSampler] = None
        self._next_sample = 0.0
        self._sample_step = 0
        self.dropped = 0

    # ---- caller side: cheap, never raises ---- #

    def start(self, connect: bool = True) -> "RunLogger":
        """Creates the experiment (if needed) and the run, then starts the writer thread.

        One attempt is made synchronously so that :attr:`run_id` is usually known
        on return; if the store is unreachable the writer keeps trying. ``connect=False``: the writer makes that
        first attempt too (MLflow's imports and the run's creation, a second or two of a fresh process, off the
        caller's thread); :meth:`wait_for_run` waits for it.
        """
        if self._started:
            return self
        self._started = True
        try:
            set_client_env_defaults()
            self._tags = {**standard_tags(), **{k: str(v) for k, v in self._tags.items()}}
            if self.system_metrics_interval_s:
                self._sampler = HostSampler()
                self._next_sample = time.monotonic() + self.system_metrics_interval_s
            if connect:
                self._try_connect()
        except Exception as e:
            logger.warning("rayemb tracking: could not start MLflow run (%s: %s); will retry", type(e).__name__, _short(e))
        self._thread = threading.Thread(target=self._writer, name="rayemb-mlflow-writer", daemon=True)
        self._thread.start()
        atexit.register(_finish_at_exit, weakref.ref(self))
        return self

    def wait_for_run(self, timeout_s: Optional[float] = None) -> Optional[str]:
        """Waits until the run exists in the store (at most ``timeout_s``); returns :attr:`run_id` (None: not yet)."""
        self._run_exists.wait(timeout_s)
        return self.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Logs a (nested) config as flattened params; numbers also as metrics ``param.<key>``.

        MLflow stores params as strings, so a filter like ``params.train.epochs > 2``
        compares text; the metric copy (step 0) makes ``metrics.`param.train.epochs` > 2`` work.
        Booleans are logged as 0/1 metrics.
        """
        self._enqueue_safely("log_params", lambda: records.param_records(params, records.now_ms()))

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: Optional[int] = None) -> None:
        """Enqueues one point per metric at ``step``, stamped ``timestamp_ms`` (when the metrics were made;
        default: now); returns at once."""
        when = records.now_ms() if timestamp_ms is None else int(timestamp_ms)
        self._enqueue_safely("log_metrics", lambda: records.metric_records(metrics, step, when))

    def log_artifact(self, local_path: str, artifact_path: Optional[str] = None) -> None:
        """Uploads a file (or folder) later; it must still exist when the writer gets to it."""
        self._enqueue_safely("log_artifact", lambda: [records.artifact_record(local_path, artifact_path)])

    def log_text(self, text: str, artifact_file: str) -> None:
        """Stores ``text`` as the artifact ``artifact_file`` (e.g. ``"config.yaml"``)."""
        self._enqueue_safely("log_text", lambda: [records.text_record(text, artifact_file)])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Sets run tags (values become strings, truncated to MLflow's 8000 characters)."""
        self._enqueue_safely("set_tags", lambda: records.tag_records(tags))

    def finish(self, status: str = "FINISHED", reason: Optional[str] = None, timeout_s: float = 60.0) -> bool:
        """Flushes everything, then sets the run's terminal status; waits at most ``timeout_s``.

        ``status`` is ``"FINISHED"``, ``"FAILED"`` or ``"KILLED"``; for FAILED the
        ``reason`` becomes the tag :data:`~rayemb.tracking.tags.TAG_FAILURE_REASON`.
        Returns True if every record and the status reached the store. On False
        the undelivered records stay in :attr:`spill_path` (logged as a warning).
        Calling it again returns the first result.
        """
        if self._finish_result is not None:
            return self._finish_result
        try:
            status = str(status).upper()
            if status not in TERMINAL_STATUSES:
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

    def _enqueue_safely(self, what: str, make: Any) -> None:
        """Enqueues the records ``make()`` returns; any error is logged, never raised."""
        try:
            self._enqueue(make())
        except Exception as e:
            logger.warning("rayemb tracking: %s failed (%s: %s)", what, type(e).__name__, _short(e))

    def _enqueue(self, recs: List[Record]) -> None:
        if not recs:
            return
        with self._cv:
            if self._finish_result is not None or self._abandon:
                logger.warning("rayemb tracking: %d records logged after finish(); written to %s",
                               len(recs), self.spill_path)
            elif len(self._buf) + len(recs) <= self.max_buffer:
                self._buf.extend(recs)
                if len(self._buf) >= EARLY_FLUSH_RECORDS:
                    self._cv.notify_all()
                return
        self._spill.append(recs)

    # ---- writer thread ---- #

    def _writer(self) -> None:
        try:
            while True:
                with self._cv:
                    # finishing and connected: no pause; otherwise sleep until there is work or a retry is due
                    busy = self._finishing and self._connected
                    if not busy and not self._abandon and len(self._buf) < EARLY_FLUSH_RECORDS:
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
            recs = records.metric_records(sample, self._sample_step, records.now_ms())
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
                if not (self._resume_run_id and self._reopen_run(client)):
                    self._create_run(client)
            else:
                client.get_run(self.run_id)
        except Exception as e:
            self._connected = False
            self._next_attempt = time.monotonic() + self._backoff.next_delay_s(self._finishing)
            self._log_outage(e, " and retrying")
            return False
        if self._outage_logged:
            logger.info("rayemb tracking: MLflow at %s reachable again; replaying buffered records", self.shown_uri)
        self._connected, self._outage_logged = True, False
        self._backoff.reset()
        self._run_exists.set()
        return True

    def _log_outage(self, e: BaseException, more: str = "") -> None:
        if not self._outage_logged:
            logger.warning("rayemb tracking: MLflow at %s unreachable (%s: %s); buffering to %s%s",
                           self.shown_uri, type(e).__name__, _short(e), self.spill_path, more)
            self._outage_logged = True

    def _create_run(self, client: Any) -> None:
        from mlflow.exceptions import MlflowException

        exp = client.get_experiment_by_name(self.experiment)
        if exp is None:
            try:
                self.experiment_id = client.create_experiment(
                    self.experiment, artifact_location=artifact_location(self.tracking_uri, self.experiment))
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

    def _reopen_run(self, client: Any) -> bool:
        """Continues :attr:`_resume_run_id`: RUNNING again, its last training step read. False when the store
        does not have it (an outage raises, and the writer tries again)."""
        from mlflow.exceptions import MlflowException

        try:
            run = client.get_run(self._resume_run_id)
        except MlflowException as e:
            if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                raise
            logger.warning("rayemb tracking: run %s is not in %s; this attempt logs to a new run",
                           self._resume_run_id, self.shown_uri)
            self._resume_run_id = None
            return False
        client.update_run(run.info.run_id, status="RUNNING")
        steps = [int(m.step) for m in run.data._metric_objs
                 if not m.key.startswith(("system/", "param.")) and m.key != "attempt"]
        self.resumed_at_step = max(steps) if steps else 0
        samples = [int(m.step) for m in run.data._metric_objs if m.key.startswith("system/")]
        self._sample_step = max(samples) + 1 if samples else 0  # host samples continue their own sequence
        self.run_id, self.experiment_id = run.info.run_id, run.info.experiment_id
        logger.info("rayemb tracking: continuing MLflow run %s at step %d", self.run_id, self.resumed_at_step)
        return True

    def _nothing_pending(self) -> bool:
        with self._cv:
            return not self._buf and not self._spill.pending

    def _drain(self) -> None:
        """Replays the spill file, then sends the in-memory buffer; stops at the first outage."""
        if not self._spill.replay(self._send, DRAIN_CHUNK_RECORDS):
            return
        while True:
            with self._cv:
                batch = [self._buf.popleft() for _ in range(min(DRAIN_CHUNK_RECORDS, len(self._buf)))]
            if not batch:
                return
            if not self._send(batch):
                self._spill.append(batch)
                self._spill_all_memory()
                return

    def _spill_all_memory(self) -> None:
        with self._cv:
            recs = list(self._buf)
            self._buf.clear()
        if recs:
            self._spill.append(recs)

    def _send(self, batch: List[Record]) -> bool:
        """Writes ``batch``; False on an outage. Records MLflow rejects as invalid are dropped (logged)."""
        try:
            self.dropped += records.write_records(self._get_client(), self.run_id, batch)
            return True
        except Exception as e:
            err = e
        # Outage or bad data? If the store answers a probe, it was the data.
        try:
            self._get_client().get_run(self.run_id)
        except Exception:
            self._connected = False
            self._next_attempt = time.monotonic() + BACKOFF_INITIAL_S
            self._log_outage(err)
            return False
        for rec in batch:
            try:
                self.dropped += records.write_records(self._get_client(), self.run_id, [rec])
            except Exception as e:
                self.dropped += 1
                logger.warning("rayemb tracking: MLflow rejected %s (%s: %s); dropped", records.describe(rec),
                               type(e).__name__, _short(e))
        return True

    def _terminate(self) -> bool:
        try:
            self._get_client().set_terminated(self.run_id, status=self._final_status)
            return True
        except Exception as e:
            logger.warning("rayemb tracking: could not set run status (%s: %s); retrying", type(e).__name__, _short(e))
            self._connected = False
            self._next_attempt = time.monotonic() + BACKOFF_INITIAL_S
            return False


def _finish_at_exit(ref: "weakref.ReferenceType[RunLogger]") -> None:
    """A driver that exits without ``finish()`` (an uncaught error) still flushes and ends its run FAILED."""
    rl = ref()
    if rl is not None and rl._finish_result is None:
        rl.finish("FAILED", reason="the driver process exited without finishing the run", timeout_s=AT_EXIT_TIMEOUT_S)


def _short(e: BaseException, limit: int = _ERROR_TEXT_CHARS) -> str:
    """One line of an exception's text, credentials in URIs redacted (client errors quote the URL)."""
    s = redact_text(str(e).replace("\n", " "))
    return s if len(s) <= limit else s[:limit] + "…"
