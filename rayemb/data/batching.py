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

Dense values read nulls as 0 and go through the schema's dense transforms
(:class:`~rayemb.data.transforms.DenseTransforms`: ``log1p(max(x, 0))``, the
usual Criteo preprocessing, unless schema.yaml declares another per column);
a schema with ``standardize`` columns must carry their parameters
(``schema.with_dense_params(stats)``).

A bucketized dense column (``bucketize``, a pooled feature of the schema) gets its ids from the same
:class:`~rayemb.data.transforms.DenseTransforms`: one bucket id per row, nulls read as 0.

Raw-id features (``ids: raw``, docs/raw_ids.md) keep their ids: int64 values
pass unchanged and strings become int64 by
:func:`rayemb.embedding.raw_ids.raw_ids_to_int64`; ``id_policy`` does not touch
them (any int64 is a valid raw id). The remap (``remap``) hands them to the
raw-id tables.

Sequence features (``schema.sequence``; with ``BatchConverter(...,
sequence=True)``) go to a second, separate KJT ``Batch.sequence``: jagged, each
row cut to its ``max_length`` most recent ids
(:func:`rayemb.embedding.sequence.truncate_recent`), ids checked with the same
``id_policy``. It is separate because it feeds another module (the DLRM's
``sequence`` EmbeddingCollection) and the hybrid remap is for pooled tables only.

Padding (validation scores every row): the sharded model's input exchange
needs the same batch size on every rank, so a short last batch is padded to the
full size (``converter(table, pad_to=B)``) and a rank with no rows left runs a
batch of padding only (``converter.padding(B)``). A padding row has dense
zeros, empty bags, label 0, weight 0 (with a weight column), and ``Batch.mask`` False; metrics leave it out.

A schema.yaml ``weight`` column reaches ``Batch.weights`` (float32, checked finite and >= 0 per batch), on the
train and the valid split alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayemb.data.schema import RAW, DatasetSchema
from rayemb.data.transforms import DenseTransforms, dense_values
from rayemb.embedding.raw_ids import raw_ids_to_int64

if TYPE_CHECKING:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from rayemb.errors import DataError


@dataclass
class Batch:
    dense: "torch.Tensor"  # (B, num_dense) float32
    sparse: "KeyedJaggedTensor"
    labels: "torch.Tensor"  # (B,) float32; (B, T) with T label columns (a multi-task schema)
    #: the sequence features' KJT (keys = schema.sequence_names), None when not asked for
    sequence: Optional["KeyedJaggedTensor"] = None
    #: (B,) bool, False on padding rows; None when every row is real
    mask: Optional["torch.Tensor"] = None
    #: (B,) int64 ids of the converter's ``keep_ids`` feature before any remap (-1 on padding rows), else None
    ids: Optional["torch.Tensor"] = None
    #: (B,) int64 group of each row (schema.yaml ``group``; strings hashed, -1 on padding rows) when the
    #: converter keeps groups (validation's GAUC), else None
    groups: Optional["torch.Tensor"] = None
    #: (B,) float32 weight of each row (schema.yaml ``weight``; 0 on padding rows), None: no weight column
    weights: Optional["torch.Tensor"] = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def rows(self) -> int:
        """Real (not padding) rows."""
        return len(self) if self.mask is None else int(self.mask.sum())


