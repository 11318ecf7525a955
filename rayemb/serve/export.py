"""``rayemb export``: from a finished job (its MLflow run, or a checkpoint and its config) to an inference model.

Two ways to name what to export, both checked before anything is written:

* :func:`source_from_run`: the run's ``rayemb.best_checkpoint`` or
  ``rayemb.last_checkpoint`` tag, its ``config.yaml`` artifact, the dataset's
  ``schema.yaml`` at the config's ``data.path``, and the run's metrics at the
  checkpoint's step (a checkpoint written at an epoch end holds the weights
  that scored that epoch's ``valid_auc``);
* :func:`source_from_checkpoint`: a checkpoint directory and the job config
  that trained it (logged to a new run of ``--experiment``).

:func:`export_model` merges the logical checkpoint into the plain model,
writes ``model.pt`` + ``model.json`` under a temporary name, logs the pyfunc
model (input example: the first validation rows, signature) and optionally
registers a version, then renames the directory into place (or, when ``--out`` is
a URI such as ``s3://bucket/models/criteo``, publishes it as a version under
``--out/_v/`` named by ``--out/_PUBLISHED.json``: :mod:`rayemb.publish`). An
error at any point leaves no ``--out``. Checkpoints and datasets may be URIs too;
the dataset at ``data.path`` is read through :func:`rayemb.publish.resolve`.

A multi-task model (several label columns) predicts one column per label; a
retrieval model (``item_feature``) serves pair scores and user and item
vectors, and its export also holds the catalogue's vectors (``items.parquet``,
:mod:`rayemb.serve.retrieval`).

Example::

    >>> src = source_from_run("0123abcd", "sqlite:////abs/runs/mlflow.db", kind="best")
    >>> export_model(src, "models/criteo", register="criteo-dlrm")
    {'out': '/abs/models/criteo', 'model_uri': 'models:/m-...', 'version': '1', 'valid_auc': 0.79, ...}
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from rayemb import storage
from rayemb.checkpoint.meta import CheckpointMeta
from rayemb.config import JobConfig, load_config, resolve_path
from rayemb.constants import TRAIN_SPLIT, VALID_SPLIT
from rayemb.data.schema import DatasetSchema, parquet_files
from rayemb.data.transforms import transforms_of_checkpoint
from rayemb.errors import ConfigError, DataError, TrackingError
from rayemb.logs import redact_text, redact_uri
from rayemb.publish import has_output, publish_dir, resolve_dataset

logger = logging.getLogger(__name__)

#: checkpoint kinds of a run: tag names rayemb.train.driver.trainer sets when a job ends
CHECKPOINT_TAGS = {"best": "rayemb.best_checkpoint", "last": "rayemb.last_checkpoint"}
#: run metrics recorded with the model when logged at the checkpoint's step
STEP_METRICS = ("valid_auc", "valid_logloss", "valid_rows")
#: rows of the validation split logged as the MLflow input example
INPUT_EXAMPLE_ROWS = 5


@dataclass(frozen=True)
class ExportSource:
    """A checked checkpoint with everything needed to rebuild its model and say where it came from."""

    checkpoint: str
    meta: Dict[str, Any]  # the checkpoint's verified meta.json
    cfg: JobConfig
    schema: DatasetSchema
    data_dir: str
    tracking_uri: str
    experiment: str
    run_id: Optional[str] = None  # the training run (None: a new run is created)
    checkpoint_kind: Optional[str] = None
    #: the run's metrics of this checkpoint (valid_auc, ... at its step) and best_valid_auc
    metrics: Dict[str, float] = field(default_factory=dict)

    @property
    def written(self) -> CheckpointMeta:
        """Where the training job was when it wrote the checkpoint, and what planned it."""
        return CheckpointMeta.from_dict(self.meta, shown=f"Checkpoint {redact_uri(self.checkpoint)!r}")


def _schema_of(cfg: JobConfig, where: str) -> tuple:
    data_dir = resolve_dataset(resolve_path(cfg.data.path))  # a published dataset: the version its marker names
    try:
        return DatasetSchema.load(data_dir), data_dir
    except DataError as e:
        raise DataError(f"{e.message} (data.path of {where}: the model's columns come from the training dataset's "
                        "schema.yaml; restore the dataset there, or export with --checkpoint and a --config whose "
                        "data.path points at it).", category="missing_schema") from None


def _verified(checkpoint: str, where: str) -> Dict[str, Any]:
    from rayemb.checkpoint.reader import verify

    try:
        return verify(checkpoint)
    except DataError as e:
        raise DataError(f"{e.message.rstrip('.')} ({where}).", category="bad_checkpoint") from None


def _check_tables(meta: Dict[str, Any], schema: DatasetSchema, cfg: JobConfig, checkpoint: str) -> None:
    """Every table the config and schema make (pooled, and the sequence tables of a history tower) is in the
    checkpoint's meta.json with its shape, and the model's factory can be imported and carried: a mismatch
    fails here, before the (large) tables are read."""
    from rayemb.contract.factory import model_spec
    from rayemb.contract.tables import sequence_features
    from rayemb.serve.user_model import check_exportable

    check_exportable(cfg.model.factory)
    model_spec(cfg.model)  # a factory of the user's is imported here (ConfigError bad_model_factory)
    from rayemb.checkpoint.raw_files import check_id_kinds

    saved = meta.get("tables", {})
    check_id_kinds({t: saved[t] for t in schema.table_names if t in saved}, schema.raw_names, redact_uri(checkpoint))
    compressed = meta.get("compression", {})
    dims = schema.table_dims(int(cfg.model.embedding_dim))  # a table's own embedding_dim, else the model's
    for f in [*schema.tables, *sequence_features(cfg.model, schema)]:
        dim = dims.get(f.name, int(cfg.model.embedding_dim))
        if f.name in compressed:
            _check_compressed(f.name, int(f.num_embeddings), dim, compressed[f.name], saved, checkpoint)
            continue
        got = saved.get(f.name)
        want = {"num_embeddings": int(f.num_embeddings), "dim": dim}
        if got is None or {k: int(got.get(k, -1)) for k in want} != want:
            raise DataError(f"Checkpoint {redact_uri(checkpoint)!r} holds table {f.name!r} as {got}; the config and "
                            f"schema make it {want}. Export with the config and dataset the checkpoint was trained "
                            "with.", category="bad_checkpoint")


def _check_compressed(name: str, rows: int, dim: int, storage: Dict[str, Any], saved: Dict[str, Any],
                      checkpoint: str) -> None:
    """The checkpoint's physical tables of compressed table ``name`` have the shapes its storage makes."""
    from rayemb.embedding.compression_math import physical_tables, storage_spec

    for part in physical_tables(rows, dim, storage_spec(storage)):
        got = saved.get(name + part.suffix)
        want = {"num_embeddings": int(part.rows), "dim": int(part.dim)}
        if got is None or {k: int(got.get(k, -1)) for k in want} != want:
            raise DataError(f"Checkpoint {redact_uri(checkpoint)!r} holds {name}{part.suffix} (table {name!r} stored "
                            f"{storage}) as {got}; the config and schema make it {want}. Export with the config and "
                            "dataset the checkpoint was trained with.", category="bad_checkpoint")


