"""A job's identity across drivers: rerunning an unfinished job continues it.

A job is named by the config's ``name`` (``RunConfig(name=...)`` from Python) within its
``tracking.output_dir``. Its record, ``<output_dir>/jobs/<name>.json``, says which run
folder (``job_id``: ``<name>-<UTC time>-<pid>``, as before) and which MLflow run hold it,
whether it finished, and which driver holds it now (host, pid, heartbeat). Each driver that
works on the job is one *attempt*.

What rerunning the same command does (``rayemb train``, ``ray job submit jobs/train.py``,
``EmbeddingTrainer.fit()``):

* no record, ``--new-run``, or ``--resume-from``: a new run (a new ``job_id`` and MLflow run);
* the last run unfinished (its driver or head died, it failed, it was interrupted): the next
  attempt of the same run. The workers find the newest intact checkpoint in the run's own
  checkpoint folder (:mod:`rayemb.train.worker.resume`), the MLflow run becomes RUNNING again with
  tag and metric ``attempt``, and metric points the dead attempt logged are not logged twice;
* the last run FINISHED: nothing is trained; the command says where the run is;
* a config that changed what the checkpoints hold (the model section, the dataset's
  tables, labels and columns): refused, naming the keys, before any work.

A record whose driver is alive is never taken over: on this host the pid is checked; a
driver on another host (a new head pod) waits until the old driver's heartbeat is older than
:data:`LEASE_S`. Ray Train v2 restores a run of the same name and storage the same way; this
adds the MLflow run, the plan and the check that the job is the same job.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional

from rayemb import storage
from rayemb.errors import ConfigError
from rayemb.logs import redact_uri

logger = logging.getLogger(__name__)

FORMAT = "rayemb-job/1"
#: seconds between the driver's heartbeats in the record
HEARTBEAT_S = 15.0
#: a heartbeat older than this means the driver that wrote it is gone
LEASE_S = 60.0
FINISHED = "FINISHED"
RUNNING = "RUNNING"


@dataclass
class JobRecord:
    """``<output_dir>/jobs/<name>.json``."""

    name: str
    job_id: str
    status: str = RUNNING
    attempt: int = 1
    run_id: Optional[str] = None
    #: what a checkpoint of this run depends on (:func:`resume_keys`), flattened
    keys: Dict[str, Any] = field(default_factory=dict)
    host: str = ""
    pid: int = 0
    heartbeat: float = 0.0
    #: one entry per attempt: when it started, where, from which checkpoint, how it ended
    attempts: List[Dict[str, Any]] = field(default_factory=list)
    #: at the end of a finished run: its final metrics and checkpoints, returned to a rerun
    result: Dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "JobRecord":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class JobAttempt:
    """What this driver does for the job: a new run, or the next attempt of an unfinished one."""

    name: str
    job_id: str
    attempt: int
    #: the MLflow run to continue (None: a new run)
    run_id: Optional[str] = None
    #: the finished run a rerun found (nothing to train)
    finished: Optional[JobRecord] = None
    #: where the record lives
    out_dir: str = ""
    #: the record this attempt writes when it starts its outputs (:meth:`Heartbeat.start`)
    record: Optional[JobRecord] = None

    @property
    def resuming(self) -> bool:
        return self.attempt > 1


def record_path(out_dir: str, name: str) -> str:
    return storage.join(out_dir, "jobs", f"{name}.json")


def read_record(out_dir: str, name: str) -> Optional[JobRecord]:
    """The job's record; None when there is none. A damaged one is an error naming the file (not a silent new run)."""
    path = record_path(out_dir, name)
    try:
        text = storage.read_text(path)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(text)
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        return JobRecord.from_dict(doc)
    except (ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"The job record {redact_uri(path)} is damaged ({e}). Remove it to let `{name}` start a "
                          "new run, or use --new-run.", "bad_job_record") from None


_write_lock = threading.Lock()


def write_record(out_dir: str, rec: JobRecord) -> None:
    with _write_lock:  # the heartbeat thread and the driver write the same file
        storage.write_text(record_path(out_dir, rec.name), json.dumps(asdict(rec), indent=1, sort_keys=True,
                                                                      default=str))