def _column(batch: pa.Table, name: str) -> pa.Array:
    col = batch.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _int64_ids(values: Any, raw: bool, name: str) -> np.ndarray:
    if raw:  # strings hashed; the function refuses any other non-integer type by name
        return raw_ids_to_int64(values, name)
    return values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def sparse_arrays(batch: pa.Table, name: str, multi_hot: bool, raw: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """(values int64, lengths int32) of one sparse column, vectorized (no per-row Python).

    ``raw``: a raw-id column, whose values may also be strings (hashed to int64)."""
    col = _column(batch, name)
    if multi_hot:
        lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int32)
        values = pc.list_flatten(col)
        if values.null_count:
            raise DataError(
                f"Sparse column {name!r} holds {values.null_count} null id(s) inside its lists; "
                "drop them or map them to a reserved id before training."
            )
        return _int64_ids(values, raw, name), lengths
    valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
    # A null one-hot id is an empty bag (length 0), as Criteo's missing categories.
    return _int64_ids(pc.drop_null(col), raw, name), valid.astype(np.int32)


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
                 remap: Optional[Callable[[Any], Any]] = None, sequence: bool = False,
                 keep_ids: Optional[str] = None, keep_groups: bool = False) -> None:
        self.schema = schema
        #: also fill ``Batch.groups`` from the schema's group column (when it names one)
        self.keep_groups = keep_groups and schema.group is not None
        self.id_policy = id_policy
        #: every dense column's transform, its parameters included (the export carries the same)
        self.dense_transforms = DenseTransforms.of(schema)
        #: applied to the KeyedJaggedTensor last, e.g. the hybrid embedding's hot/cold id remap
        self.remap = remap
        if sequence and not schema.sequence:
            raise DataError("A sequence batch was asked for but schema.yaml declares no `sequence: true` feature; "
                            "add one (docs/sequence.md) or set model.sequence_tower: none.",
                            category="invalid_schema")
        #: also build Batch.sequence from the schema's sequence features
        self.sequence = sequence
        #: a one-id-per-row sparse feature whose ids (checked, not remapped) also go to ``Batch.ids``: a
        #: retrieval model's item feature (rayemb.train.worker.retrieval)
        self.keep_ids = keep_ids
        if keep_ids is not None and keep_ids not in {f.name for f in schema.sparse if not f.multi_hot}:
            raise DataError(f"keep_ids={keep_ids!r} is not a one-id-per-row sparse feature of the schema.",
                            category="invalid_schema")
        if keep_ids is not None and schema.feature(keep_ids).ids == RAW:
            # a retrieval catalogue is every row of the item table; a raw-id table has no fixed rows to list
            raise DataError(f"Feature {keep_ids!r} holds raw ids (ids: raw); a retrieval model's item feature "
                            "needs encoded ids in [0, num_embeddings). Encode the item ids (e.g. `rayemb convert` "
                            "builds a vocabulary) or drop `ids: raw` from it.", category="invalid_schema")

    def sequence_kjt(self, batch: pa.Table) -> "KeyedJaggedTensor":
        """The sequence features of ``batch`` as one KJT: latest ``max_length`` ids per row, key-major."""
        return _kjt(self.schema.sequence_names, self._sequence_arrays(batch), 0)

    def _sequence_arrays(self, batch: pa.Table) -> List[Tuple[np.ndarray, np.ndarray]]:
        from rayemb.embedding.sequence import truncate_recent

        out = []
        for feat in self.schema.sequence:
            values, lengths = sparse_arrays(batch, feat.name, multi_hot=True)
            values = apply_id_policy(values, feat.num_embeddings, self.id_policy, feat.name)
            lengths, values = truncate_recent(lengths, values, feat.max_length)
            out.append((values, lengths))
        return out

    @property
    def keys(self) -> List[str]:
        """The KJT's keys: the pooled features table by table, the order the pooled modules take and return."""
        return self.schema.pooled_features

    def __call__(self, batch: pa.Table, pad_to: Optional[int] = None) -> Batch:
        """``batch`` as tensors; with ``pad_to``, padding rows (module docstring) fill it up to ``pad_to`` rows."""
        n = batch.num_rows
        if n == 0:
            raise DataError("Received an empty batch; the dataset split has no rows.")
        if pad_to is not None and pad_to < n:
            raise ValueError(f"a batch of {n} rows cannot be padded to {pad_to}")
        dense = np.empty((n, len(self.schema.dense)), dtype=np.float32)
        for i, c in enumerate(self.schema.dense):
            dense[:, i] = dense_values(_column(batch, c))
        if not np.isfinite(dense).all():
            bad_cols = [c for i, c in enumerate(self.schema.dense) if not np.isfinite(dense[:, i]).all()]
            raise DataError(
                f"Dense column(s) {bad_cols} hold NaN or infinite values; clean them (e.g. fill with 0) "
                "before training."
            )
        self.dense_transforms.apply(dense)

        columns = []
        for name in self.schema.labels:
            labels = _column(batch, name)
            if labels.null_count:
                raise DataError(f"Label column {name!r} has {labels.null_count} null value(s); drop those rows.")
            columns.append(labels.to_numpy(zero_copy_only=False).astype(np.float32))
        labels_np = columns[0] if len(columns) == 1 else np.stack(columns, axis=1)
        weights = None if self.schema.weight is None else self._weights(batch)

        sparse = []
        for feat in map(self.schema.feature, self.keys):
            if feat.bucketize is not None:  # a bucketized dense column: one id per row, nulls read as 0
                values = self.dense_transforms.bucket_ids(feat.name, dense_values(_column(batch, feat.name)))
                sparse.append((values, np.ones(n, np.int32)))
                continue
            values, lengths = sparse_arrays(batch, feat.name, feat.multi_hot, raw=feat.ids == RAW)
            if feat.ids != RAW:  # any int64 is a raw id: the raw-id table finds its row or the zero default
                values = apply_id_policy(values, feat.num_embeddings, self.id_policy, feat.name)
            sparse.append((values, lengths))
        sequence = self._sequence_arrays(batch) if self.sequence else None
        ids = None if self.keep_ids is None else sparse[self.keys.index(self.keep_ids)][0]
        if ids is not None and len(ids) != n:
            raise DataError(f"Sparse column {self.keep_ids!r} holds {n - len(ids)} null id(s) in this batch; a "
                            "retrieval model's item column needs an item on every row: drop those rows.")
        return self._assemble(dense, labels_np, sparse, sequence, 0 if pad_to is None else pad_to - n, ids,
                              self._groups(batch) if self.keep_groups else None, weights)

    def _weights(self, batch: pa.Table) -> np.ndarray:
        name = self.schema.weight
        col = _column(batch, name)
        w = col.to_numpy(zero_copy_only=False).astype(np.float32) if not col.null_count else None
        if w is None or not (np.isfinite(w) & (w >= 0)).all():
            bad = col.null_count if w is None else int((~(np.isfinite(w) & (w >= 0))).sum())
            raise DataError(f"Weight column {name!r} holds {bad} null, NaN, infinite or negative value(s) in this "
                            "batch; every row's weight must be a finite number >= 0: fix or drop those rows.",
                            category="invalid_values")
        return w

    def _groups(self, batch: pa.Table) -> np.ndarray:
        name = self.schema.group
        col = _column(batch, name)
        if col.null_count:
            raise DataError(f"Group column {name!r} has {col.null_count} null value(s) in this batch; give every "
                            "row a group (e.g. fill with a reserved id) or drop those rows.")
        return raw_ids_to_int64(col, name)  # integers unchanged, strings hashed

    def candidates(self, ids: np.ndarray, pad_to: Optional[int] = None) -> Batch:
        """A batch whose ``keep_ids`` feature holds ``ids``, one per row, and every other input is empty (dense
        zeros, empty bags): what a retrieval model's item tower needs to score the catalogue."""
        n = len(ids)
        pad = 0 if pad_to is None else pad_to - n
        if self.keep_ids is None or pad < 0 or n + pad == 0:
            raise ValueError(f"candidates: keep_ids={self.keep_ids!r}, {n} ids, pad_to={pad_to}")
        ids = np.asarray(ids, dtype=np.int64)
        sparse = [(ids, np.ones(n, np.int32)) if f.name == self.keep_ids else (np.zeros(0, np.int64),
                                                                                 np.zeros(n, np.int32))
                  for f in self.schema.sparse]
        tasks = len(self.schema.labels)
        sequence = [(np.zeros(0, np.int64), np.zeros(n, np.int32)) for _ in self.schema.sequence] \
            if self.sequence else None
        return self._assemble(np.zeros((n, len(self.schema.dense)), np.float32),
                              np.zeros(n if tasks == 1 else (n, tasks), np.float32), sparse, sequence, pad, ids)

    def padding(self, rows: int) -> Batch:
        """A batch of ``rows`` padding rows only, for a rank whose shard has no rows left."""
        def empty(features: Any) -> List[Tuple[np.ndarray, np.ndarray]]:
            return [(np.zeros(0, np.int64), np.zeros(0, np.int32)) for _ in features]

        tasks = len(self.schema.labels)
        return self._assemble(np.zeros((0, len(self.schema.dense)), np.float32),
                              np.zeros(0 if tasks == 1 else (0, tasks), np.float32),
                              empty(self.schema.sparse), empty(self.schema.sequence) if self.sequence else None, rows,
                              None if self.keep_ids is None else np.zeros(0, np.int64),
                              np.zeros(0, np.int64) if self.keep_groups else None,
                              None if self.schema.weight is None else np.zeros(0, np.float32))

    def _assemble(self, dense: np.ndarray, labels: np.ndarray, sparse: List[Tuple[np.ndarray, np.ndarray]],
                  sequence: Optional[List[Tuple[np.ndarray, np.ndarray]]], pad: int,
                  ids: Optional[np.ndarray] = None, groups: Optional[np.ndarray] = None,
                  weights: Optional[np.ndarray] = None) -> Batch:
        """The :class:`Batch` of these arrays followed by ``pad`` padding rows (remapped, masked)."""
        import torch

        n = labels.shape[0]
        if pad:
            dense = np.concatenate([dense, np.zeros((pad, dense.shape[1]), np.float32)])
            labels = np.concatenate([labels, np.zeros((pad, *labels.shape[1:]), np.float32)])
            ids = None if ids is None else np.concatenate([ids, np.full(pad, -1, np.int64)])
            groups = None if groups is None else np.concatenate([groups, np.full(pad, -1, np.int64)])
            weights = None if weights is None else np.concatenate([weights, np.zeros(pad, np.float32)])
        kjt = _kjt(self.keys, sparse, pad)
        if self.remap is not None:
            kjt = self.remap(kjt)
        return Batch(dense=torch.from_numpy(dense), sparse=kjt, labels=torch.from_numpy(labels),
                     sequence=None if sequence is None else _kjt(self.schema.sequence_names, sequence, pad),
                     mask=torch.arange(n + pad) < n if pad else None,
                     ids=None if ids is None else torch.from_numpy(np.array(ids, dtype=np.int64)),
                     groups=None if groups is None else torch.from_numpy(np.array(groups, dtype=np.int64)),
                     weights=None if weights is None else torch.from_numpy(np.array(weights, dtype=np.float32)))


def _kjt(keys: List[str], features: List[Tuple[np.ndarray, np.ndarray]], pad: int) -> "KeyedJaggedTensor":
    """One key-major KJT of per-feature ``(values, lengths)``, each feature followed by ``pad`` empty bags."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    values = [v for v, _ in features]
    lengths = [np.concatenate([ln, np.zeros(pad, ln.dtype)]) if pad else ln for _, ln in features]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.from_numpy(np.concatenate(values) if values else np.zeros(0, np.int64)),
        lengths=torch.from_numpy((np.concatenate(lengths) if lengths else np.zeros(0)).astype(np.int32, copy=False)),
    )