def source_from_run(run_id: str, tracking_uri: str, kind: str = "best") -> ExportSource:
    """The ``kind`` (best|last) checkpoint of MLflow run ``run_id``, with its config, schema and metrics."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    if kind not in CHECKPOINT_TAGS:
        raise ConfigError(f"--checkpoint-kind {kind!r}: use one of {sorted(CHECKPOINT_TAGS)}.")
    client = MlflowClient(tracking_uri)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise TrackingError(f"MLflow run {run_id!r} does not exist in the store {redact_uri(tracking_uri)}. Pass the "
                            "run id `rayemb train` printed (\"MLflow run ...\") and the store it logged to "
                            "(--tracking-uri).", category="not_found") from None
    tag = CHECKPOINT_TAGS[kind]
    checkpoint = run.data.tags.get(tag)
    if not checkpoint:
        other = [k for k, t in CHECKPOINT_TAGS.items() if k != kind and run.data.tags.get(t)]
        hint = (f"It has {CHECKPOINT_TAGS[other[0]]}: pass --checkpoint-kind {other[0]}. " if other else
                "The job ended before its first checkpoint (status "
                f"{run.info.status}), or rayemb did not train it. ")
        raise TrackingError(f"MLflow run {run_id!r} has no tag {tag!r} naming a checkpoint. {hint}Export a checkpoint "
                            "directory instead with --checkpoint PATH --config job.yaml.", category="no_checkpoint")
    with tempfile.TemporaryDirectory(prefix="rayemb-export-") as tmp:
        try:
            path = client.download_artifacts(run_id, "config.yaml", tmp)
        except (MlflowException, OSError):
            raise TrackingError(f"MLflow run {run_id!r} has no config.yaml artifact (the job config rayemb logs at "
                                "start). Export with --checkpoint PATH --config job.yaml.",
                                category="no_config") from None
        cfg = load_config(path)
    where = f"MLflow run {run_id!r}, tag {tag}"
    meta = _verified(checkpoint, where)
    schema, data_dir = _schema_of(cfg, f"run {run_id!r}'s config.yaml")
    _check_tables(meta, schema, cfg, checkpoint)
    step = CheckpointMeta.from_dict(meta, shown=f"Checkpoint {redact_uri(checkpoint)!r}").step
    metrics: Dict[str, float] = {}
    for key in STEP_METRICS:
        at_step = [m.value for m in client.get_metric_history(run_id, key) if m.step == step]
        if at_step:
            metrics[key] = float(at_step[-1])
    if "best_valid_auc" in run.data.metrics:
        metrics["best_valid_auc"] = float(run.data.metrics["best_valid_auc"])
    if "valid_auc" not in metrics:
        logger.warning("run %s logged no valid_auc at the checkpoint's step %d (a mid-epoch checkpoint)", run_id, step)
    experiment = client.get_experiment(run.info.experiment_id).name
    return ExportSource(checkpoint, meta, cfg, schema, data_dir, tracking_uri, experiment, run_id, kind, metrics)


def source_from_checkpoint(checkpoint: str, config_path: str, tracking_uri: Optional[str] = None,
                           experiment: Optional[str] = None) -> ExportSource:
    """A checkpoint directory and the job config that trained it; the store defaults to the config's."""
    from rayemb.tracking.store import default_tracking_uri

    cfg = load_config(config_path)
    checkpoint = resolve_path(checkpoint)
    meta = _verified(checkpoint, "--checkpoint")
    schema, data_dir = _schema_of(cfg, f"--config {config_path!r}")
    _check_tables(meta, schema, cfg, checkpoint)
    uri = tracking_uri or cfg.tracking.tracking_uri or default_tracking_uri(resolve_path(cfg.tracking.output_dir))
    best = CheckpointMeta.from_dict(meta, shown=f"Checkpoint {redact_uri(checkpoint)!r}").early_stopping
    metrics = {"best_valid_auc": float(best["best_valid_auc"])} if best.get("best_valid_auc") is not None else {}
    return ExportSource(checkpoint, meta, cfg, schema, data_dir, uri, experiment or cfg.tracking.experiment,
                        metrics=metrics)


