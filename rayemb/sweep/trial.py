"""A sweep's trial: one whole rayemb job, run by Ray Tune as a function trainable.

The trial is the job's driver: it builds the job config with the trial's values, runs it through the driver
``rayemb train`` runs (its own plan for its own shape, its own Ray Train workers, its own MLflow child run of the
sweep's parent; the statistics and calibrations kept by the sweep's earlier trials: :func:`share_kept`), and
hands every validation the driver receives (each epoch's, and each ``train.eval_every_n_steps`` one) to Ray Tune,
whose scheduler may stop it there. A job that cannot start (a plan
that does not fit, bad data) fails the trial with rayemb's error; the sweep goes on.

The trial's Tune process holds no CPU: its job's Ray Train workers and Ray Data reads ask for their own, and the
sweep limits how many trials run at once by what their jobs need (:func:`rayemb.sweep.engine.default_concurrency`).

Example, with a Tuner of one's own::

    >>> from ray import tune
    >>> trainable = sweep_trainable("jobs/configs/synth_small.yaml", metric="valid_auc")
    >>> tune.Tuner(trainable, param_space={"train.dense_lr": tune.grid_search([0.1, 0.01])},
    ...            tune_config=tune.TuneConfig(metric="valid_auc", mode="max", max_concurrent_trials=1)).fit()
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Dict, Mapping, Optional, Union

from rayemb.config import JobConfig, apply_overrides, config_from_dict, load_config, resolve_path
from rayemb.constants import WORKSPACE_ENV_VAR
from rayemb.errors import ConfigError

#: the key of a Tune result that is its job's last validation
LAST_VALIDATION = "last_validation"


def trial_job_name(base_name: str, trial_id: str) -> str:
    """The job name (and MLflow tag ``rayemb.job_name``) of a trial: the sweep driver finds its run by it."""
    return f"{base_name}-{trial_id}"


def _numeric(report: Mapping[str, Any]) -> Dict[str, float]:
    return {k: float(v) for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(float(v))}


class ControllerRegistry:
    """The Ray Train controllers of a sweep's running trials, by trial id: a named actor of the sweep's driver.

    When the scheduler stops a trial, the driver aborts its job's Ray Train run through it (the workers' placement
    group removed at once). Without that, the run would hold its workers' CPUs after Tune ended the trial's
    process, and the next trial could not start. Each trial's process marks here when its job has ended its MLflow
    run (:meth:`end`): the scheduler waits for that before Tune ends the process, which would cut the run's last
    writes (its phases, charts, end) short."""

    def __init__(self) -> None:
        self.controllers: Dict[str, Any] = {}
        self.ended: set = set()

    def end(self, trial_id: str) -> None:
        self.ended.add(trial_id)

    def has_ended(self, trial_id: str) -> bool:
        return trial_id in self.ended

    def put(self, trial_id: str, controller: Any) -> None:
        self.controllers[trial_id] = controller

    def abort(self, trial_id: str, timeout_s: float = 60.0) -> bool:
        """Aborts the trial's Ray Train run; True where the trial had one (its job then ends its MLflow run)."""
        import ray

        controller = self.controllers.pop(trial_id, None)
        if controller is None:
            return False
        try:
            ray.get(controller.abort.remote(), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - the controller exits as it aborts, or its run ended meanwhile
            pass
        return True


def _controller_callback(registry_name: str, trial_id: str) -> Any:
    """A Ray Train controller callback that registers the controller under ``trial_id`` in the sweep's
    :class:`ControllerRegistry` (``registry_name``)."""
    from ray.train.v2._internal.execution.callback import ControllerCallback

    class RegisterController(ControllerCallback):
        def after_controller_start(self, train_run_context: Any) -> None:
            import ray

            try:
                registry = ray.get_actor(registry_name)
                registry.put.remote(trial_id, ray.get_runtime_context().current_actor)
            except Exception:  # noqa: BLE001 - no registry (a Tuner of one's own): Tune ends the trial alone
                pass

    return RegisterController()


def _mark_ended(registry_name: str, trial_id: str) -> None:
    """Tells the sweep's :class:`ControllerRegistry` that the trial's job has ended its run."""
    import ray

    try:
        ray.get(ray.get_actor(registry_name).end.remote(trial_id), timeout=30)
    except Exception:  # noqa: BLE001 - no registry (a Tuner of one's own): nothing waits on it
        pass


class TuneReporter:
    """Called by the job's driver with every report it receives; hands the validations to Ray Tune.

    A report without ``metric`` (a step's loss and timings) stays in MLflow only. The job's last validation (its
    last epoch's, or the one early stopping ended the job at; ``epochs``: the job's ``train.epochs``) is reported
    with ``last_validation=1``: a trial there has trained to its end, and the scheduler never stops it."""

    def __init__(self, metric: str, epochs: Optional[int] = None) -> None:
        self.metric, self.epochs = metric, epochs
        self.validations = 0

    def is_last(self, report: Mapping[str, Any]) -> bool:
        if not report.get("epoch_end") or report.get("mid_epoch_validation"):
            return False
        return bool(report.get("early_stopped")) or (
            self.epochs is not None and int(report.get("epoch", -1)) + 1 >= self.epochs)

    def __call__(self, report: Mapping[str, Any]) -> None:
        if self.metric not in report:
            return
        from ray import tune

        self.validations += 1
        tune.report({**_numeric(report), "validation": self.validations,
                     LAST_VALIDATION: int(self.is_last(report))})


def _base_mapping(config: Union[str, JobConfig, Mapping[str, Any]]) -> Dict[str, Any]:
    if isinstance(config, JobConfig):
        return config.to_dict()
    if isinstance(config, str):
        return load_config(config).to_dict()
    if isinstance(config, Mapping):
        return dict(config)
    raise ConfigError(f"sweep_trainable(config={config!r}): give a JobConfig, a YAML config path or a config mapping.")


def trial_config(base: Mapping[str, Any], trial_values: Mapping[str, Any], trial_id: str, trial_dir: str,
                 tracking_uri: Optional[str]) -> JobConfig:
    """The job config of one trial: ``base`` with the trial's values, named by the trial, its outputs in
    ``trial_dir``, its MLflow runs in the sweep's store (``tracking_uri``, not a store per trial folder)."""
    from rayemb.sweep.space import override, with_carried

    # a swept embedding dim ends the DLRM's bottom MLP with it, as check_space built it
    overrides = [override(k, v) for k, v in with_carried(base, trial_values).items()]
    d = apply_overrides(dict(base), overrides)
    d["name"] = trial_job_name(str(d.get("name") or "rayemb"), trial_id)
    tracking = d.setdefault("tracking", {})
    tracking["output_dir"] = trial_dir
    if tracking_uri:
        tracking["tracking_uri"] = tracking_uri
    return config_from_dict(d)


def share_kept(outputs: str, trial_dir: str) -> None:
    """Points the trial's kept statistics and calibrations at the sweep's ``tracking.output_dir``'s: each is keyed
    by what it was measured on, so one trial's statistics pass, calibration and plan probe serve every later trial
    of the same data and shape (and a plain job's kept ones, with that output_dir, serve the sweep). A remote
    ``outputs`` is left alone: each trial measures its own."""
    from rayemb.data.stats_io import KEPT_STATS_DIR
    from rayemb.train.calibration.store import CACHE_DIR

    if "://" in outputs:
        return
    os.makedirs(trial_dir, exist_ok=True)
    for name in (KEPT_STATS_DIR, CACHE_DIR):
        shared, link = os.path.join(outputs, name), os.path.join(trial_dir, name)
        os.makedirs(shared, exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(shared, link, target_is_directory=True)


def sweep_trainable(config: Union[str, JobConfig, Mapping[str, Any]], metric: str = "valid_auc",
                    parent_run_id: Optional[str] = None, tracking_uri: Optional[str] = None,
                    workspace: Optional[str] = None,
                    registry: Optional[str] = None) -> Callable[[Dict[str, Any]], None]:
    """Ray Tune's function trainable of a rayemb job: each trial's config (``{"train.dense_lr": 0.01, ...}``, keys
    of the job config) overrides ``config`` (a JobConfig, a YAML path, or a config mapping).

    ``metric``: the validation metric reported to Tune at every validation (also reported: ``validation``, the
    count so far, and every other numeric value of the report). ``parent_run_id``: the MLflow run the trials'
    runs nest under. ``tracking_uri``: the trials' MLflow store (default: the store of ``config`` itself, so that
    every trial's run lands in one). ``workspace``: where the config's relative paths resolve (default: here).
    ``registry``: the name of the sweep's :class:`ControllerRegistry` actor (its scheduler's stops abort the
    trials' runs). A trial's job writes its outputs to
    ``<tracking.output_dir>/sweeps/<Tune experiment name>/<trial id>``."""
    from rayemb.train.driver.outputs import tracking_uri as job_tracking_uri

    base = _base_mapping(config)
    probe = config_from_dict(base)
    uri = tracking_uri or job_tracking_uri(probe.tracking.tracking_uri, resolve_path(probe.tracking.output_dir))
    root = os.path.abspath(workspace or os.environ.get(WORKSPACE_ENV_VAR) or os.getcwd())
    outputs = resolve_path(probe.tracking.output_dir)

    def rayemb_trial(trial_values: Dict[str, Any]) -> None:
        from ray import tune

        from rayemb.train.driver.trainer import run_training

        # Tune runs the trial in its own folder: the config's relative paths keep meaning what they meant
        os.environ[WORKSPACE_ENV_VAR] = root
        os.chdir(root)
        context = tune.get_context()
        # the job's outputs in the sweep's folder (Tune's own trial folder is a staging copy on the trial's node)
        trial_dir = os.path.join(outputs, "sweeps", context.get_experiment_name(), context.get_trial_id())
        cfg = trial_config(base, trial_values, context.get_trial_id(), trial_dir, uri)
        share_kept(outputs, trial_dir)
        # an unfinished run of the trial's job (a sweep resumed after its driver died) continues from its checkpoint
        options: Dict[str, Any] = {"on_report": TuneReporter(metric, cfg.train.epochs)}
        if registry is not None:
            options["callbacks"] = [_controller_callback(registry, context.get_trial_id())]
        try:
            run_training(cfg, parent_run_id, ray_options=options)
        finally:
            if registry is not None:
                _mark_ended(registry, context.get_trial_id())

    return rayemb_trial


__all__ = ["sweep_trainable", "trial_config", "share_kept", "trial_job_name", "TuneReporter", "ControllerRegistry",
           "LAST_VALIDATION"]
