"""``rayemb predict``: batch scoring of parquet with an exported model, as Ray Data batch inference.

``read_parquet`` → ``map_batches`` with a callable class (one model per actor,
loaded once from the object store; CPU, or one GPU each with ``use_gpu``) →
parquet files the driver writes as the scored blocks stream back. ``data`` and ``out`` may be URIs (``s3://...``: read
through pyarrow.fs, the output published as a version under ``out/_v/`` named by
``out/_PUBLISHED.json`` when complete, :mod:`rayemb.publish`). The output holds ``prediction`` (the probability;
a multi-task model: ``prediction_<label>`` per label), the labels the input has, and any kept columns, in the
input's row order. A retrieval model writes the ``output`` asked for instead (:mod:`rayemb.serve.columns`):
``score`` (default, with the labels), ``user_embedding`` or ``item_embedding`` (vectors, list<float>).
Inputs are checked from the parquet footers before Ray starts any work, and
the output appears under its final name only when every file is written.

Example::

    >>> summary = predict("models/criteo", "data/criteo/valid", "preds/", num_workers=2)
    >>> summary["rows"], summary["files"]
    (4000, 1)
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import time
from typing import Any, Collection, Dict, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa

from rayemb import storage
from rayemb.constants import SCHEMA_FILE
from rayemb.data.schema import DatasetSchema
from rayemb.data.parts import ROWS_PER_FILE as PART_ROWS, PartWriter
from rayemb.errors import DataError, find_user_error
from rayemb.serve.columns import PREDICTION_COLUMN, SCORE

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 4096
#: rows of one output file at most
ROWS_PER_FILE = PART_ROWS


def input_files(data: str) -> List[str]:
    """The parquet files of ``data`` (a file, or a directory searched recursively; a URI's directly), sorted.

    A path in a published output (``s3://bucket/criteo/valid``) reads its published version
    (:func:`rayemb.publish.resolve`)."""
    from rayemb.publish import resolve

    data = resolve(data)
    if storage.is_remote(data):
        return _remote_input_files(data)
    if os.path.isfile(data):
        return [os.path.abspath(data)]
    if not os.path.isdir(data):
        raise DataError(f"--data {data!r} does not exist. Pass a parquet file or a directory of parquet files "
                        "(e.g. a dataset's valid/ split).", category="missing_data")
    if os.path.isfile(os.path.join(data, SCHEMA_FILE)):
        splits = sorted(d for d in os.listdir(data) if os.path.isdir(os.path.join(data, d)))
        raise DataError(f"--data {data!r} is a dataset root (it has {SCHEMA_FILE} and the splits {splits}). Pass one "
                        f"split's directory, e.g. {os.path.join(data, 'valid')}.", category="invalid_input")
    files = sorted(glob.glob(os.path.join(os.path.abspath(data), "**", "*.parquet"), recursive=True))
    if not files:
        raise DataError(f"--data {data!r} holds no *.parquet files. Pass the directory that holds them.",
                        category="missing_data")
    return files


def _remote_input_files(data: str) -> List[str]:
    from rayemb.logs import redact_uri

    if storage.isfile(data):
        return [data]
    names = storage.listdir(data)
    if not names:
        raise DataError(f"--data {redact_uri(data)!r} does not exist or is empty. Pass a parquet file or a directory "
                        "of parquet files (e.g. a dataset's valid/ split).", category="missing_data")
    if SCHEMA_FILE in names:
        raise DataError(f"--data {redact_uri(data)!r} is a dataset root (it has {SCHEMA_FILE}). Pass one split's "
                        f"directory, e.g. {redact_uri(storage.join(data, 'valid'))}.", category="invalid_input")
    files = [storage.join(data, n) for n in names if n.endswith(".parquet")]
    if not files:
        raise DataError(f"--data {redact_uri(data)!r} holds no *.parquet files. Pass the directory that holds them.",
                        category="missing_data")
    return files


def output_columns(files: Sequence[str], schema: DatasetSchema, keep: Sequence[str], sequence: bool = True,
                   features: Optional[Sequence[str]] = None, output: str = PREDICTION_COLUMN) -> List[str]:
    """Columns to read: ``features`` (None: every feature column; ``sequence``: with the sequence columns, for a
    model with a history tower), the labels every file has (for a prediction or a score), and ``keep``;
    checked in every footer."""
    import pyarrow.parquet as pq

    from rayemb.serve.columns import feature_columns, missing_columns_error

    features = list(feature_columns(schema, sequence) if features is None else features)
    labels = set(schema.labels) if output in (PREDICTION_COLUMN, SCORE) else set()
    for f in files:
        try:
            path, fs = storage.parquet_source(f)
            names = set(pq.read_schema(path, filesystem=fs).names)
        except (OSError, pa.ArrowInvalid) as e:
            raise DataError(f"{f!r} is not a readable parquet file ({e}). Remove it from --data or rewrite it.",
                            category="invalid_input") from None
        missing = [c for c in features if c not in names]
        if missing:
            raise missing_columns_error(schema, missing, f"Input file {f!r}")
        absent = [c for c in keep if c not in names]
        if absent:
            raise DataError(f"--keep-columns {absent} are not columns of {f!r}. Keep only columns every input file "
                            f"has (it has {sorted(names)[:20]}).", category="missing_columns")
        labels &= names
    return features + [c for c in passthrough_columns(schema, keep, labels) if c not in features]


def passthrough_columns(schema: DatasetSchema, keep: Sequence[str], read: Collection[str]) -> List[str]:
    """Input columns copied to the output after the model's: the label columns among those ``read``, in
    schema order, then ``keep``."""
    return list(dict.fromkeys([c for c in schema.labels if c in read] + list(keep)))


class _Scorer:
    """Ray Data callable class: the model built once per actor; a pyarrow batch in, its predictions out."""

    def __init__(self, bundle: List[Any], use_gpu: bool, passthrough: List[str], threads: int,
                 output: Optional[str] = None) -> None:
        import ray
        import torch

        from rayemb.logs import quiet_third_party_logs
        from rayemb.serve.model import InferenceModel
        from rayemb.serve.user_model import write_code

        quiet_third_party_logs()
        torch.set_num_threads(max(1, threads))
        loaded = ray.get(bundle[0])
        info = loaded["info"]
        schema = DatasetSchema.from_dict(info["schema"])
        # the factory's code of the export (its code/ folder), written where this actor can import it
        self.model = InferenceModel.from_state(loaded["state"], schema, info["model"], info.get("id_policy", "error"),
                                               info, device="cuda" if use_gpu else "cpu",
                                               code=write_code(loaded.get("code", {})))
        self.passthrough, self.output = passthrough, output

    def __call__(self, batch: pa.Table) -> pa.Table:
        from rayemb.serve.columns import output_table

        out = output_table(self.model, batch, self.output)
        for c in self.passthrough:
            out = out.append_column(c, batch.column(c))
        return out


@contextlib.contextmanager
def _data_context() -> Iterator[None]:
    """Ray Data settings of the scoring run, the caller's restored after: output rows in input order, and a
    UDF's own exception (a :class:`RayembError` naming the bad input) instead of Ray Data's wrapper, whose
    pickled form loses the cause."""
    import ray

    ctx = ray.data.DataContext.get_current()
    saved = (ctx.execution_options.preserve_order, ctx.raise_original_map_exception)
    ctx.execution_options.preserve_order, ctx.raise_original_map_exception = True, True
    try:
        yield
    finally:
        ctx.execution_options.preserve_order, ctx.raise_original_map_exception = saved


def _bundle(model_dir: str) -> Tuple[Dict[str, Any], Optional[str]]:
    """(what the scoring actors build the model from, the model's item feature: None for a ranking model)."""
    import json

    import torch

    from rayemb.serve.model import INFO_FILE, STATE_FILE, InferenceModel
    from rayemb.serve.user_model import code_dir, read_code

    item_feature = InferenceModel.load(model_dir).item_feature  # checks format, schema and tensor shapes once
    with open(os.path.join(model_dir, INFO_FILE)) as f:
        info = json.load(f)
    return {"info": info, "state": torch.load(os.path.join(model_dir, STATE_FILE), map_location="cpu",
                                              weights_only=True), "code": read_code(code_dir(model_dir, info))}, \
        item_feature


def _write_on_driver(ds: Any, tmp: str) -> None:
    """Writes the scored rows of ``ds``, in order, to ``part-NNNNN.parquet`` files of at most
    :data:`ROWS_PER_FILE` rows in the local directory ``tmp``.

    The blocks stream to this process one at a time: a scoring actor on another node would write
    into that node's own disk, where this process cannot see the files. A block whose schema
    differs from the open file's (inputs that disagree on a kept column's type) starts a new file.
    """
    os.makedirs(tmp, exist_ok=True)
    with PartWriter(tmp, ROWS_PER_FILE) as parts:
        for block in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            parts.write(block)


def predict(model_dir: str, data: str, out: str, num_workers: int = 1, use_gpu: bool = False,
            batch_size: int = DEFAULT_BATCH_SIZE, keep_columns: Sequence[str] = (), model_source: str = "",
            cpus_per_worker: float = 1.0, output: Optional[str] = None) -> Dict[str, Any]:
    """Scores every row of ``data`` with the export in ``model_dir``; writes parquet to ``out``; returns a summary.

    ``output``: a retrieval model's ``score`` (None: the default), ``user_embedding`` or ``item_embedding``;
    a ranking model takes none. Joins the running Ray (else starts a local one and stops it after).
    """
    import pyarrow.parquet as pq
    import ray

    from rayemb._ray import init_ray
    from rayemb.logs import redact_uri
    from rayemb.serve.export import check_out, publish, staging_dir

    t0 = time.monotonic()
    if num_workers < 1 or batch_size < 1:
        raise DataError(f"--num-workers {num_workers} and --batch-size {batch_size} must be at least 1.",
                        category="invalid_arguments")
    out = check_out(out)
    bundle, item_feature = _bundle(model_dir)
    schema = DatasetSchema.from_dict(bundle["info"]["schema"])
    from rayemb.serve.columns import check_output, input_columns, output_names
    from rayemb.serve.model import uses_sequence

    output = check_output(output, item_feature)  # a ranking model asked for a retrieval output: refused here
    files = input_files(data)
    sequence = uses_sequence(bundle["info"].get("model", {}))
    columns = output_columns(files, schema, list(keep_columns), sequence,
                             input_columns(schema, sequence, item_feature, output), output)
    passthrough = passthrough_columns(schema, list(keep_columns), set(columns))
    written_columns = output_names(schema, output) + passthrough
    rows_in = sum(pq.ParquetFile(p, filesystem=fs).metadata.num_rows
                  for p, fs in map(storage.parquet_source, files))
    started = not ray.is_initialized()
    init_ray()
    tmp = staging_dir(out)
    print(f"rayemb predict: {rows_in:,} rows in {len(files)} file(s) with {redact_uri(model_source or model_dir)}; "
          f"{num_workers} {'GPU' if use_gpu else 'CPU'} worker(s), batches of {batch_size}", flush=True)
    try:
        ref = ray.put(bundle)
        with _data_context():  # a Dataset keeps the context it was made in
            paths, fs = storage.for_ray_data(files)
            ds = ray.data.read_parquet(paths, columns=columns, filesystem=fs)
            ds = ds.map_batches(_Scorer, fn_constructor_kwargs={"bundle": [ref], "use_gpu": use_gpu,
                                                                "passthrough": passthrough,
                                                                "threads": int(cpus_per_worker),
                                                                "output": output},
                                batch_size=batch_size, batch_format="pyarrow",
                                compute=ray.data.ActorPoolStrategy(size=num_workers),
                                num_cpus=cpus_per_worker, num_gpus=1 if use_gpu else 0)
            _write_on_driver(ds, tmp)
        written = sorted(glob.glob(os.path.join(tmp, "*.parquet")))
        rows_out = sum(pq.ParquetFile(f).metadata.num_rows for f in written)
        if rows_out != rows_in:
            raise DataError(f"Wrote {rows_out} predictions for {rows_in} input rows; the input changed while it was "
                            "scored. Run again on data that is not being written.", category="invalid_input")
        published = publish(tmp, out)
    except Exception as e:
        user = find_user_error(e)  # a scoring actor's error arrives wrapped by Ray
        if user is not None and user is not e:
            raise user from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if started:
            ray.shutdown()
    files_out = sorted(storage.join(published, os.path.basename(f)) for f in written)
    seconds = time.monotonic() - t0
    return {"out": out, "rows": rows_out, "files": len(files_out), "paths": files_out, "columns": written_columns,
            "output": output, "seconds": seconds, "rows_per_s": rows_out / max(seconds, 1e-9)}


__all__ = ["DEFAULT_BATCH_SIZE", "input_files", "output_columns", "passthrough_columns", "predict"]