def resume_keys(cfg: Any, schema: Any) -> Dict[str, Any]:
    """What a checkpoint of the job holds, flattened (``model.embedding_dim``, ``schema.sparse.C1``, ...): two
    configs that differ here cannot continue each other."""
    model = cfg.to_dict().get("model", {})
    out: Dict[str, Any] = {}

    def flat(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k in sorted(value):
                flat(f"{prefix}.{k}", value[k])
        else:
            out[prefix] = value if isinstance(value, (int, float, str, bool, type(None))) else json.dumps(
                value, sort_keys=True, default=str)

    flat("model", model)
    out["schema.labels"] = ",".join(schema.labels)
    out["schema.dense"] = ",".join(schema.dense)
    for f in (*schema.sparse, *schema.sequence):
        out[f"schema.{'sequence' if f.sequence else 'sparse'}.{f.name}"] = json.dumps(
            dataclasses.asdict(f), sort_keys=True, default=str)
    return out


def _alive_here(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (killed, not yet reaped by its parent) holds no job
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def claim(cfg: Any, schema: Any, out_dir: str, new_run: bool = False, *, now: Callable[[], float] = time.time,
          sleep: Callable[[float], None] = time.sleep) -> JobAttempt:
    """Decides what this driver does for job ``cfg.name`` in ``out_dir`` (before any work). Nothing is written:
    the record changes when the attempt starts writing outputs (:class:`Heartbeat`), so a job that stops on bad
    input leaves none.

    Raises :class:`ConfigError` when the unfinished run's config differs in :func:`resume_keys`, or its driver
    is alive on this host."""
    name, keys = cfg.name, resume_keys(cfg, schema)
    rec = None if new_run or cfg.train.resume_from else read_record(out_dir, name)
    if rec is not None and rec.status == FINISHED:
        return JobAttempt(name, rec.job_id, rec.attempt, rec.run_id, finished=rec, out_dir=out_dir)
    if rec is not None:
        changed = sorted(k for k in set(keys) | set(rec.keys) if keys.get(k) != rec.keys.get(k))
        if changed:
            shown = ", ".join(f"{k}: {rec.keys.get(k)!r} -> {keys.get(k)!r}" for k in changed[:8])
            raise ConfigError(
                f"Job {name!r} in {redact_uri(out_dir)} has an unfinished run ({rec.job_id}) whose checkpoints were "
                f"made for another model or dataset: {shown}{' ...' if len(changed) > 8 else ''}. Rerun with the "
                "config it was started with to continue it, or start another run with --new-run (Python: "
                "fit(new_run=True)), or give the job another name.", "job_changed")
        _wait_for_driver(rec, out_dir, now, sleep)
        rec = read_record(out_dir, name) or rec
    here, pid = socket.gethostname(), os.getpid()
    if rec is None:
        rec = JobRecord(name=name, job_id=_new_job_id(name), keys=keys)
    else:
        rec.attempt += 1
        rec.status = RUNNING
    rec.host, rec.pid, rec.heartbeat = here, pid, now()
    rec.attempts.append({"attempt": rec.attempt, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "host": here, "pid": pid})
    return JobAttempt(name, rec.job_id, rec.attempt, rec.run_id if rec.attempt > 1 else None, out_dir=out_dir,
                      record=rec)


def _wait_for_driver(rec: JobRecord, out_dir: str, now: Callable[[], float], sleep: Callable[[float], None]) -> None:
    """Returns once the driver named in ``rec`` is gone; raises when it is alive on this host."""
    if rec.status != RUNNING or not rec.pid:
        return
    if rec.host == socket.gethostname():
        if _alive_here(int(rec.pid)) and int(rec.pid) != os.getpid():
            raise ConfigError(f"Job {rec.name!r} is running in process {rec.pid} on this host (run {rec.job_id}). "
                              "Wait for it, stop it, or start another run with --new-run.", "job_running")
        return
    while True:
        age = now() - float(rec.heartbeat)
        if age >= LEASE_S:
            return
        print(f"rayemb: job {rec.name!r}: its driver on {rec.host} (pid {rec.pid}) was alive {age:.0f}s ago; waiting "
              f"{LEASE_S - age:.0f}s for its lease to end", flush=True)
        sleep(LEASE_S - age)
        fresh = read_record(out_dir, rec.name)
        if fresh is None or fresh.heartbeat == rec.heartbeat or fresh.status != RUNNING:
            return
        rec.heartbeat = fresh.heartbeat


class Heartbeat:
    """Keeps the record's heartbeat fresh while this driver works on the job; ends the attempt in the record."""

    def __init__(self, out_dir: str, attempt: JobAttempt, interval_s: float = HEARTBEAT_S) -> None:
        self.out_dir, self.attempt, self.interval_s = out_dir, attempt, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rayemb-job-heartbeat", daemon=True)
        #: the heartbeat and the run id (set from the thread that sees the MLflow run created) rewrite one record
        self._lock = threading.Lock()

    def start(self) -> "Heartbeat":
        """Writes the attempt's record (the job is now this driver's), then keeps its heartbeat fresh."""
        rec = self.attempt.record
        rec.heartbeat = time.time()
        write_record(self.out_dir, rec)
        self._thread.start()
        return self

    def _update(self, change: Callable[[JobRecord], None]) -> None:
        with self._lock:
            rec = read_record(self.out_dir, self.attempt.name)
            if rec is None or rec.job_id != self.attempt.job_id or rec.attempt != self.attempt.attempt:
                return  # another run of the name took the record (--new-run): this one no longer owns it
            change(rec)
            write_record(self.out_dir, rec)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._update(lambda r: setattr(r, "heartbeat", time.time()))
            except Exception as e:  # noqa: BLE001 - a missed heartbeat costs a rerun a wait, never the job
                logger.warning("rayemb: job record heartbeat failed (%s: %s)", type(e).__name__, e)

    def set_run_id(self, run_id: Optional[str]) -> None:
        if run_id:
            self._update(lambda r: setattr(r, "run_id", run_id))

    def stop(self, status: str, result: Optional[Mapping[str, Any]] = None) -> None:
        """Ends the attempt: FINISHED (with ``result``) or FAILED; the record stays resumable unless FINISHED."""
        self._stop.set()
        self._thread.join(timeout=5)

        def end(r: JobRecord) -> None:
            r.status, r.pid, r.heartbeat = status, 0, time.time()
            if r.attempts:
                r.attempts[-1]["ended"] = status
            if result is not None:
                r.result = dict(result)
                r.run_id = result.get("run_id") or r.run_id

        try:
            self._update(end)
        except Exception as e:  # noqa: BLE001 - the run's outcome is in MLflow; a rerun then resumes or says so
            logger.warning("rayemb: could not end the job record (%s: %s)", type(e).__name__, e)


__all__ = ["FINISHED", "Heartbeat", "JobAttempt", "JobRecord", "LEASE_S", "claim", "read_record", "record_path",
           "resume_keys", "write_record"]
