"""Every field of Ray's ``ScalingConfig`` / ``RunConfig`` (and the ``FailureConfig`` / ``CheckpointConfig`` /
``LoggingConfig`` they hold) is honoured by ``EmbeddingTrainer`` or refused before any work with one ConfigError
naming it and what to do; a field Ray adds fails the enumeration until it is handled. Honoured fields land in the
job's config, and the callbacks, logging config and accelerator type in the Ray Train configs the job runs with."""

from __future__ import annotations

import dataclasses

import pyarrow.fs
import pytest
import ray.air.config as air
import ray.train
from ray.train.v2.api.config import LoggingConfig

from rayemb import api
from rayemb.config import config_from_dict
from rayemb.errors import ConfigError
from rayemb.tracking.callback import ReportForwarder
from rayemb.train.driver.trainer import ray_train_configs

TABLES = [
    (ray.train.ScalingConfig, api.HONOURED_SCALING, api.REFUSED_SCALING),
    (air.ScalingConfig, api.HONOURED_SCALING, api.REFUSED_SCALING),
    (ray.train.RunConfig, api.HONOURED_RUN, api.REFUSED_RUN),
    (air.RunConfig, api.HONOURED_RUN, api.REFUSED_RUN),
    (ray.train.FailureConfig, api.HONOURED_FAILURE, api.REFUSED_FAILURE),
    (air.FailureConfig, api.HONOURED_FAILURE, api.REFUSED_FAILURE),
    (ray.train.CheckpointConfig, api.HONOURED_CHECKPOINT, api.REFUSED_CHECKPOINT),
    (air.CheckpointConfig, api.HONOURED_CHECKPOINT, api.REFUSED_CHECKPOINT),
    (LoggingConfig, api.HONOURED_LOGGING, {}),
]


class Seen(ray.train.UserCallback):
    """A user's callback: it must reach Ray Train's RunConfig beside rayemb's own."""


def _trainer(**kwargs):
    return api.EmbeddingTrainer("dlrm", datasets="data/unused", **kwargs)


def _refused(match: str, **kwargs) -> str:
    with pytest.raises(ConfigError, match=match) as e:
        _trainer(**kwargs)
    assert e.value.category == api.UNSUPPORTED_RAY_FIELD
    return e.value.message


@pytest.mark.parametrize("cls,honoured,refused", TABLES, ids=lambda x: getattr(x, "__module__", "") + "." +
                         getattr(x, "__name__", "") if isinstance(x, type) else "")
def test_every_field_is_honoured_or_refused(cls, honoured, refused):
    names = {f.name for f in dataclasses.fields(cls)}
    assert not set(honoured) & set(refused)
    assert names <= set(honoured) | set(refused), f"{cls.__module__}.{cls.__name__}: handle {sorted(names - set(honoured) - set(refused))}"


def test_default_configs_pass_silently():
    t = _trainer(scaling_config=ray.train.ScalingConfig(), run_config=ray.train.RunConfig(name="quiet"))
    assert t.config.name == "quiet" and t._ray_options == {"callbacks": []}
    # the older classes fill in sync_config and verbose themselves: still defaults
    t = _trainer(scaling_config=air.ScalingConfig(), run_config=air.RunConfig(name="older"))
    assert t.config.name == "older" and t._ray_options == {"callbacks": []}


@pytest.mark.parametrize("scaling,field", [
    (dict(label_selector={"zone": "a"}), "ScalingConfig.label_selector"),
    (dict(elastic_resize_monitor_interval_s=5.0), "ScalingConfig.elastic_resize_monitor_interval_s"),
    (dict(resources_per_worker={"CPU": 1, "memory": 1e9}), "memory_per_worker_gib"),
    (dict(resources_per_worker={"CPU": 1, "special": 1}), "resources_per_worker\\['special'\\]"),
    (dict(use_gpu=True, resources_per_worker={"GPU": 2}), "resources_per_worker\\['GPU'\\]=2"),
])
def test_each_scaling_refusal_names_the_field_and_the_fix(scaling, field):
    message = _refused(field, scaling_config=ray.train.ScalingConfig(**scaling))
    assert "drop" in message


def test_a_tpu_scaling_config_is_refused():
    # Ray's own check wants a topology and accelerator type for several TPU workers; one worker shows use_tpu alone
    _refused("ScalingConfig.use_tpu: rayemb trains on CPU ranks", scaling_config=ray.train.ScalingConfig(use_tpu=True))
    v1 = air.ScalingConfig(trainer_resources={"CPU": 1})
    _refused("ScalingConfig.trainer_resources", scaling_config=v1)


