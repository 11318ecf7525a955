"""Ray Datasets a caller built, written once as a dataset folder that every stage of a job reads.

A job's stages read one dataset folder: the statistics pass and the parquet
footers' checks before any work, Ray Data's read tasks or the object store on
the workers, and an elastic restart or a resumed job reads it again. A Ray
Dataset with the caller's own preprocessing (``map_batches``) is lazy: each of
those reads would run the preprocessing again, and a non-deterministic one
would give each stage other rows. So the datasets are executed once, in order,
into ``schema.yaml`` + ``train/`` + ``valid/`` parquet files, and the job runs
on that folder unchanged.

The rows are written by this process, the driver, as the blocks stream to it one at a time: Ray
tasks writing parquet on the node that ran them would put rows on other nodes' disks, which this
process, the job's workers and a resumed job do not see. Memory stays bounded by a block (and
Ray Data's own backpressure on the blocks in flight), not by the dataset.

The columns are checked against the schema before anything is written; each split's rows in the
written files' footers must equal the rows the dataset's tasks reported producing; the folder
appears whole or not at all (written beside its final name, then renamed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from typing import Any, Iterator, Mapping, Optional, Tuple

from rayemb.constants import TRAIN_SPLIT, VALID_SPLIT
from rayemb.data.parts import ROWS_PER_FILE as PART_ROWS, PartWriter
from rayemb.errors import DataError

#: rows per written parquet file, as ``rayemb convert`` writes them: the statistics pass reads files in parallel
ROWS_PER_FILE = PART_ROWS


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


@contextlib.contextmanager
def _in_order(ds: Any) -> Iterator[None]:
    """Ray Data hands out ``ds``'s blocks in the dataset's row order while inside; the setting is restored after.

    A Dataset executes under the DataContext it was made with (a copy of the one current then), so the flag is set
    on ``ds.context``: setting it on the current context would not reach a dataset the caller built before.
    """
    options = ds.context.execution_options
    saved = options.preserve_order
    options.preserve_order = True
    try:
        yield
    finally:
        options.preserve_order = saved


def _blocks(ds: Any) -> Iterator[Tuple[Any, Optional[int]]]:
    """``(arrow table, rows its producing task reported or None)`` for each block of ``ds``, in order.

    One block is fetched to this process at a time (its rows are dropped from the object store once the bundle
    is consumed), so the driver holds a block, not the dataset.
    """
    import ray
    from ray.data.block import BlockAccessor

    for bundle in ds.iter_internal_ref_bundles():
        for entry, part in zip(bundle.blocks, bundle.slices):
            block = BlockAccessor.for_block(ray.get(entry.ref))
            if part is not None:
                block = BlockAccessor.for_block(block.slice(part.start_offset, part.end_offset, copy=False))
            reported = part.num_rows if part is not None else entry.metadata.num_rows
            yield block.to_arrow(), reported


def _write_split(ds: Any, dest: str) -> int:
    """Writes ``ds``'s rows, in order, to ``dest/part-NNNNN.parquet`` (at most :data:`ROWS_PER_FILE` rows each);
    returns the rows the dataset produced.

    The count is what the tasks that produced the blocks reported in their metadata (a block's own length where
    they reported none), so :func:`_check_rows` compares the files against the dataset, not against this writer.
    A block whose schema differs from the open file's starts a new file.
    """
    os.makedirs(dest)
    produced = 0
    with _in_order(ds), PartWriter(dest, ROWS_PER_FILE) as parts:
        for table, reported in _blocks(ds):
            produced += table.num_rows if reported is None else reported
            parts.write(table)
    return produced


def _written_rows(dest: str) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(os.path.join(dest, f)).metadata.num_rows
               for f in os.listdir(dest) if f.endswith(".parquet"))


def _check_rows(split: str, dest: str, produced: int) -> None:
    """Raises :class:`DataError` unless the parquet files in ``dest`` hold ``produced`` rows in all."""
    written = _written_rows(dest)
    if written != produced:
        raise DataError(f"datasets[{split!r}] produced {produced:,} rows but {written:,} reached {dest}: the folder "
                        "lost rows while it was written (or another process wrote into it). Nothing was kept; give "
                        "the job an output folder no other process writes to, on a disk this driver can write, and "
                        "run it again.", category="rows_lost")


def write_dataset_folder(datasets: Mapping[str, Any], schema: Any, folder: str) -> str:
    """``folder`` (created; must not exist) holding ``schema`` and each split's rows in the datasets' order.

    ``folder`` is a path on this process's node: the rows of blocks produced on any node of the cluster are
    written here by this process. Raises :class:`DataError` before anything is written when a split lacks a
    column the schema declares, and leaves no folder when a split's written rows differ from its produced rows.

    Example::

        ds = ray.data.read_parquet("raw/train").map_batches(my_preprocessing, batch_format="pyarrow")
        write_dataset_folder({"train": ds, "valid": valid_ds}, "data/synth_small", "runs/datasets/job")
        # runs/datasets/job/{schema.yaml, train/part-00000.parquet, valid/part-00000.parquet}
    """
    schema = _schema_of(schema)
    splits = {TRAIN_SPLIT: _as_dataset(TRAIN_SPLIT, datasets["train"]),
              VALID_SPLIT: _as_dataset(VALID_SPLIT, datasets["valid"])}
    for name, ds in splits.items():
        _check_columns(name, ds, schema)
    if os.path.exists(folder):
        raise DataError(f"The dataset folder {folder} exists already; remove it or give the job another name.")
    staging = f"{folder}.writing-{uuid.uuid4().hex[:8]}"
    rows = {}
    try:
        for name, ds in splits.items():
            rows[name] = _write_split(ds, os.path.join(staging, name))
            _check_rows(name, os.path.join(staging, name), rows[name])
        schema.save(staging)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print(f"rayemb: datasets written to {folder} ({', '.join(f'{n} {r:,} rows' for n, r in rows.items())})",
          flush=True)
    return folder


__all__ = ["ROWS_PER_FILE", "write_dataset_folder"]