def input_example(data_dir: str, schema: DatasetSchema, rows: int = INPUT_EXAMPLE_ROWS, sequence: bool = True) -> Any:
    """The first ``rows`` rows of the validation split (else the train split), feature columns, as pandas
    (``sequence``: with the sequence columns, for a model with a history tower)."""
    import pyarrow.parquet as pq

    from rayemb.serve.model import feature_columns

    for split in (VALID_SPLIT, TRAIN_SPLIT):
        try:
            files = parquet_files(data_dir, split)
        except DataError:
            continue
        if files:
            path, fs = storage.parquet_source(files[0])
            batch = next(pq.ParquetFile(path, filesystem=fs).iter_batches(batch_size=rows,
                                                                          columns=feature_columns(schema, sequence)))
            return batch.to_pandas()
    raise DataError(f"Dataset {redact_uri(data_dir)!r} has no parquet files in {VALID_SPLIT}/ or {TRAIN_SPLIT}/ "
                    "for the model's input example. Restore the training dataset at the config's data.path.",
                    category="missing_data")


def check_out(out: str) -> str:
    """Absolute ``out`` (a URI as it is); :class:`DataError` when it exists and is not an empty directory."""
    storage.check_supported(out, "--out")
    out = storage.abspath(out)
    if storage.isfile(out) or has_output(out):
        raise DataError(f"--out {redact_uri(out)!r} exists and is not empty. Choose a new directory (rayemb never "
                        "overwrites a model or predictions).", category="output_exists")
    return out


def staging_dir(out: str) -> str:
    """A fresh local directory to build ``out`` in: next to it (renamed by :func:`publish`), else a temp dir
    (uploaded by :func:`publish`)."""
    if storage.is_remote(out):
        return tempfile.mkdtemp(prefix="rayemb-out-")
    tmp = f"{out.rstrip(os.sep)}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def publish(tmp: str, out: str) -> str:
    """Puts the finished ``tmp`` at ``out`` (:func:`rayemb.publish.publish_dir`: one rename locally; for a URI a
    new version made visible by its marker); returns the directory readers resolve ``out`` to."""
    return publish_dir(tmp, out)


def _new_run(source: ExportSource) -> str:
    """A run in ``source.experiment`` for a model exported from a bare checkpoint; holds its config.yaml."""
    from mlflow import MlflowClient

    from rayemb.tracking.store import artifact_location, ensure_store
    from rayemb.tracking.tags import TAG_KIND, standard_tags

    ensure_store(source.tracking_uri)
    client = MlflowClient(source.tracking_uri)
    exp = client.get_experiment_by_name(source.experiment)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(
        source.experiment, artifact_location=artifact_location(source.tracking_uri, source.experiment))
    run = client.create_run(exp_id, run_name=f"export-{source.cfg.name}",
                            tags={**standard_tags(), TAG_KIND: "export",
                                  "rayemb.checkpoint": redact_uri(source.checkpoint)})
    client.log_text(run.info.run_id, redact_text(source.cfg.to_yaml()), "config.yaml")
    return run.info.run_id


