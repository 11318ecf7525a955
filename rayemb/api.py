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
        _apply_run_config(d, run_config)
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
        return run_training(cfg, parent_run_id, model=self._spec, new_run=new_run)


def _apply_scaling(d: Dict[str, Any], scaling: Any) -> None:
    """``ray.train.ScalingConfig`` onto the config's ``scaling`` section."""
    if scaling is None:
        return
    s = d.setdefault("scaling", {})
    s["num_workers"] = list(scaling.num_workers) if isinstance(scaling.num_workers, tuple) else scaling.num_workers
    s["use_gpu"] = bool(scaling.use_gpu)
    cpus = (scaling.resources_per_worker or {}).get("CPU")
    if cpus is not None:
        s["cpus_per_worker"] = float(cpus)
    if scaling.placement_strategy:
        s["placement_strategy"] = scaling.placement_strategy


def _apply_run_config(d: Dict[str, Any], run: Any) -> None:
    """``ray.train.RunConfig`` (name, storage_path, FailureConfig, CheckpointConfig) onto the config."""
    if run is None:
        return
    if run.name:
        d["name"] = run.name
    if run.storage_path:
        d.setdefault("tracking", {})["output_dir"] = str(run.storage_path)
    if run.failure_config is not None:
        d.setdefault("scaling", {})["max_failures"] = int(run.failure_config.max_failures)
    if run.checkpoint_config is not None and run.checkpoint_config.num_to_keep is not None:
        d.setdefault("train", {})["keep_checkpoints"] = int(run.checkpoint_config.num_to_keep)


__all__ = ["EmbeddingTrainer"]
