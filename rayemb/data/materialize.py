"""Ray Datasets a caller built, written once as a dataset folder that every stage of a job reads.

A job's stages read one dataset folder: the statistics pass and the parquet
footers' checks before any work, Ray Data's read tasks or the object store on
the workers, and an elastic restart or a resumed job reads it again. A Ray
Dataset with the caller's own preprocessing (``map_batches``) is lazy: each of
those reads would run the preprocessing again, and a non-deterministic one
would give each stage other rows. So the datasets are executed once, in order,
into ``schema.yaml`` + ``train/`` + ``valid/`` parquet files, and the job runs
on that folder unchanged.

The columns are checked against the schema before anything is written, and the
folder appears whole or not at all (written beside its final name, then renamed).
"""

from __future__ import annotations

import os
import shutil
import uuid
from typing import Any, Mapping

from rayemb.constants import TRAIN_SPLIT, VALID_SPLIT
from rayemb.errors import DataError


def _schema_of(schema: Any) -> Any:
    from rayemb.data.schema import DatasetSchema

    if isinstance(schema, DatasetSchema):
        return schema
    if isinstance(schema, Mapping):
        return DatasetSchema.from_dict(dict(schema))
    if isinstance(schema, str):
        return DatasetSchema.load(schema)
    raise DataError("EmbeddingTrainer(datasets={...}) needs schema=: a DatasetSchema, its schema.yaml mapping, or a "
                    "folder with schema.yaml, naming the label, dense and sparse columns of the datasets.")


def _as_dataset(split: str, value: Any) -> Any:
    import ray

    if isinstance(value, str):
        return ray.data.read_parquet(value)
    if isinstance(value, ray.data.Dataset):
        return value
    raise DataError(f"datasets[{split!r}] is a {type(value).__name__}; give a ray.data.Dataset or a parquet folder.")


def _check_columns(split: str, ds: Any, schema: Any) -> None:
    names = set(ds.schema().names)  # runs the plan as far as the first block's schema
    wanted = [*schema.labels, *schema.dense, *schema.sparse_names, *schema.sequence_names]
    missing = [c for c in wanted if c not in names]
    if missing:
        raise DataError(f"datasets[{split!r}] has no column(s) {missing} that the schema declares (it has "
                        f"{sorted(names)[:12]}). Produce them in your preprocessing, or drop them from the schema.",
                        category="missing_columns")


def write_dataset_folder(datasets: Mapping[str, Any], schema: Any, folder: str) -> str:
    """``folder`` (created; must not exist) holding ``schema`` and each split's rows in the datasets' order."""
    import ray

    schema = _schema_of(schema)
    splits = {TRAIN_SPLIT: _as_dataset(TRAIN_SPLIT, datasets["train"]),
              VALID_SPLIT: _as_dataset(VALID_SPLIT, datasets["valid"])}
    for name, ds in splits.items():
        _check_columns(name, ds, schema)
    if os.path.exists(folder):
        raise DataError(f"The dataset folder {folder} exists already; remove it or give the job another name.")
    staging = f"{folder}.writing-{uuid.uuid4().hex[:8]}"
    ctx = ray.data.DataContext.get_current()
    order = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = True  # the files' names sort in the datasets' row order
    try:
        for name, ds in splits.items():
            ds.write_parquet(os.path.join(staging, name))
        schema.save(staging)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        ctx.execution_options.preserve_order = order
    print(f"rayemb: datasets written to {folder}", flush=True)
    return folder


__all__ = ["write_dataset_folder"]
