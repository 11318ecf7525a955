"""The columns of scoring: what an exported model reads, and what it writes for each of its outputs.

It reads the training dataset's feature columns (schema.yaml): the dense, the
pooled sparse and, for a model with a user-history tower, the sequence
features, each converted to the type training reads. What it writes depends on
the model and on the output asked for:

===================  ==============================  ===================================================
model                output                          columns
===================  ==============================  ===================================================
ranking, one label   ``prediction`` (the only one)   ``prediction``: the probability
ranking, T labels    ``prediction`` (the only one)   ``prediction_<label>`` per label of schema.yaml's
                                                     ``label: [click, like]``, in that order
retrieval            ``score`` (default)             ``score``: the pair's ``query . candidate``
retrieval            ``user_embedding``              ``user_embedding``: the row's query vector
retrieval            ``item_embedding``              ``item_embedding``: the row's item's candidate vector
===================  ==============================  ===================================================

A retrieval model (one naming an ``item_feature``, :mod:`rayemb.train.worker.retrieval`)
needs every feature column for ``score``, every one but the item's for
``user_embedding``, and only the item's for ``item_embedding``. Vectors are
``list<float>`` columns.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np
import pyarrow as pa

from rayemb.data.schema import DatasetSchema
from rayemb.errors import ConfigError, DataError

#: the probability column of a single-task ranking model (pyfunc DataFrame, rayemb predict parquet); a
#: multi-task model writes ``prediction_<label>`` per label
PREDICTION_COLUMN = "prediction"
#: a retrieval model's outputs: the pair score (default), the row's query vector, its item's candidate vector
SCORE, USER_EMBEDDING, ITEM_EMBEDDING = "score", "user_embedding", "item_embedding"
RETRIEVAL_OUTPUTS = (SCORE, USER_EMBEDDING, ITEM_EMBEDDING)


def prediction_columns(schema: DatasetSchema) -> List[str]:
    """The probability columns of a ranking model: ``prediction``, or ``prediction_<label>`` per label."""
    if not schema.extra_labels:
        return [PREDICTION_COLUMN]
    return [f"{PREDICTION_COLUMN}_{label}" for label in schema.labels]


def check_output(output: Optional[str], item_feature: Optional[str]) -> str:
    """``output`` (None: the model's default) if the model serves it, else :class:`ConfigError` naming the choices."""
    if item_feature is None:
        if output in (None, PREDICTION_COLUMN):
            return PREDICTION_COLUMN
        raise ConfigError(f"Output {output!r} is served by retrieval models only (a model naming an item_feature, "
                          f"such as model.name: two_tower); this is a ranking model, whose output is its "
                          f"probabilities. Leave the output unset (rayemb predict: no --output; pyfunc: no "
                          f"params).", category="invalid_arguments")
    if output is None:
        return SCORE
    if output not in RETRIEVAL_OUTPUTS:
        raise ConfigError(f"Output {output!r} is not one a retrieval model serves; use one of "
                          f"{list(RETRIEVAL_OUTPUTS)} (default {SCORE!r}).", category="invalid_arguments")
    return output


def output_names(schema: DatasetSchema, output: str) -> List[str]:
    """The columns an output (:func:`check_output`'s) writes."""
    return prediction_columns(schema) if output == PREDICTION_COLUMN else [output]


def served_columns(schema: DatasetSchema, item_feature: Optional[str]) -> List[str]:
    """What a model writes: a ranking model's probability columns, a retrieval model's outputs."""
    return prediction_columns(schema) if item_feature is None else list(RETRIEVAL_OUTPUTS)


def feature_columns(schema: DatasetSchema, sequence: bool = True) -> List[str]:
    """The columns a prediction needs: the dense, the sparse and (``sequence``: for a model with a history
    tower) the sequence features; the label is optional."""
    return [*schema.dense, *schema.sparse_names, *(schema.sequence_names if sequence else [])]


def input_columns(schema: DatasetSchema, sequence: bool, item_feature: Optional[str], output: str) -> List[str]:
    """The feature columns ``output`` (:func:`check_output`'s) reads."""
    if output == ITEM_EMBEDDING:
        return [str(item_feature)]
    features = feature_columns(schema, sequence)
    return [c for c in features if c != item_feature] if output == USER_EMBEDDING else features


def missing_columns_error(schema: DatasetSchema, missing: List[str], where: str) -> DataError:
    history = set(missing) & set(schema.sequence_names)  # a history-tower model's list<int64> inputs
    counts = f"{len(schema.dense)} dense, {len(schema.sparse)} sparse" + (
        f", {len(schema.sequence)} sequence" if history else "")
    return DataError(
        f"{where} lacks column(s) {missing[:10]}{' ...' if len(missing) > 10 else ''} that the model needs "
        f"({counts} features as in the training dataset's schema.yaml). Score data with the training dataset's "
        "columns (rayemb convert writes them).",
        category="missing_columns")


def as_arrow(data: Any) -> pa.Table:
    """``data`` (pyarrow Table / RecordBatch, pandas DataFrame) as a pyarrow Table."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "columns") and hasattr(data, "dtypes"):  # a pandas DataFrame
        return pa.Table.from_pandas(data, preserve_index=False)
    raise DataError(f"Cannot score a {type(data).__name__}: pass a pyarrow Table or a pandas DataFrame with the "
                    "dataset's columns.", category="invalid_input")


def id_column(table: pa.Table, feat: Any) -> Any:
    """``feat``'s column as the type training reads (int64, or list<int64> for multi-hot and sequence features;
    a raw-id feature's string ids stay strings, hashed by the batch conversion as in training; a bucketized dense
    column stays the numbers the batch conversion buckets)."""
    col = table.column(feat.name)
    if feat.bucketize is not None:
        return col
    want = pa.list_(pa.int64()) if feat.multi_hot or feat.sequence else pa.int64()
    scalar = col.type.value_type if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) else col.type
    strings = pa.types.is_string(scalar) or pa.types.is_large_string(scalar)
    if col.type.equals(want) or (feat.ids == "raw" and strings):
        return col
    if feat.ids == "raw" and pa.types.is_floating(scalar):  # a float64 holds integers exactly up to 2**53 only
        raise DataError(f"Raw-id column {feat.name!r} is {col.type}: floats do not hold 64-bit ids exactly. Give "
                        "its ids as int64 (in pandas with nulls: the 'Int64' dtype) or as strings.",
                        category="invalid_input")
    try:
        return col.cast(want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        if feat.sequence:
            what, fix = "Sequence", "Give each row's history as a list of integer ids, oldest first."
        else:
            what, fix = "Sparse", "Give ids as integers (lists of integers for multi-hot features)."
        raise DataError(f"{what} column {feat.name!r} is {col.type}, not convertible to {want} ({e}). {fix}",
                        category="invalid_input") from None


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-z))`` in float64, without overflow for large ``|z|``."""
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def task_outputs(logits: np.ndarray, schema: Any) -> np.ndarray:
    """What is served per task, float64: a binary task's probability ``sigmoid(logit)``, a regression task's
    (schema.yaml ``task_types``) raw output. ``logits``: ``(N,)`` for one label, ``(N, T)`` for T labels."""
    regression = {label for label, kind in schema.task_types if kind == "regression"}
    if not regression:
        return sigmoid(logits)
    out = np.asarray(logits, dtype=np.float64)
    if out.ndim == 1:
        return out if schema.labels[0] in regression else sigmoid(out)
    return np.stack([out[:, i] if label in regression else sigmoid(out[:, i])
                     for i, label in enumerate(schema.labels)], axis=1)