@pytest.mark.parametrize("run,field", [
    (dict(storage_filesystem=pyarrow.fs.LocalFileSystem(), storage_path="/tmp/x"), "storage_path='s3://"),
    (dict(worker_runtime_env={"env_vars": {"A": "1"}}), "RunConfig.worker_runtime_env"),
    (dict(failure_config=ray.train.FailureConfig(max_preemption_failures=2)), "failure_config.max_preemption_failures"),
    (dict(failure_config=ray.train.FailureConfig(controller_failure_limit=0)), "controller_failure_limit"),
    (dict(checkpoint_config=ray.train.CheckpointConfig(checkpoint_score_attribute="auc")), "name one of them"),
    (dict(checkpoint_config=ray.train.CheckpointConfig(checkpoint_score_attribute="valid_logloss")),
     "checkpoint_score_order='min'"),
    (dict(checkpoint_config=ray.train.CheckpointConfig(checkpoint_score_order="min")), "without a checkpoint_score"),
])
def test_each_run_refusal_names_the_field_and_the_fix(run, field):
    _refused(field, run_config=ray.train.RunConfig(name="r", **run))


@pytest.mark.parametrize("run,field", [
    (dict(verbose=2), "RunConfig.verbose: a Ray Tune option"),
    (dict(stop={"training_iteration": 3}), "RunConfig.stop: a Ray Tune option"),
    (dict(log_to_file=True), "RunConfig.log_to_file"),
    (dict(sync_config=object()), "RunConfig.sync_config"),
    (dict(failure_config=air.FailureConfig(fail_fast=True)), "fail_fast"),
    (dict(checkpoint_config=air.CheckpointConfig(checkpoint_frequency=2)), "train.checkpoint_every_n_steps"),
    (dict(checkpoint_config=air.CheckpointConfig(checkpoint_at_end=True)), "checkpoint_at_end"),
    (dict(callbacks=[object()]), "not a ray.train.UserCallback"),
])
def test_ray_tune_fields_of_the_older_run_config_are_refused(run, field):
    # Ray Train v2's RunConfig raises on these itself; the ray.air one still takes them
    _refused(field, run_config=air.RunConfig(name="r", **run))


def test_a_score_attribute_that_contradicts_the_configs_metric_is_refused():
    _refused("two metrics", train={"early_stopping_metric": "valid_ne"},
             run_config=ray.train.RunConfig(name="r", checkpoint_config=ray.train.CheckpointConfig(
                 checkpoint_score_attribute="valid_auc")))


def test_honoured_fields_land_in_the_job_config():
    seen = Seen()
    t = _trainer(
        scaling_config=ray.train.ScalingConfig(num_workers=(1, 3), use_gpu=True, resources_per_worker={"CPU": 2, "GPU": 1},
                                               placement_strategy="SPREAD", accelerator_type="A10G"),
        run_config=ray.train.RunConfig(
            name="honoured", storage_path="/tmp/rayemb-honoured", callbacks=[seen],
            failure_config=ray.train.FailureConfig(max_failures=2),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=4, checkpoint_score_attribute="valid_logloss",
                                                         checkpoint_score_order="min"),
            logging_config=LoggingConfig(log_level="DEBUG")))
    c = t.config
    assert (c.name, c.tracking.output_dir) == ("honoured", "/tmp/rayemb-honoured")
    assert (c.scaling.min_workers, c.scaling.num_workers, c.scaling.use_gpu, c.scaling.cpus_per_worker) == (1, 3, True, 2.0)
    assert (c.scaling.placement_strategy, c.scaling.accelerator_type, c.scaling.max_failures) == ("SPREAD", "A10G", 2)
    assert (c.train.keep_checkpoints, c.train.early_stopping_metric) == (4, "valid_logloss")
    assert t._ray_options["callbacks"] == [seen] and t._ray_options["logging_config"].log_level == "DEBUG"


def test_callbacks_logging_and_accelerator_type_reach_ray_trains_configs():
    seen = Seen()
    t = _trainer(scaling_config=ray.train.ScalingConfig(num_workers=2, accelerator_type="A10G"),
                 run_config=ray.train.RunConfig(name="reach", callbacks=[seen],
                                                logging_config=LoggingConfig(log_level="WARNING")))
    forwarder = ReportForwarder(None)
    scaling, run = ray_train_configs(t.config, 2, 1.0, {"storage_path": "/tmp/rayemb-reach"}, "reach-1", forwarder,
                                     t._ray_options)
    assert scaling.accelerator_type == "A10G" and "accelerator_type:A10G" in scaling._resources_per_worker_not_none
    assert run.callbacks == [forwarder, seen] and run.logging_config.log_level == "WARNING"
    assert (run.name, run.failure_config.max_failures, run.checkpoint_config.num_to_keep) == ("reach-1", 0, 3)
    # a job with neither: rayemb's forwarder alone, Ray's defaults
    plain = config_from_dict({"name": "plain", "data": {"path": "data/unused"}})
    scaling, run = ray_train_configs(plain, 2, 1.0, {"storage_path": "/tmp/rayemb-reach"}, "plain-1", forwarder)
    assert scaling.accelerator_type is None and run.callbacks == [forwarder] and run.logging_config.log_level == "INFO"


def test_an_empty_accelerator_type_in_the_config_is_refused():
    with pytest.raises(ConfigError, match="scaling.accelerator_type"):
        config_from_dict({"name": "x", "data": {"path": "d"}, "scaling": {"accelerator_type": ""}})
