"""The sweep: many trials of one job config under Ray Tune, one parent MLflow run, resumable.

:func:`run_sweep` checks everything first (the space against the config, the metric, the search and scheduler,
the sweep's folder), then creates the parent run and runs Ray Tune. Its folder
``<tracking.output_dir>/sweeps/<name>`` holds Tune's state, one folder per trial (the trial's job outputs and
checkpoints), ``sweep.json`` (the parent run's id and the settings a resumed sweep must repeat) and
``stopped.json`` (why the scheduler stopped which trial).

MLflow layout (``rayemb compare --sweep`` and :mod:`rayemb.sweep.best` read it):

- the parent run: tag ``rayemb.kind=sweep``; params ``sweep.keys`` (the searched config keys, comma-separated),
  ``sweep.metric``, ``sweep.mode``, ``sweep.search``, ``sweep.scheduler``, ``sweep.num_samples``; artifact
  ``sweep/space.yaml``; at the end tag ``rayemb.sweep.best_run_id`` and metric ``best_<metric>``;
- one child run per trial (tag ``mlflow.parentRunId``): the job's own run (params under their config names,
  its metrics), tagged ``rayemb.sweep.trial_id``; a trial the scheduler stopped ends KILLED with tag
  ``rayemb.stopped_reason``; one whose job failed ends FAILED with ``rayemb.failure_reason``.

Example::

    >>> result = run_sweep("jobs/configs/synth_small.yaml", {"train.dense_lr": {"loguniform": [0.001, 0.3]}},
    ...                    num_samples=8, scheduler="asha")
    >>> result.best_run_id, result.best_value
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import yaml

from rayemb._ray import env_default
from rayemb.config import EARLY_STOPPING_METRICS, JobConfig, config_from_dict, resolve_path
from rayemb.errors import ConfigError
from rayemb.sweep.space import Dimension, check_space, load_space, parse_space
from rayemb.sweep.trial import LAST_VALIDATION, sweep_trainable, trial_job_name
from rayemb.tracking.tags import (PARAM_SWEEP_KEYS, PARAM_SWEEP_METRIC, PARAM_SWEEP_MODE, SWEEP_MODES, TAG_BEST_RUN_ID,
                                  TAG_FAILURE_REASON, TAG_STOPPED_REASON, TAG_TRIAL_ID)

logger = logging.getLogger(__name__)

SCHEDULERS = ("asha", "fifo")
SEARCHES = ("random", "optuna")
#: the sweep folder's record of its parent run and settings, and of the scheduler's stops
STATE_FILE = "sweep.json"
STOPPED_FILE = "stopped.json"
SPACE_FILE = "space.yaml"
#: what a trial's own process asks for (Tune refuses none at all)
TRIAL_DRIVER_CPUS = 0.01
#: ASHA keeps the top 1/2 of the trials at each rung (the median), starting at the first validation
ASHA_REDUCTION = 2
#: ASHA's rungs when a job validates every ``train.eval_every_n_steps`` and its steps per epoch are unknown (its
#: data unreadable from the sweep's driver): validations 1, 2, 4, ... 64
ASHA_RUNGS_MID_EPOCH = 100
#: seconds a stop waits for the stopped trial's job to end its MLflow run before Tune ends the trial's process
JOB_END_WAIT_S = 120.0


@dataclasses.dataclass(frozen=True)
class SweepSettings:
    """What a sweep searches and how (the command's options); a resumed sweep must repeat them."""

    metric: str = "valid_auc"
    mode: Optional[str] = None
    num_samples: int = 1
    scheduler: str = "asha"
    search: str = "random"
    max_concurrent: Optional[int] = None
    name: Optional[str] = None

    def recorded(self, space: Mapping[str, Dimension]) -> Dict[str, Any]:
        """What ``sweep.json`` keeps to refuse a resume with other settings (not max_concurrent: it may change)."""
        return {"metric": self.metric, "mode": self.mode, "num_samples": self.num_samples,
                "scheduler": self.scheduler, "search": self.search,
                "space": {k: {d.kind: list(d.values)} for k, d in space.items()}}


@dataclasses.dataclass
class SweepResult:
    """A finished sweep: its parent run, its best trial's run and metric, and every trial's outcome."""

    parent_run_id: str
    tracking_uri: str
    folder: str
    metric: str
    mode: str
    best_run_id: Optional[str]
    best_value: Optional[float]
    #: per trial: ``trial_id``, ``status`` (FINISHED, KILLED, FAILED), ``run_id``, ``value``, ``error``
    trials: List[Dict[str, Any]]


def _settings_checked(settings: SweepSettings, space: Mapping[str, Dimension]) -> SweepSettings:
    from rayemb.train.worker.metrics import metric_goal

    if settings.metric not in EARLY_STOPPING_METRICS:
        raise ConfigError(f"--metric {settings.metric!r} is not a validation metric a job reports; use one of "
                          f"{list(EARLY_STOPPING_METRICS)}.", category="invalid_sweep")
    mode = settings.mode
    if mode is None:
        goal = metric_goal(settings.metric)
        if goal not in SWEEP_MODES:
            raise ConfigError(f"--metric {settings.metric} is best closest to {goal}, which Tune cannot rank; "
                              "pass --mode max or --mode min.", category="invalid_sweep")
        mode = goal
    if mode not in SWEEP_MODES:
        raise ConfigError(f"--mode {mode!r}: use max or min.", category="invalid_sweep")
    if settings.scheduler not in SCHEDULERS:
        raise ConfigError(f"--scheduler {settings.scheduler!r}: use one of {list(SCHEDULERS)}.",
                          category="invalid_sweep")
    if settings.search not in SEARCHES:
        raise ConfigError(f"--search {settings.search!r}: use one of {list(SEARCHES)}.", category="invalid_sweep")
    if settings.search == "optuna":
        if importlib.util.find_spec("optuna") is None:
            raise ConfigError("--search optuna needs the optuna package, which is not installed: "
                              "pip install 'rayemb[optuna]' (or use --search random).", category="invalid_sweep")
        grids = [k for k, d in space.items() if d.kind == "grid"]
        if grids:
            raise ConfigError(f"--search optuna samples every key and runs no grid; {', '.join(grids)} use grid. "
                              "Write {choice: [...]} for them, or use --search random.", category="invalid_sweep")
    if not isinstance(settings.num_samples, int) or settings.num_samples < 1:
        raise ConfigError(f"--num-samples {settings.num_samples!r}: use 1 or more.", category="invalid_sweep")
    if settings.max_concurrent is not None and settings.max_concurrent < 1:
        raise ConfigError(f"--max-concurrent {settings.max_concurrent}: use 1 or more, or leave it out for what the "
                          "cluster holds.", category="invalid_sweep")
    return dataclasses.replace(settings, mode=mode)


def default_concurrency(configs: Sequence[JobConfig], cluster_cpus: float, cluster_gpus: float = 0.0,
                        trials: Optional[int] = None) -> int:
    """How many of these jobs the cluster runs at once: the largest job's workers' CPUs (and GPUs) fit that many
    times in the cluster (:func:`cluster_capacity`) less the CPUs a job's Ray Data reads need (at least one
    trial, at most ``trials``, the sweep's count)."""
    from rayemb.constants import RESERVED_DATA_CPUS
    from rayemb.train.driver.resources import resolve_cpus_per_worker

    cpus = max(c.scaling.num_workers * resolve_cpus_per_worker(c, cluster_cpus) for c in configs)
    fit = int((cluster_cpus - RESERVED_DATA_CPUS + 1e-9) // cpus)
    gpu_jobs = [c.scaling.num_workers for c in configs if c.scaling.use_gpu]
    if gpu_jobs:
        fit = min(fit, int(cluster_gpus // max(gpu_jobs)))
    return max(1, min(fit, trials) if trials else fit)


def cluster_capacity(live: Mapping[str, float], most: Optional[Mapping[str, float]] = None) -> Dict[str, float]:
    """The CPUs and GPUs the cluster can hold: what its nodes have (``live``, ``ray.cluster_resources()``), or
    what its autoscaler may grow it to (``most``) when larger.

    Where the jobs' workers fit only once the autoscaler adds nodes, the trials beyond what the live nodes hold
    start anyway: their jobs' placement groups wait, and that pending demand is what makes the autoscaler add
    the nodes. A node type without a limit (``sys.maxsize``) bounds nothing, the trial count does."""
    out = {k: float(live.get(k, 0.0)) for k in ("CPU", "GPU")}
    for k in out:
        if most and most.get(k):
            out[k] = max(out[k], float(most[k]))
    return out


def autoscaler_max_resources() -> Optional[Dict[str, float]]:
    """The most of each resource the connected cluster's autoscaler may reach, from the limits it published to
    the GCS (Ray's ``ClusterConfig``, which Ray Train reads before it waits for its workers); None where none
    are published (a fixed cluster; Ray's v1 autoscaler, as ``ray up`` and ``cluster/fake_autoscaler.py`` run
    it, publishes none)."""
    try:
        from ray._private.state import state

        return state.get_max_resources_from_cluster_config()
    except Exception:  # noqa: BLE001 - an older or newer Ray without it: what the live nodes hold
        return None


def trial_count(dims: Mapping[str, Dimension], num_samples: int) -> int:
    """How many trials a sweep runs: each grid combination ``num_samples`` times."""
    return num_samples * math.prod(len(d.values) for d in dims.values() if d.kind == "grid")


def sweep_folder(cfg: JobConfig, name: str) -> str:
    root = resolve_path(cfg.tracking.output_dir)
    if "://" in root:
        raise ConfigError(f"A sweep keeps Tune's state in a local folder, and tracking.output_dir={root!r} is not "
                          "local. Set a local tracking.output_dir for the sweep (--set tracking.output_dir=runs).",
                          category="invalid_sweep")
    return os.path.join(root, "sweeps", name)


def _read_state(folder: str) -> Optional[Dict[str, Any]]:
    path = os.path.join(folder, STATE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _check_folder(folder: str, name: str, settings: SweepSettings, space: Mapping[str, Dimension],
                  resume: bool) -> Optional[Dict[str, Any]]:
    state = _read_state(folder)
    if state is None:
        if resume:
            raise ConfigError(f"--resume: there is no sweep {name!r} to resume ({folder} has no {STATE_FILE}). Drop "
                              "--resume to start it, or pass the --name of the sweep to resume.",
                              category="invalid_sweep")
        if os.path.isdir(folder) and os.listdir(folder):
            raise ConfigError(f"The sweep folder {folder} exists and holds no sweep's record. Pass --name NAME for "
                              "another sweep, or remove the folder.", category="invalid_sweep")
        return None
    if not resume:
        raise ConfigError(f"Sweep {name!r} exists ({folder}, parent run {state.get('parent_run_id')}). Pass --resume "
                          "to continue it, or --name NAME to start another.", category="invalid_sweep")
    wanted = settings.recorded(space)
    changed = sorted(k for k, v in wanted.items() if state.get("settings", {}).get(k) != v)
    if changed:
        raise ConfigError(f"--resume: sweep {name!r} ran with other {', '.join(changed)} than these ("
                          f"{folder}/{STATE_FILE}). Resume it with the same space and options, or pass --name NAME "
                          "for a new sweep.", category="invalid_sweep")
    return state


def job_validations(cfg: JobConfig, rows: Optional[Dict[str, Any]] = None) -> Optional[int]:
    """:func:`~rayemb.train.worker.validation.validation_count` of a job config, its steps per epoch read from its data's parquet footers as the
    job reads them; None where they cannot be read here (the job itself then says why). ``rows``: the split
    rows already read, by ``data.path`` (filled in)."""
    if not cfg.train.eval_every_n_steps:
        return cfg.train.epochs
    from rayemb.constants import TRAIN_SPLIT, VALID_SPLIT
    from rayemb.data.schema import count_rows
    from rayemb.publish import resolve_dataset
    from rayemb.train.worker.data_loader import split_steps
    from rayemb.train.worker.validation import validation_count

    rows = {} if rows is None else rows
    try:
        if cfg.data.path not in rows:
            data_dir = resolve_dataset(resolve_path(cfg.data.path))
            rows[cfg.data.path] = (data_dir, count_rows(data_dir, TRAIN_SPLIT), count_rows(data_dir, VALID_SPLIT))
        data_dir, train_rows, valid_rows = rows[cfg.data.path]
        steps = split_steps(train_rows, valid_rows, cfg, data_dir)
    except Exception:  # noqa: BLE001 - unreadable or too small: the trial's job fails with rayemb's error
        return None
    if cfg.train.max_steps_per_epoch is not None:
        steps = min(steps, cfg.train.max_steps_per_epoch)
    return validation_count(cfg.train.epochs, steps, cfg.train.eval_every_n_steps)


def asha_max_t(configs: Sequence[JobConfig]) -> int:
    """ASHA's ``max_t``: one validation short of the most any trial's job makes, so that no rung sits at a job's
    last validation (a trial there has trained to its end; :data:`~rayemb.sweep.trial.LAST_VALIDATION` keeps
    it FINISHED where the trials' counts differ)."""
    rows: Dict[str, Any] = {}
    counts = [job_validations(c, rows) for c in configs]
    most = max(counts) if counts and None not in counts else ASHA_RUNGS_MID_EPOCH
    return max(1, most - 1)


def _scheduler(settings: SweepSettings, configs: Sequence[JobConfig], folder: str) -> Any:
    if settings.scheduler == "fifo":
        from ray.tune.schedulers import FIFOScheduler

        return FIFOScheduler()
    # metric and mode come from the TuneConfig
    return _RecordingASHA(os.path.join(folder, STOPPED_FILE), registry_name(folder), max_t=asha_max_t(configs),
                          grace_period=1, reduction_factor=ASHA_REDUCTION, stop_last_trials=False)


def _make_asha_class() -> Any:
    from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler

    class RecordingASHA(AsyncHyperBandScheduler):
        """ASHA that writes why it stopped each trial to ``stopped.json`` (the driver marks the runs from it), and
        never stops a trial at its job's last validation (it has trained to its end: it ends FINISHED).
        ``registry``: the sweep's :class:`~rayemb.sweep.trial.ControllerRegistry` actor's name (None: a stop ends
        the trial's process alone)."""

        def __init__(self, stopped_path: str, registry: Optional[str], **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.stopped_path, self.registry = stopped_path, registry

        def on_trial_result(self, tune_controller: Any, trial: Any, result: Dict) -> str:
            decision = super().on_trial_result(tune_controller, trial, result)
            if decision == TrialScheduler.STOP and result.get(LAST_VALIDATION):
                return TrialScheduler.CONTINUE
            if decision == TrialScheduler.STOP:
                value, at = result.get(self._metric), int(result.get(self._time_attr, 0))
                epoch = f" (epoch {int(result['epoch']) + 1})" if "epoch" in result else ""
                record_stop(self.stopped_path, trial.trial_id,
                            f"asha: {self._metric}={value:.4f} below the median of the trials at validation "
                            f"{at}{epoch}")
                # before Tune ends the trial's process: its run's workers and their CPUs are released now, and
                # its job ends its MLflow run (phases, charts, end) before the process goes
                if self.registry is not None:
                    _quietly(stop_trial_job, self.registry, trial.trial_id)
            return decision

    return RecordingASHA


def _RecordingASHA(stopped_path: str, registry: Optional[str], **kwargs: Any) -> Any:
    return _make_asha_class()(stopped_path, registry, **kwargs)


def registry_name(folder: str) -> str:
    """The name of the sweep's :class:`~rayemb.sweep.trial.ControllerRegistry` actor (the same for a resumed
    sweep, whose restored scheduler looks it up by name)."""
    return "rayemb-sweep-" + hashlib.sha1(os.path.abspath(folder).encode()).hexdigest()[:16]


def abort_trial_run(registry: str, trial_id: str) -> bool:
    import ray

    return bool(ray.get(ray.get_actor(registry).abort.remote(trial_id), timeout=120))


def stop_trial_job(registry: str, trial_id: str, wait_s: float = JOB_END_WAIT_S) -> bool:
    """Aborts the trial's Ray Train run, then waits (at most ``wait_s``) until the trial's job has ended its
    MLflow run: Tune ends a stopped trial's process as soon as the scheduler returns, and the job's last writes
    (its ``phase_s.*``, charts and the run's end) would be lost with it. True when the job ended in time."""
    import time

    import ray

    if not abort_trial_run(registry, trial_id):
        return False
    actor, deadline = ray.get_actor(registry), time.monotonic() + wait_s
    while not ray.get(actor.has_ended.remote(trial_id), timeout=30):
        if time.monotonic() > deadline:
            logger.warning("rayemb sweep: trial %s's job did not end its MLflow run within %.0f s of its stop",
                           trial_id, wait_s)
            return False
        time.sleep(0.2)
    return True


def record_stop(path: str, trial_id: str, reason: str) -> None:
    stopped = read_stops(path)
    stopped[trial_id] = reason
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(stopped, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def read_stops(path: str) -> Dict[str, str]:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


class TrialRuns:
    """The sweep driver's view of its trials' MLflow runs: found by job name under the parent, tagged with their
    trial id, and marked KILLED (with the scheduler's reason) when the scheduler stopped them."""

    def __init__(self, tracking_uri: str, parent_run_id: str, base_name: str, stopped_path: str) -> None:
        self.tracking_uri, self.parent_run_id = tracking_uri, parent_run_id
        self.base_name, self.stopped_path = base_name, stopped_path
        self._client: Any = None
        self._found: Dict[str, str] = {}

    @property
    def client(self) -> Any:
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(self.tracking_uri)
        return self._client

    def run_of(self, trial_id: str) -> Optional[Any]:
        """The trial's MLflow run (None: its job made none, e.g. its plan did not fit)."""
        from rayemb.tracking.tags import TAG_PARENT_RUN_ID

        parent = self.client.get_run(self.parent_run_id)
        runs = self.client.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.`{TAG_PARENT_RUN_ID}` = '{self.parent_run_id}' and "
                          f"tags.`rayemb.job_name` = '{trial_job_name(self.base_name, trial_id)}'")
        if not runs:
            return None
        run = runs[0]
        if self._found.get(trial_id) != run.info.run_id:
            self.client.set_tag(run.info.run_id, TAG_TRIAL_ID, trial_id)
            self._found[trial_id] = run.info.run_id
        return run

    def settle(self, trial_id: str, reported: Sequence[Mapping[str, Any]] = ()) -> Optional[Any]:
        """Tags the trial's run; a trial the scheduler stopped ends KILLED with the reason. Every validation the
        trial reported to Tune (``reported``) is put in its run's metrics where the run lacks it (its process may
        end before its run's writer sent the last one), on every call: Tune's end of the trial and the sweep's end
        each settle it, in either order, with what each has seen. Returns the run."""
        run = self.run_of(trial_id)
        if run is None:
            return None
        run_id = run.info.run_id
        logged = self._log_missing(run_id, reported)
        reason = read_stops(self.stopped_path).get(trial_id)
        # settled already (a resumed sweep settles every trial again): its end stays when it was stopped
        if reason is not None and not (
                run.info.status == "KILLED" and run.data.tags.get(TAG_STOPPED_REASON) == reason):
            self.client.set_tag(run_id, TAG_STOPPED_REASON, reason)
            # the job ended its own run FAILED when its aborted Ray Train run raised: the stop is the reason
            if TAG_FAILURE_REASON in run.data.tags:
                self.client.delete_tag(run_id, TAG_FAILURE_REASON)
            self.client.set_terminated(run_id, "KILLED")
            logged = True
        return self.client.get_run(run_id) if logged else run

    def _log_missing(self, run_id: str, reported: Sequence[Mapping[str, Any]]) -> bool:
        import time

        from mlflow.entities import Metric

        now, missing = int(time.time() * 1000), []
        for key in sorted({k for r in reported for k in r if k.startswith("valid_")}):
            logged = {m.step for m in self.client.get_metric_history(run_id, key)}
            missing += [Metric(key, float(r[key]), now, int(r["step"])) for r in reported
                        if key in r and "step" in r and _finite(r[key]) and int(r["step"]) not in logged]
        if missing:
            self.client.log_batch(run_id, metrics=missing)
        return bool(missing)


def _make_callback(runs: TrialRuns) -> Any:
    from ray.tune import Callback

    class TrialRunsCallback(Callback):
        """Tags each trial's MLflow run as its first validation arrives, and settles it with every validation it
        reported when the trial ends."""

        def __init__(self) -> None:
            self.reported: Dict[str, List[Dict[str, Any]]] = {}

        def on_trial_result(self, iteration: int, trials: List[Any], trial: Any, result: Dict, **info: Any) -> None:
            self.reported.setdefault(trial.trial_id, []).append(
                {k: v for k, v in result.items() if k == "step" or k.startswith("valid_")})
            if trial.trial_id not in runs._found:
                _quietly(runs.run_of, trial.trial_id)

        def on_trial_complete(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
            _quietly(runs.settle, trial.trial_id, self.reported.pop(trial.trial_id, []))

        def on_trial_error(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
            _quietly(runs.run_of, trial.trial_id)

    return TrialRunsCallback()


def _quietly(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the end of the sweep settles every run again
        logger.warning("rayemb sweep: could not update a trial's MLflow run (%s: %s)", type(e).__name__, e)
        return None


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id


def _space_of(space: Union[str, Mapping[str, Any]]) -> Dict[str, Dimension]:
    if isinstance(space, str):
        return load_space(space)
    if space and all(isinstance(v, Dimension) for v in space.values()):
        return dict(space)
    return parse_space(space, where="space")


def _base_of(config: Union[str, JobConfig, Mapping[str, Any]], overrides: Sequence[str]) -> Dict[str, Any]:
    from rayemb.config import apply_overrides, load_config

    if isinstance(config, str):
        load_config(config, overrides)  # the config's own errors, named by its file, before the space's
        with open(config) as f:
            return apply_overrides(yaml.safe_load(f), overrides)
    d = config.to_dict() if isinstance(config, JobConfig) else dict(config)
    config_from_dict(d, overrides)
    return apply_overrides(d, overrides)


def run_sweep(config: Union[str, JobConfig, Mapping[str, Any]], space: Union[str, Mapping[str, Any]], *,
              overrides: Sequence[str] = (), metric: str = "valid_auc", mode: Optional[str] = None,
              num_samples: int = 1, scheduler: str = "asha", search: str = "random",
              max_concurrent: Optional[int] = None, name: Optional[str] = None, resume: bool = False,
              space_text: Optional[str] = None) -> SweepResult:
    """Runs a sweep of ``config`` (a YAML path, a JobConfig or a config mapping, with ``overrides``) over
    ``space`` (a ``space.yaml`` path or its mapping); see the module for its folder and MLflow runs.

    ``name``: the sweep's (default: the job's name); ``resume``: continue the sweep of that name, whose driver
    died, without rerunning its finished trials, in the same parent run. Bad input raises
    :class:`~rayemb.errors.ConfigError` before any trial starts or any MLflow run is created."""
    dims = _space_of(space)
    settings = _settings_checked(SweepSettings(metric, mode, num_samples, scheduler, search, max_concurrent, name),
                                 dims)
    base = _base_of(config, overrides)
    checked = check_space(dims, base, where=space if isinstance(space, str) else "space")
    probe = config_from_dict(base)
    name = settings.name or probe.name
    folder = sweep_folder(probe, name)
    state = _check_folder(folder, name, settings, dims, resume)
    # everything is checked: from here the sweep runs
    return _run(base, probe, dims, settings, name, folder, state, [probe, *checked],
                space_text or yaml.safe_dump(settings.recorded(dims)["space"], sort_keys=False))


def _run(base: Dict[str, Any], probe: JobConfig, dims: Mapping[str, Dimension], settings: SweepSettings,
         name: str, folder: str, state: Optional[Dict[str, Any]], configs: Sequence[JobConfig],
         space_text: str) -> SweepResult:
    import ray
    from ray import tune

    from rayemb._ray import init_ray
    from rayemb.tracking import RunLogger, ensure_store
    from rayemb.tracking.tags import TAG_KIND
    from rayemb.train.driver.outputs import tracking_uri as job_tracking_uri

    init_ray()
    capacity = cluster_capacity(ray.cluster_resources(), autoscaler_max_resources())
    concurrency = settings.max_concurrent or default_concurrency(configs, capacity["CPU"] or 1.0, capacity["GPU"],
                                                                 trials=trial_count(dims, settings.num_samples))
    uri = job_tracking_uri(probe.tracking.tracking_uri, resolve_path(probe.tracking.output_dir))
    ensure_store(uri)
    os.makedirs(folder, exist_ok=True)
    parent = RunLogger(uri, probe.tracking.experiment, run_name=f"sweep-{name}", tags={TAG_KIND: "sweep"},
                       system_metrics_interval_s=None,
                       resume_run_id=state["parent_run_id"] if state else None).start()
    if parent.run_id is None:
        raise ConfigError(f"The MLflow store {parent.shown_uri} did not answer; a sweep nests its trials under a "
                          "parent run made before they start. Start the tracking server, or unset "
                          "tracking.tracking_uri for the local store.", category="tracking_unreachable")
    if state is None:
        space_path = os.path.join(folder, SPACE_FILE)
        with open(space_path, "w") as f:
            f.write(space_text)
        with open(os.path.join(folder, STATE_FILE), "w") as f:
            json.dump({"parent_run_id": parent.run_id, "tracking_uri": uri, "experiment": probe.tracking.experiment,
                       "settings": settings.recorded(dims)}, f, indent=1)
        parent.log_params({PARAM_SWEEP_KEYS: ",".join(dims), PARAM_SWEEP_METRIC: settings.metric,
                           PARAM_SWEEP_MODE: settings.mode, "sweep.search": settings.search,
                           "sweep.scheduler": settings.scheduler, "sweep.num_samples": settings.num_samples,
                           "sweep.max_concurrent": concurrency})
        parent.log_artifact(space_path, "sweep")
    print(f"rayemb: sweep {name!r}: {', '.join(dims)}; {settings.search} search, {settings.scheduler} scheduler on "
          f"{settings.metric} ({settings.mode}), up to {concurrency} trial(s) at once; parent MLflow run "
          f"{parent.run_id}; folder {folder}", flush=True)
    runs = TrialRuns(uri, parent.run_id, probe.name, os.path.join(folder, STOPPED_FILE))
    # the trial's process is its job's driver and waits on it; the job's workers and reads ask for their own CPUs
    from rayemb.sweep.trial import ControllerRegistry

    registry = ray.remote(num_cpus=0)(ControllerRegistry).options(name=registry_name(folder),
                                                                  get_if_exists=True).remote()
    trainable = tune.with_resources(sweep_trainable(base, settings.metric, parent.run_id, uri,
                                                    registry=registry_name(folder)), {"CPU": TRIAL_DRIVER_CPUS})
    status, reason = "FAILED", None
    try:
        grid = _tune(trainable, dims, settings, configs, folder, name, concurrency, runs, resumed=state is not None)
        result = _settle(grid, runs, settings)
        result.folder = folder
        if result.best_run_id is not None:
            parent.set_tags({TAG_BEST_RUN_ID: result.best_run_id})
            parent.log_metrics({f"best_{settings.metric}": result.best_value}, step=0)
            status = "FINISHED"
        else:
            reason = f"no trial reported {settings.metric}: " + "; ".join(
                f"{t['trial_id']} {t['status']}" + (f" ({t['error']})" if t.get("error") else "")
                for t in result.trials)
        return result
    except KeyboardInterrupt:
        status, reason = "KILLED", "interrupted"
        raise
    finally:
        parent.finish(status, reason=reason)
        ray.kill(registry)


#: seconds Tune waits for a stopped trial's process to exit before it kills it. A trial stopped while its job
#: trains does not exit by itself (its job's Ray Train run holds it), and its workers hold their CPUs until it
#: is gone: Tune's default (600 s) would stall the next trial that long.
TRIAL_STOP_GRACE_S = "5"
_STOP_GRACE_ENV = "TUNE_FORCE_TRIAL_CLEANUP_S"


def _tune(trainable: Any, dims: Mapping[str, Dimension], settings: SweepSettings, configs: Sequence[JobConfig],
          folder: str, name: str, concurrency: int, runs: TrialRuns, resumed: bool) -> Any:
    """Tune's run of the sweep; ``configs``: the job configs :func:`check_space` built (ASHA's rungs fit the most
    validations any of them makes)."""
    from ray import tune

    if resumed and tune.Tuner.can_restore(folder):
        with _stop_grace():
            return tune.Tuner.restore(folder, trainable, resume_unfinished=True, resume_errored=False).fit()
    search_alg = None
    if settings.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        search_alg = OptunaSearch()  # metric and mode come from the TuneConfig
    tuner = tune.Tuner(
        trainable,
        param_space={k: d.tune() for k, d in dims.items()},
        tune_config=tune.TuneConfig(metric=settings.metric, mode=settings.mode, num_samples=settings.num_samples,
                                    scheduler=_scheduler(settings, configs, folder), search_alg=search_alg,
                                    max_concurrent_trials=concurrency, trial_dirname_creator=_trial_dirname),
        run_config=tune.RunConfig(name=name, storage_path=os.path.dirname(folder), callbacks=[_make_callback(runs)],
                                  verbose=1),
    )
    with _stop_grace():
        return tuner.fit()


def _stop_grace() -> Any:
    """Tune's grace for stopped trials for the ``fit()`` in the block (a user's own value kept)."""
    return env_default(_STOP_GRACE_ENV, TRIAL_STOP_GRACE_S)


def _settle(grid: Any, runs: TrialRuns, settings: SweepSettings) -> SweepResult:
    """Every trial's run tagged and settled (after Tune ended the trials' processes, so nothing overwrites it);
    the best trial by its best validation."""
    trials = []
    for r in grid:
        trial_id = (r.metrics or {}).get("trial_id") or os.path.basename(r.path)
        frame = r.metrics_dataframe
        reported = frame.to_dict("records") if frame is not None else []
        run = _quietly(runs.settle, trial_id, reported)
        values = [float(x[settings.metric]) for x in reported if _finite(x.get(settings.metric))]
        error = None if r.error is None else _error_line(r.error)
        trials.append({"trial_id": trial_id, "run_id": run.info.run_id if run is not None else None,
                       "status": run.info.status if run is not None else "FAILED",
                       "value": (max(values) if settings.mode == "max" else min(values)) if values else None,
                       "error": error})
    scored = [t for t in trials if t["value"] is not None and t["run_id"] is not None and t["status"] != "FAILED"]
    best = (max if settings.mode == "max" else min)(scored, key=lambda t: t["value"]) if scored else None
    return SweepResult(parent_run_id=runs.parent_run_id, tracking_uri=runs.tracking_uri, folder="",
                       metric=settings.metric, mode=settings.mode, best_run_id=best["run_id"] if best else None,
                       best_value=best["value"] if best else None, trials=trials)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def _error_line(error: BaseException) -> str:
    from rayemb.errors import find_user_error

    user = find_user_error(error)
    text = user.message if user is not None else str(error).strip().splitlines()[-1:] or [type(error).__name__]
    return text if isinstance(text, str) else text[0]


__all__ = ["run_sweep", "SweepResult", "SweepSettings", "default_concurrency", "cluster_capacity",
           "autoscaler_max_resources", "trial_count", "sweep_folder", "TrialRuns",
           "job_validations", "asha_max_t"]
