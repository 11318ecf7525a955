"""``EmbeddingTrainer``: a job from Python, in Ray Train's idiom, with a model of your own.

::

    import ray.train, rayemb

    trainer = rayemb.EmbeddingTrainer(
        model="examples.deepfm:deepfm",          # a shipped name, "package.module:function", or the function
        model_args={"hidden": [64, 32]},
        datasets="data/synth_small",               # a dataset folder, or {"train": ds, "valid": ds} + schema
        scaling_config=ray.train.ScalingConfig(num_workers=2),
        run_config=ray.train.RunConfig(name="deepfm", storage_path="runs",
                                       failure_config=ray.train.FailureConfig(max_failures=1)),
        train={"epochs": 2},
    )
    result = trainer.fit()                         # rayemb.TrainResult: metrics, checkpoints, MLflow run id

Everything the YAML config holds can be given as a section mapping (``train``,
``planner``, ``data``, ``tracking``) or as a whole ``config`` (a ``JobConfig`` or
a YAML path) that the other arguments override. ``rayemb train`` and
``jobs/train.py`` are this trainer on a YAML config (:meth:`EmbeddingTrainer.from_config`).

``datasets`` may be Ray Datasets the caller built (their own ``map_batches``
preprocessing included), given with the ``schema`` of their columns: they are
written once, in order, as the job's dataset folder, and the statistics pass,
the split, the planner and the workers read that folder exactly as they read
any other.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Dict, Mapping, Optional, Union

from rayemb.config import JobConfig, config_from_dict, load_config
from rayemb.errors import ConfigError

#: what ``datasets`` keys name (the folder's splits)
SPLITS = ("train", "valid")


def _model_spec(model: Union[str, Callable[..., Any]], args: Mapping[str, Any], name: str) -> Any:
    from rayemb.contract.factory import SHIPPED_MODELS, ModelSpec, model_spec, ship_function

    if callable(model):
        ship_function(model)
        return ModelSpec(model, dict(args), name)
    if not isinstance(model, str):
        raise ConfigError(f"EmbeddingTrainer(model={model!r}): give a shipped model's name {sorted(SHIPPED_MODELS)}, "
                          "'package.module:function', or the factory function itself.", "bad_model_factory")
    return None  # named: the config's model section resolves it


class EmbeddingTrainer:
    """Trains a model on a dataset on the Ray cluster in ``$RAY_ADDRESS`` (else a local one); see the module."""

    def __init__(self, model: Union[str, Callable[..., Any]] = "dlrm", *, datasets: Any,
                 model_args: Optional[Mapping[str, Any]] = None, schema: Any = None,
                 config: Union[None, str, JobConfig] = None, scaling_config: Any = None, run_config: Any = None,
                 loss: Optional[Callable[[Any, Any], Any]] = None, **sections: Mapping[str, Any]) -> None:
        base = load_config(config) if isinstance(config, str) else config
        d: Dict[str, Any] = base.to_dict() if base is not None else {"name": "rayemb"}
        for name, section in sections.items():
            if name not in {f.name for f in dataclasses.fields(JobConfig)} or name == "name":
                raise ConfigError(f"EmbeddingTrainer got an unknown argument {name!r}. Sections: data, model, train, "
                                  "planner, tracking, scaling (or scaling_config / run_config).")
            d[name] = {**d.get(name, {}), **dict(section)}
        model_section = d.setdefault("model", {})
        if isinstance(model, str):
            key = "factory" if ":" in model else "name"
            model_section.update({key: model, **({"name": "dlrm"} if key == "factory" else {"factory": None})})
        else:  # the function itself: named in the run's params by where it was defined
            model_section["factory"] = f"{getattr(model, '__module__', '?')}:{getattr(model, '__qualname__', model)}"
        if model_args is not None:
            model_section["args"] = dict(model_args)
        _apply_scaling(d, scaling_config)
        self._ray_options = _apply_run_config(d, run_config)
        self._datasets, self._schema = datasets, schema
        if isinstance(datasets, str):
            d.setdefault("data", {})["path"] = datasets
        elif not isinstance(datasets, Mapping) or set(datasets) != set(SPLITS):
            raise ConfigError(f"EmbeddingTrainer(datasets=...): give a dataset folder (schema.yaml, train/, valid/) or "
                              f"a mapping with exactly the keys {list(SPLITS)} (Ray Datasets or parquet folders), "
                              f"not {type(datasets).__name__}.")
        else:
            d.setdefault("data", {}).setdefault("path", "(written when fit() starts)")
        self.config: JobConfig = config_from_dict(d)
        self._spec = _model_spec(model, self.config.model.args, str(self.config.model.factory))
        if loss is not None:  # the caller's loss(output, labels) -> scalar, shipped to the workers with the job
            from rayemb.contract.factory import model_spec, ship_function

            ship_function(loss)
            self._spec = dataclasses.replace(self._spec or model_spec(self.config.model), loss=loss)

    @classmethod
    def from_config(cls, cfg: JobConfig) -> "EmbeddingTrainer":
        """The trainer of a whole job config (what ``rayemb train`` and ``jobs/train.py`` run)."""
        return cls(cfg.model.factory or cfg.model.name, datasets=cfg.data.path, config=cfg)

    def fit(self, parent_run_id: Optional[str] = None, new_run: bool = False) -> Any:
        """Runs the job; returns :class:`rayemb.TrainResult` (raises :class:`rayemb.RayembError` on bad input).
        ``parent_run_id``: the MLflow run this one nests under (a sweep's).

        The job is named by ``RunConfig(name=...)`` (the config's ``name``) in its output folder: calling ``fit()``
        again while its last run is unfinished (a driver that died) continues that run from its newest
        checkpoint; a finished run is returned as it is. ``new_run=True`` starts another run."""
        from rayemb.train.driver.trainer import run_training

        cfg = self.config
        if not isinstance(self._datasets, str):
            from rayemb.config import resolve_path
            from rayemb.data.materialize import write_dataset_folder

            root = resolve_path(cfg.tracking.output_dir)
            if "://" in root:
                raise ConfigError(f"EmbeddingTrainer(datasets={{...}}) writes the datasets under the job's outputs, "
                                  f"and {root} is not local. Give a local RunConfig(storage_path=...), or write the "
                                  "datasets to a dataset folder yourself and pass its URI as datasets=.")
            folder = os.path.join(root, "datasets", f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")
            path = write_dataset_folder(self._datasets, self._schema, folder)
            cfg = cfg.replace(data=dataclasses.replace(cfg.data, path=path))
        return run_training(cfg, parent_run_id, model=self._spec, new_run=new_run, ray_options=self._ray_options)


#: ``ray.train.ScalingConfig`` fields a job reads into ``scaling`` (``resources_per_worker``: its CPU and GPU keys)
HONOURED_SCALING = ("num_workers", "use_gpu", "resources_per_worker", "placement_strategy", "accelerator_type")
#: the other ``ScalingConfig`` fields: one set to other than its default is refused, with what to do instead
REFUSED_SCALING: Dict[str, str] = {
    "trainer_resources": "Ray Train v2 runs its controller with no resources of its own; drop it.",
    "label_selector": "rayemb places its workers by scaling.placement_strategy and, for GPU nodes, "
                      "ScalingConfig(accelerator_type=...); drop label_selector.",
    "use_tpu": "rayemb trains on CPU ranks (gloo) or GPU ranks (NCCL, use_gpu=True) only; drop use_tpu.",
    "topology": "a TPU slice's topology: rayemb does not train on TPUs; drop topology.",
    "elastic_resize_monitor_interval_s": "rayemb's elastic job (num_workers=(min, max)) grows at its restarts; "
                                         "drop elastic_resize_monitor_interval_s.",
}
#: ``ray.train.RunConfig`` fields a job reads (``callbacks`` and ``logging_config`` go to Ray Train's RunConfig)
HONOURED_RUN = ("name", "storage_path", "failure_config", "checkpoint_config", "callbacks", "logging_config")
_TUNE_ONLY = ("a Ray Tune option that Ray Train v2 (what rayemb runs on) dropped; drop it (the job's progress lines "
              "and MLflow run report the training; train.early_stopping_patience stops it).")
REFUSED_RUN: Dict[str, str] = {
    "storage_filesystem": "rayemb opens the output folder's filesystem from its URI: give "
                          "storage_path='s3://bucket/path' (credentials from the environment), without storage_filesystem.",
    "worker_runtime_env": "the workers run in the Ray job's runtime env: give it to the job (ray job submit "
                          "--runtime-env-json, or ray.init(runtime_env=...) before fit()).",
    "sync_config": _TUNE_ONLY, "verbose": _TUNE_ONLY, "stop": _TUNE_ONLY, "progress_reporter": _TUNE_ONLY,
    "log_to_file": _TUNE_ONLY, "local_dir": "Ray's former name of storage_path; give storage_path instead.",
}
#: ``FailureConfig`` / ``CheckpointConfig`` fields a job reads
HONOURED_FAILURE = ("max_failures",)
_PREEMPTION = ("rayemb restarts its worker group on any failure, a preemption included, up to max_failures "
               "(scaling.max_failures), from the newest checkpoint; drop it.")
REFUSED_FAILURE: Dict[str, str] = {
    "fail_fast": "rayemb's max_failures=0 fails on the first worker error; drop fail_fast.",
    "controller_failure_limit": "rayemb's driver continues a job whose controller died when the job is run again "
                                "(fit() continues its unfinished run); drop controller_failure_limit.",
    "max_preemption_failures": _PREEMPTION, "relax_collectives_on_preemption": _PREEMPTION,
    "preemption_grace_s": _PREEMPTION,
}
HONOURED_CHECKPOINT = ("num_to_keep", "checkpoint_score_attribute", "checkpoint_score_order")
_CHECKPOINT_TIMES = ("rayemb writes a checkpoint at every epoch end (the last included), and every "
                     "train.checkpoint_every_n_steps steps / train.checkpoint_every_s seconds; set those instead.")
REFUSED_CHECKPOINT: Dict[str, str] = {
    "checkpoint_frequency": _CHECKPOINT_TIMES, "checkpoint_at_end": _CHECKPOINT_TIMES,
    "_checkpoint_keep_all_ranks": "every rank writes its shards of each checkpoint; drop it.",
    "_checkpoint_upload_from_workers": "every rank writes its shards of each checkpoint; drop it.",
}
HONOURED_LOGGING = ("log_level",)
#: the category of the ConfigError that refuses a Ray config field
UNSUPPORTED_RAY_FIELD = "unsupported_ray_field"


def _set_fields(obj: Any) -> Dict[str, Any]:
    """``obj``'s dataclass fields set to other than their default: the field's, or what the class fills in when it
    is left out (an empty list or mapping reads as unset; a nested config counts as set when one of its fields is)."""
    try:
        filled = type(obj)()
    except Exception:  # noqa: BLE001 - a class with a required field: its field defaults alone
        filled = None
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = None if f.default is dataclasses.MISSING else f.default
        if value is None or (isinstance(value, (list, tuple, dict)) and not value):
            continue
        if any(d is not None and _equal(value, d) for d in (default, getattr(filled, f.name, None))):
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and not _set_fields(value):
            continue
        out[f.name] = value
    return out


def _equal(value: Any, default: Any) -> bool:
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 - an object (a pyarrow filesystem) that compares only with its own kind
        return False


def _refusals(obj: Any, what: str, honoured: tuple, refused: Mapping[str, str]) -> list:
    return [f"{what}.{name}: {refused.get(name, 'rayemb does not read it; drop it.')}"
            for name in _set_fields(obj) if name not in honoured]


def _refuse(problems: list) -> None:
    if problems:
        raise ConfigError("EmbeddingTrainer: these Ray config fields have no effect on a rayemb job, so it does not "
                          "start: " + " ".join(problems), UNSUPPORTED_RAY_FIELD)


def _apply_scaling(d: Dict[str, Any], scaling: Any) -> None:
    """``ray.train.ScalingConfig`` onto the config's ``scaling`` section; a field it cannot honour is a ConfigError."""
    if scaling is None:
        return
    problems = _refusals(scaling, "ScalingConfig", HONOURED_SCALING, REFUSED_SCALING)
    resources = dict(scaling.resources_per_worker or {})
    gpus = resources.pop("GPU", None)
    if gpus is not None and float(gpus) != (1.0 if scaling.use_gpu else 0.0):
        problems.append(f"ScalingConfig.resources_per_worker['GPU']={gpus}: a rayemb rank holds one whole GPU "
                        "(use_gpu=True) or none; drop the GPU key and set use_gpu.")
    cpus = resources.pop("CPU", None)
    for key in sorted(resources):
        problems.append(f"ScalingConfig.resources_per_worker[{key!r}]: a rayemb worker reserves its CPUs "
                        "(resources_per_worker['CPU'], scaling.cpus_per_worker) and one GPU with use_gpu only"
                        + ("; the plan's host memory per rank is scaling.memory_per_worker_gib" if key == "memory"
                           else "") + f"; drop {key!r}.")
    _refuse(problems)
    s = d.setdefault("scaling", {})
    s["num_workers"] = list(scaling.num_workers) if isinstance(scaling.num_workers, tuple) else scaling.num_workers
    s["use_gpu"] = bool(scaling.use_gpu)
    if cpus is not None:
        s["cpus_per_worker"] = float(cpus)
    if scaling.placement_strategy:
        s["placement_strategy"] = scaling.placement_strategy
    if scaling.accelerator_type:
        s["accelerator_type"] = str(scaling.accelerator_type)


def _apply_run_config(d: Dict[str, Any], run: Any) -> Dict[str, Any]:
    """``ray.train.RunConfig`` onto the config (name, storage_path, FailureConfig, CheckpointConfig); returns what
    goes to Ray Train's RunConfig as it is (``callbacks``, ``logging_config``). A field it cannot honour is a
    ConfigError."""
    if run is None:
        return {}
    problems = _refusals(run, "RunConfig", HONOURED_RUN, REFUSED_RUN)
    failure, checkpoint = run.failure_config, run.checkpoint_config
    logging_config = getattr(run, "logging_config", None)  # Ray Train v2's only
    if failure is not None:
        problems += _refusals(failure, "RunConfig.failure_config", HONOURED_FAILURE, REFUSED_FAILURE)
    if checkpoint is not None:
        problems += _refusals(checkpoint, "RunConfig.checkpoint_config", HONOURED_CHECKPOINT, REFUSED_CHECKPOINT)
    if logging_config is not None:
        problems += _refusals(logging_config, "RunConfig.logging_config", HONOURED_LOGGING, {})
    from ray.train.v2.api.callback import RayTrainCallback

    callbacks = list(run.callbacks or [])
    problems += [f"RunConfig.callbacks: {type(c).__name__} is not a ray.train.UserCallback (a Ray Tune callback?); "
                 "Ray Train v2 calls UserCallbacks only: subclass ray.train.UserCallback." for c in callbacks
                 if not isinstance(c, RayTrainCallback)]
    metric = _score_metric(d, checkpoint, problems)
    _refuse(problems)
    from rayemb.contract.factory import ship_function

    for c in callbacks:  # Ray Train's controller unpickles them: their module travels with the job, as a factory's
        ship_function(type(c))
    if run.name:
        d["name"] = run.name
    if run.storage_path:
        d.setdefault("tracking", {})["output_dir"] = str(run.storage_path)
    if failure is not None:
        d.setdefault("scaling", {})["max_failures"] = int(failure.max_failures)
    if checkpoint is not None and checkpoint.num_to_keep is not None:
        d.setdefault("train", {})["keep_checkpoints"] = int(checkpoint.num_to_keep)
    if metric is not None:
        d.setdefault("train", {})["early_stopping_metric"] = metric
    return {"callbacks": callbacks, **({"logging_config": logging_config}
                                      if logging_config is not None and _set_fields(logging_config) else {})}


def _score_metric(d: Mapping[str, Any], checkpoint: Any, problems: list) -> Optional[str]:
    """``CheckpointConfig.checkpoint_score_attribute`` as ``train.early_stopping_metric`` (the best checkpoint and
    early stopping follow it), its order checked against the metric's own direction."""
    from rayemb.config import EARLY_STOPPING_METRICS
    from rayemb.train.worker.metrics import metric_goal

    metric = getattr(checkpoint, "checkpoint_score_attribute", None)
    if metric is None:
        if getattr(checkpoint, "checkpoint_score_order", "max") != "max":
            problems.append("RunConfig.checkpoint_config.checkpoint_score_order without a checkpoint_score_attribute: "
                            "name the metric it orders (train.early_stopping_metric), or drop the order.")
        return None
    where = "RunConfig.checkpoint_config.checkpoint_score_attribute"
    if metric not in EARLY_STOPPING_METRICS:
        problems.append(f"{where}={metric!r}: rayemb ranks checkpoints by a validation metric, one of "
                        f"{list(EARLY_STOPPING_METRICS)} (train.early_stopping_metric); name one of them.")
        return None
    given = (d.get("train") or {}).get("early_stopping_metric")
    if given not in (None, metric):
        problems.append(f"{where}={metric!r} and train.early_stopping_metric={given!r} name two metrics; the best "
                        "checkpoint and early stopping follow one: give one of them.")
    goal, order = metric_goal(metric), checkpoint.checkpoint_score_order
    if goal != "one" and order != goal:
        problems.append(f"RunConfig.checkpoint_config.checkpoint_score_order={order!r}: rayemb ranks {metric} "
                        f"{'higher' if goal == 'max' else 'lower'} is better; set checkpoint_score_order={goal!r}.")
    elif goal == "one" and order != "max":
        problems.append(f"RunConfig.checkpoint_config.checkpoint_score_order={order!r}: rayemb ranks {metric} "
                        "closest to 1 is better; leave checkpoint_score_order at its default.")
    return metric


__all__ = ["EmbeddingTrainer"]