def export_model(source: ExportSource, out: str, register: Optional[str] = None) -> Dict[str, Any]:
    """Writes the inference model to ``out``, logs it to MLflow (and registers it); returns a summary."""
    from mlflow import MlflowClient

    from rayemb._version import __version__
    from rayemb.checkpoint.export import unsharded_state
    from rayemb.serve.mlflow_model import log_pyfunc
    from rayemb.serve.mlflow_model import register as register_version
    from rayemb.serve.columns import served_columns
    from rayemb.serve.model import InferenceModel, inference_state, model_config, uses_sequence

    t0 = time.monotonic()
    out = check_out(out)
    meta, written = source.meta, source.written
    mcfg = model_config(source.cfg)
    example = input_example(source.data_dir, source.schema, sequence=uses_sequence(mcfg))
    if meta.get("compression"):  # the checkpoint's compressed tables: the inference model stores them alike
        mcfg["compression"] = dict(meta["compression"])
    info = {
        "model": mcfg, "job_name": source.cfg.name, "rayemb_version": __version__,
        "step": written.step, "epoch": written.epoch, "epoch_complete": written.epoch_complete,
        "metrics": dict(source.metrics),
        "source": {"checkpoint": redact_uri(source.checkpoint), "checkpoint_kind": source.checkpoint_kind,
                   "run_id": source.run_id, "tracking_uri": redact_uri(source.tracking_uri),
                   "experiment": source.experiment,
                   "data_path": redact_uri(source.data_dir), "plan_fingerprint": written.plan_fingerprint,
                   "world_size": written.world_size},
    }
    tmp = staging_dir(out)
    created_run = None
    try:
        state = inference_state(unsharded_state(source.checkpoint), source.schema, mcfg,
                                source=f"Checkpoint {redact_uri(source.checkpoint)!r}")
        # the dense transforms the checkpoint's model was trained with, parameters included
        schema = source.schema.with_dense_transforms(transforms_of_checkpoint(
            written.to_dict(), source.schema.dense, {f.name: f.bucketize for f in source.schema.sparse
                                                     if f.bucketize is not None}))
        model = InferenceModel.from_state(state, schema, mcfg, source.cfg.data.id_policy, info)
        example_pred = model.predict(example)
        model.save(tmp)
        run_id = source.run_id or _new_run(source)
        created_run = None if source.run_id else run_id
        tags = {"rayemb.checkpoint": info["source"]["checkpoint"], "rayemb.step": str(info["step"])}
        logged = log_pyfunc(tmp, source.schema, source.tracking_uri, run_id, example, step=info["step"], tags=tags)
        client = MlflowClient(source.tracking_uri)
        client.set_tag(run_id, "rayemb.model_uri", logged.model_uri)
        version = None
        if register:
            vtags = {**tags, **{k: repr(v) for k, v in source.metrics.items()}, "rayemb.run_id": run_id}
            auc = source.metrics.get("valid_auc")
            desc = (f"rayemb export of {tags['rayemb.checkpoint']} (step {info['step']}"
                    + (f", valid_auc {auc:.5f}" if auc is not None else "") + ")")
            version = register_version(logged.model_uri, register, source.tracking_uri, vtags, desc)
        if created_run:
            client.set_terminated(created_run, "FINISHED")
        size = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(tmp) for n in names)
        published = publish(tmp, out)
    except BaseException:
        if created_run:  # the run made for this export says it failed; nothing is left under --out
            MlflowClient(source.tracking_uri).set_terminated(created_run, "FAILED")
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"out": out, "published": published, "run_id": run_id, "model_uri": logged.model_uri,
            "runs_uri": f"runs:/{run_id}/model",
            "registered": register, "version": getattr(version, "version", None), "step": info["step"],
            "epoch": info["epoch"], "checkpoint": source.checkpoint, "metrics": dict(source.metrics),
            "tables": len(source.schema.sparse), "bytes": size, "example_predictions": example_pred.tolist(),
            "item_feature": model.item_feature, "outputs": served_columns(source.schema, model.item_feature),
            "seconds": time.monotonic() - t0}


__all__ = ["CHECKPOINT_TAGS", "ExportSource", "check_out", "export_model", "input_example", "publish",
           "source_from_checkpoint", "source_from_run", "staging_dir"]
