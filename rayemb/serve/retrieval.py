"""What an exported retrieval model serves: pair scores, user vectors, item vectors, and the catalogue on disk.

A retrieval model (:mod:`rayemb.train.worker.retrieval`; the shipped one is
``model.name: two_tower``) names the one-id-per-row sparse feature that holds a
row's item (``item_feature``) and returns ``(query, candidate)``, two ``(B, d)``
tensors whose dot product scores the pair. From an export it serves:

* **pair scores** ``query . candidate`` of rows that hold a user and an item
  (what its training softmax took as logits; not probabilities). Every feature
  column is read; a row without an item is an error;
* **user embeddings**: the rows' query vectors. The item column is not needed
  (absent, its bags are empty: that changes only the candidate);
* **item embeddings**: candidate vectors of item ids, from batches whose item
  feature holds the ids and every other input is empty
  (:meth:`~rayemb.data.batching.BatchConverter.candidates`), which is what the
  contract allows: the candidate depends on the item alone. The whole catalogue
  is every id of the item table, ``0 .. num_embeddings - 1``.

The export writes the catalogue's vectors next to the model, for a
nearest-neighbour index::

    DIR/items.parquet   item (int64 id), item_embedding (list<float>): one row per id of the item table

Ids follow the job's ``data.id_policy`` as in training (``error``: an id
outside the table is an error naming it).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

import numpy as np
import pyarrow as pa

from rayemb.errors import DataError
from rayemb.serve.columns import id_column, missing_columns_error, vector_array
from rayemb.train.worker.retrieval import towers

#: the catalogue file of a retrieval model's export
ITEMS_FILE = "items.parquet"
#: its id column (its vector column: rayemb.serve.columns.ITEM_EMBEDDING)
ITEM_ID_COLUMN = "item"


def pair_scores(model: Any, table: pa.Table, batch_rows: int) -> np.ndarray:
    """``(N,)`` float64 ``query . candidate`` of every row of ``table`` (:meth:`InferenceModel.rows`), summed in
    float64 from the float32 vectors."""
    out = []
    for output in model.outputs(table, model.item_converter, batch_rows):  # a row without an item: an error
        query, candidate = towers(output)
        out.append((query.double() * candidate.double()).sum(-1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float64)


def user_vectors(model: Any, table: pa.Table, batch_rows: int) -> np.ndarray:
    """``(N, d)`` float32 query vectors of every row of ``table`` (:meth:`InferenceModel.rows`)."""
    out = [towers(output)[0].float().cpu().numpy() for output in model.outputs(table, batch_rows=batch_rows)]
    return np.concatenate(out) if out else np.zeros((0, _dim(model)), dtype=np.float32)


def item_column(model: Any, table: pa.Table) -> np.ndarray:
    """The item column of ``table`` as int64 ids; :class:`DataError` when it is absent or holds a null."""
    if model.item_feature not in table.column_names:
        raise missing_columns_error(model.schema, [model.item_feature], "The data to score")
    col = id_column(table, model.schema.feature(model.item_feature))
    if col.null_count:
        raise DataError(f"Item column {model.item_feature!r} holds {col.null_count} null id(s); an item vector "
                        "needs an item on every row: drop those rows.", category="invalid_input")
    return col.to_numpy().astype(np.int64, copy=False)


def _checked_ids(model: Any, ids: Any) -> np.ndarray:
    """``ids`` (None: every id of the item table) as int64, after the job's id policy."""
    from rayemb.data.batching import apply_id_policy

    rows = int(model.schema.feature(model.item_feature).num_embeddings)
    if ids is None:
        return np.arange(rows, dtype=np.int64)
    values = np.asarray(ids).reshape(-1)
    if values.size and (values.dtype.kind not in "iuf" or (values.dtype.kind == "f"
                                                           and not np.array_equal(values, np.round(values)))):
        raise DataError(f"Item ids must be integers; got {values[:5].tolist()} ({values.dtype}).",
                        category="invalid_input")
    return apply_id_policy(values.astype(np.int64), rows, model.id_policy, model.item_feature)


def item_vectors(model: Any, ids: Optional[Any], batch_rows: int) -> np.ndarray:
    """``(n, d)`` float32 candidate vectors of ``ids`` (None: the whole catalogue, in id order)."""
    ids = _checked_ids(model, ids)
    out = [vectors for _, vectors in _item_batches(model, ids, batch_rows)]
    return np.concatenate(out) if out else np.zeros((0, _dim(model)), dtype=np.float32)


def _item_batches(model: Any, ids: np.ndarray, batch_rows: int) -> Any:
    """``(ids, (n, d) float32 candidate vectors)`` per batch of ``batch_rows`` ids."""
    import torch

    from rayemb.contract.model import model_inputs

    device = model.device
    with torch.no_grad():
        for start in range(0, len(ids), batch_rows):
            part = ids[start:start + batch_rows]
            _, candidate = towers(model.model(*model_inputs(model.item_converter.candidates(part), device)))
            yield part, candidate.float().cpu().numpy()


def _dim(model: Any) -> int:
    """The vectors' dimension: one item's candidate, for an empty answer's shape."""
    return next(_item_batches(model, np.zeros(1, dtype=np.int64), 1))[1].shape[1]


def write_items(model: Any, directory: str, batch_rows: int = 8192) -> Dict[str, Any]:
    """Writes the catalogue's vectors to ``directory/items.parquet``, a batch at a time; returns model.json's
    ``retrieval`` entry."""
    import pyarrow.parquet as pq

    from rayemb.serve.columns import ITEM_EMBEDDING

    ids = _checked_ids(model, None)
    writer, dim = None, 0
    try:
        for part, vectors in _item_batches(model, ids, batch_rows):
            table = pa.table({ITEM_ID_COLUMN: pa.array(part, type=pa.int64()), ITEM_EMBEDDING: vector_array(vectors)})
            if writer is None:
                writer, dim = pq.ParquetWriter(os.path.join(directory, ITEMS_FILE), table.schema), vectors.shape[1]
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()
    return {"item_feature": model.item_feature, "items": ITEMS_FILE, "rows": len(ids), "dim": int(dim)}


__all__ = ["ITEMS_FILE", "ITEM_ID_COLUMN", "item_column", "item_vectors", "pair_scores", "user_vectors",
           "write_items"]
