"""Batch conversion: a pyarrow batch of the dataset → tensors a DLRM consumes.

One-hot columns (int64) become bags of length 1; multi-hot columns
(list<int64>) keep their lengths, empty and null lists included (length 0).
The KeyedJaggedTensor is laid out key-major, as TorchRec expects: all the
lengths of feature 0, then all of feature 1, ...

Example::

    >>> conv = BatchConverter(schema)
    >>> b = conv(pa_table)          # Batch(dense=(B, 13) float, sparse=KJT, labels=(B,))
    >>> b.sparse.keys()
    ['C1', ..., 'C26']

Dense counts are transformed with ``log1p(max(x, 0))`` and nulls read as 0, the
usual Criteo preprocessing.

Sequence features (``schema.sequence``; with ``BatchConverter(...,
sequence=True)``) go to a second, separate KJT ``Batch.sequence``: jagged, each
row cut to its ``max_length`` most recent ids
(:func:`rayemb.embedding.sequence.truncate_recent`), ids checked with the same
``id_policy``. It is separate because it feeds another module (the DLRM's
``sequence`` EmbeddingCollection) and the hybrid remap is for pooled tables only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayemb.data.schema import DatasetSchema

if TYPE_CHECKING:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from rayemb.errors import DataError


@dataclass
class Batch:
    dense: "torch.Tensor"  # (B, num_dense) float32
    sparse: "KeyedJaggedTensor"
    labels: "torch.Tensor"  # (B,) float32
    #: the sequence features' KJT (keys = schema.sequence_names), None when not asked for
    sequence: Optional["KeyedJaggedTensor"] = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def _column(batch: pa.Table, name: str) -> pa.Array:
    col = batch.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def sparse_arrays(batch: pa.Table, name: str, multi_hot: bool) -> Tuple[np.ndarray, np.ndarray]:
    """(values int64, lengths int32) of one sparse column, vectorized (no per-row Python)."""
    col = _column(batch, name)
    if multi_hot:
        lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int32)
        values = pc.list_flatten(col)
        if values.null_count:
            raise DataError(
                f"Sparse column {name!r} holds {values.null_count} null id(s) inside its lists; "
                "drop them or map them to a reserved id before training."
            )
        return values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False), lengths
    valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
    # A null one-hot id is an empty bag (length 0), as Criteo's missing categories.
    values = pc.drop_null(col).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return values, valid.astype(np.int32)


def apply_id_policy(values: np.ndarray, num_embeddings: int, policy: str, name: str) -> np.ndarray:
    """Ids outside ``[0, num_embeddings)``: raise (``error``), wrap (``hash``) or clip (``clip``)."""
    bad = (values < 0) | (values >= num_embeddings)
    if not bad.any():
        return values
    if policy == "hash":
        return np.mod(values, num_embeddings)
    if policy == "clip":
        return np.clip(values, 0, num_embeddings - 1)
    examples = np.unique(values[bad])[:5].tolist()
    raise DataError(
        f"Sparse column {name!r} has {int(bad.sum())} id(s) outside [0, {num_embeddings}) in this batch, "
        f"e.g. {examples}. Fix num_embeddings in schema.yaml, or set data.id_policy to 'hash' or 'clip'."
    )


class BatchConverter:
    """Turns pyarrow batches into :class:`Batch` (picklable; runs in the worker or a Ray Data task)."""

    def __init__(self, schema: DatasetSchema, id_policy: str = "error",
                 remap: Optional[Callable[[Any], Any]] = None, sequence: bool = False) -> None:
        self.schema = schema
        self.id_policy = id_policy
        #: applied to the KeyedJaggedTensor last, e.g. the hybrid embedding's hot/cold id remap
        self.remap = remap
        if sequence and not schema.sequence:
            raise DataError("A sequence batch was asked for but schema.yaml declares no `sequence: true` feature; "
                            "add one (docs/sequence.md) or set model.sequence_tower: none.",
                            category="invalid_schema")
        #: also build Batch.sequence from the schema's sequence features
        self.sequence = sequence

    def sequence_kjt(self, batch: pa.Table) -> "KeyedJaggedTensor":
        """The sequence features of ``batch`` as one KJT: latest ``max_length`` ids per row, key-major."""
        import torch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        from rayemb.embedding.sequence import truncate_recent

        all_values, all_lengths = [], []
        for feat in self.schema.sequence:
            values, lengths = sparse_arrays(batch, feat.name, multi_hot=True)
            values = apply_id_policy(values, feat.num_embeddings, self.id_policy, feat.name)
            lengths, values = truncate_recent(lengths, values, feat.max_length)
            all_values.append(values)
            all_lengths.append(lengths)
        return KeyedJaggedTensor.from_lengths_sync(
            keys=self.schema.sequence_names,
            values=torch.from_numpy(np.concatenate(all_values)),
            lengths=torch.from_numpy(np.concatenate(all_lengths).astype(np.int32)),
        )

    @property
    def keys(self) -> List[str]:
        return self.schema.sparse_names

    def __call__(self, batch: pa.Table) -> Batch:
        import torch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        n = batch.num_rows
        if n == 0:
            raise DataError("Received an empty batch; the dataset split has no rows.")
        dense = np.empty((n, len(self.schema.dense)), dtype=np.float32)
        for i, c in enumerate(self.schema.dense):
            col = pc.fill_null(_column(batch, c), 0).to_numpy(zero_copy_only=False)
            dense[:, i] = col
        if not np.isfinite(dense).all():
            bad_cols = [c for i, c in enumerate(self.schema.dense) if not np.isfinite(dense[:, i]).all()]
            raise DataError(
                f"Dense column(s) {bad_cols} hold NaN or infinite values; clean them (e.g. fill with 0) "
                "before training."
            )
        np.log1p(np.maximum(dense, 0.0), out=dense)

        labels = _column(batch, self.schema.label)
        if labels.null_count:
            raise DataError(f"Label column {self.schema.label!r} has {labels.null_count} null value(s); drop those rows.")
        labels_np = labels.to_numpy(zero_copy_only=False).astype(np.float32)

        all_values, all_lengths = [], []
        for feat in self.schema.sparse:
            values, lengths = sparse_arrays(batch, feat.name, feat.multi_hot)
            all_values.append(apply_id_policy(values, feat.num_embeddings, self.id_policy, feat.name))
            all_lengths.append(lengths)
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=self.keys,
            values=torch.from_numpy(np.concatenate(all_values)),
            lengths=torch.from_numpy(np.concatenate(all_lengths)),
        )
        if self.remap is not None:
            kjt = self.remap(kjt)
        return Batch(dense=torch.from_numpy(dense), sparse=kjt, labels=torch.from_numpy(labels_np),
                     sequence=self.sequence_kjt(batch) if self.sequence else None)