def vector_array(vectors: np.ndarray) -> pa.Array:
    """``(N, d)`` float vectors as a ``list<float>`` array of N rows."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    offsets = np.arange(len(vectors) + 1, dtype=np.int64) * vectors.shape[1]
    if vectors.size < 2**31:  # list<float>; a catalogue of more values needs 64-bit offsets
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(vectors.reshape(-1)))
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(vectors.reshape(-1)))


def output_table(model: Any, data: Any, output: Optional[str] = None) -> pa.Table:
    """The columns ``output`` writes (:func:`output_names`) for every row of ``data``, in its order.

    ``model``: an :class:`~rayemb.serve.model.InferenceModel`; ``output`` None: the model's default."""
    output = check_output(output, model.item_feature)
    if output == PREDICTION_COLUMN:
        probs = model.predict(data)
        names = prediction_columns(model.schema)
        probs = probs.reshape(len(probs), len(names))
        return pa.table({n: pa.array(probs[:, i], type=pa.float64()) for i, n in enumerate(names)})
    if output == SCORE:
        return pa.table({SCORE: pa.array(model.predict(data), type=pa.float64())})
    if output == USER_EMBEDDING:
        return pa.table({USER_EMBEDDING: vector_array(model.user_embeddings(data))})
    return pa.table({ITEM_EMBEDDING: vector_array(model.item_embeddings(model.item_ids(data)))})


__all__ = ["ITEM_EMBEDDING", "PREDICTION_COLUMN", "RETRIEVAL_OUTPUTS", "SCORE", "USER_EMBEDDING", "as_arrow",
           "check_output", "feature_columns", "id_column", "input_columns", "missing_columns_error", "output_names",
           "output_table", "prediction_columns", "served_columns", "sigmoid", "task_outputs", "vector_array"]
