"""Dense transforms: what each dense column goes through before the model, declared in schema.yaml.

``schema.yaml``::

    dense: [I1, I2, temperature, score, ratio]
    dense_transform: log1p           # columns not named below (absent: log1p)
    dense_transforms:
      temperature: standardize       # (x - mean) / std; mean and std of the train split, from the statistics pass
      score: {clip: [-1.0, 1.0]}     # min(max(x, lo), hi)
      ratio: identity                # x as it is
      age: {bucketize: [18, 25, 35, 50]}   # a sparse feature `age` of 5 bucket ids, its own table

A null reads as 0 before any transform. The kinds:

=============== ============================================ =====================================
kind            y                                            parameters
=============== ============================================ =====================================
``log1p``       ``log(1 + max(x, 0))``: counts; negatives    none (every column's default)
                read as 0
``standardize`` ``(x - mean) / std``                         mean, std of the train split (nulls
                                                             as 0); std 0 (a constant) divides by 1
``clip``        ``min(max(x, lo), hi)``                      ``[lo, hi]``, given
``identity``    ``x``                                        none
``bucketize``   the bucket id ``searchsorted(b, x,           ``[b0, ..., bk]``, given: finite,
                side='right')``: ``0`` below ``b0``, ``i``   strictly increasing; optionally
                on ``[b(i-1), bi)``, ``k+1`` from ``bk`` up  ``embedding_dim: D`` beside it
=============== ============================================ =====================================

``bucketize`` turns the column into a sparse feature: :class:`~rayemb.data.schema.DatasetSchema` takes it
out of ``dense`` and appends a one-id-per-row pooled feature of the same name, ``k+1`` rows, a table of its
own (``embedding_dim`` as written, else ``model.embedding_dim``), to ``sparse``. Everything downstream (the
model's dense input, statistics, split, planner, checkpoints, export) reads that schema, so none of it
knows the column was dense; only the bucket ids themselves are computed here, from the raw value (nulls
as 0; NaN or infinite refused like a dense value's).

``standardize``'s parameters are computed once, by the job's statistics pass
(:class:`rayemb.data.checks.DenseMoments`), and put on the schema
(:meth:`rayemb.data.schema.DatasetSchema.with_dense_params`), which every worker
already receives; the checkpoint's meta.json records every column's transform
with its parameters (:func:`checkpoint_entry`) and the export writes them into
``model.json``'s schema, so serving applies what training applied.

One object applies them, :class:`DenseTransforms`: :meth:`~DenseTransforms.apply`
(and :meth:`~DenseTransforms.bucket_ids` for the bucketized columns) on the numpy batch (:class:`~rayemb.data.batching.BatchConverter`, in training,
``InferenceModel``, the pyfunc model and ``rayemb predict``), and
:meth:`~DenseTransforms.module` as a scriptable torch module holding the same
vectors as buffers (the TorchScript export; ``torch.searchsorted`` for the buckets). Both compute, column ``j``::

    y = min(max(x, lo[j]), hi[j]);  y = log1p(y) where log[j];  y = (y - shift[j]) * scale[j]

and, bucketized column ``b``, ``id = searchsorted(boundaries[b], x, side='right')``.

Example::

    >>> t = DenseTransforms.of(schema.with_dense_params(stats))
    >>> t.apply(np.array([[3.0, -2.0]], np.float32))      # I1: log1p, temperature: standardize
    array([[1.3862944, -0.8164966]], dtype=float32)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from rayemb.errors import DataError

if TYPE_CHECKING:
    from rayemb.data.schema import DatasetSchema

LOG1P, STANDARDIZE, CLIP, IDENTITY, BUCKETIZE = "log1p", "standardize", "clip", "identity", "bucketize"
#: every kind a dense column may declare
KINDS = (LOG1P, STANDARDIZE, CLIP, IDENTITY, BUCKETIZE)
#: the transform of a column schema.yaml does not name (and of every column of a schema that names none)
DEFAULT_KIND = LOG1P
#: meta.json's key: every dense column's transform, with its parameters, of the checkpoint's model
CHECKPOINT_KEY = "dense_transforms"

_FORMS = ("log1p | standardize | identity | {clip: [lo, hi]} | {standardize: {mean: M, std: S}} | "
          "{bucketize: [b0, ..., bk]} (optionally with embedding_dim: D)")


def _bad(column: str, value: Any, why: str) -> DataError:
    return DataError(f"Dense column {column!r} has transform {value!r} in schema.yaml: {why}. Write one of "
                     f"{_FORMS} under dense_transforms (docs/data.md, Dense transforms).", category="invalid_schema")


def _number(column: str, value: Any, spec: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(column, spec, f"{what} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class DenseTransform:
    """One dense column's transform: ``kind`` and its parameters (``clip``: given; ``mean``/``std``:
    ``standardize``'s, None until :meth:`~rayemb.data.schema.DatasetSchema.with_dense_params` fills them;
    ``boundaries`` and ``embedding_dim``: ``bucketize``'s, the sparse feature the column becomes)."""

    column: str
    kind: str = DEFAULT_KIND
    clip: Optional[Tuple[float, float]] = None
    mean: Optional[float] = None
    std: Optional[float] = None
    boundaries: Optional[Tuple[float, ...]] = None
    embedding_dim: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise _bad(self.column, self.kind, f"unknown kind; allowed: {', '.join(KINDS)}")
        if (self.kind == BUCKETIZE) != (self.boundaries is not None):
            raise _bad(self.column, self.kind, "bucketize needs its boundaries [b0, ..., bk], and only bucketize "
                                               "has boundaries")
        if self.embedding_dim is not None and self.kind != BUCKETIZE:
            raise _bad(self.column, self.kind, "only bucketize (a column that becomes a sparse feature) has an "
                                               "embedding_dim")
        if self.boundaries is not None:
            b = self.boundaries
            if not b or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)
                            for x in b) or any(lo >= hi for lo, hi in zip(b, b[1:])):
                raise _bad(self.column, {BUCKETIZE: list(b)}, "the boundaries must be a non-empty list of finite "
                                                               "numbers, strictly increasing (e.g. [18, 25, 35, 50])")
        if (self.kind == CLIP) != (self.clip is not None):
            raise _bad(self.column, self.kind, "clip needs its bounds [lo, hi], and only clip has bounds")
        if self.clip is not None and not self.clip[0] <= self.clip[1]:
            raise _bad(self.column, {CLIP: list(self.clip)}, "lo must not exceed hi")
        if self.kind != STANDARDIZE and (self.mean is not None or self.std is not None):
            raise _bad(self.column, self.kind, "only standardize has a mean and a std")
        if (self.mean is None) != (self.std is None):
            raise _bad(self.column, self.kind, "standardize's parameters are a mean and a std, both or neither")
        if self.std is not None and not self.std >= 0:
            raise _bad(self.column, self.kind, f"std must be >= 0, got {self.std}")

    @property
    def ready(self) -> bool:
        """Whether its parameters are known (standardize: mean and std from the statistics pass)."""
        return self.kind != STANDARDIZE or self.mean is not None

    @classmethod
    def parse(cls, column: str, spec: Any) -> "DenseTransform":
        """A schema.yaml value: a kind's name, ``{clip: [lo, hi]}`` or ``{standardize: {mean: M, std: S}}``."""
        if isinstance(spec, str):
            return cls(column, spec)
        if isinstance(spec, Mapping) and BUCKETIZE in spec:
            return cls._parse_bucketize(column, spec)
        if not isinstance(spec, Mapping) or len(spec) != 1:
            raise _bad(column, spec, "expected a kind's name or a mapping of one kind to its parameters")
        (kind, params), = spec.items()
        if kind == CLIP:
            if not isinstance(params, (list, tuple)) or len(params) != 2:
                raise _bad(column, spec, "clip takes a list of two bounds, [lo, hi]")
            return cls(column, CLIP, clip=(_number(column, params[0], spec, "lo"),
                                           _number(column, params[1], spec, "hi")))
        if kind == STANDARDIZE and isinstance(params, Mapping) and set(params) == {"mean", "std"}:
            return cls(column, STANDARDIZE, mean=_number(column, params["mean"], spec, "mean"),
                       std=_number(column, params["std"], spec, "std"))
        if kind in KINDS and params is None:
            return cls(column, str(kind))
        raise _bad(column, spec, f"{kind!r} with parameters {params!r} is not a transform")

    @classmethod
    def _parse_bucketize(cls, column: str, spec: Mapping[str, Any]) -> "DenseTransform":
        extra = sorted(map(str, set(spec) - {BUCKETIZE, "embedding_dim"}))
        if extra:
            raise _bad(column, spec, f"bucketize takes only embedding_dim beside it, not {extra}")
        bounds = spec[BUCKETIZE]
        if not isinstance(bounds, (list, tuple)) or not bounds:
            raise _bad(column, spec, "bucketize takes a non-empty list of boundaries, [b0, ..., bk]")
        dim = spec.get("embedding_dim")
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
            raise _bad(column, spec, f"embedding_dim must be an integer, got {dim!r}")
        return cls(column, BUCKETIZE, boundaries=tuple(
            _number(column, b, spec, "every boundary") for b in bounds), embedding_dim=dim)

    def to_yaml(self) -> Any:
        """The schema.yaml value (:meth:`parse` reads it back)."""
        if self.kind == BUCKETIZE:
            return {BUCKETIZE: list(self.boundaries),
                    **({"embedding_dim": self.embedding_dim} if self.embedding_dim is not None else {})}
        if self.kind == CLIP:
            return {CLIP: list(self.clip)}
        if self.kind == STANDARDIZE and self.mean is not None:
            return {STANDARDIZE: {"mean": self.mean, "std": self.std}}
        return self.kind

    def describe(self) -> str:
        if self.kind == BUCKETIZE:
            return f"bucketize into {len(self.boundaries) + 1} buckets at {list(self.boundaries)}"
        if self.kind == CLIP:
            return f"clip to [{self.clip[0]:g}, {self.clip[1]:g}]"
        if self.kind == STANDARDIZE and self.mean is not None:
            return f"standardize (mean {self.mean:.6g}, std {self.std:.6g})"
        return self.kind


def dense_values(col: Any) -> np.ndarray:
    """A dense column (pyarrow, numeric or boolean) as a numpy array with nulls read as 0: what the transforms
    see, in training, in serving and in the statistics pass."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray) and not col.num_chunks:
        return np.zeros(0)
    if pa.types.is_boolean(col.type):
        col = pc.cast(col, pa.int8())
    return (pc.fill_null(col, 0) if col.null_count else col).to_numpy(zero_copy_only=False)


def standardize_params(mean: float, std: float) -> Tuple[float, float]:
    """(shift, scale) of ``(x - mean) / std``: a constant column (std 0) is only centred."""
    return float(mean), 1.0 / float(std) if std > 0 else 1.0


def bucket_ids(boundaries: np.ndarray, values: np.ndarray) -> np.ndarray:
    """int64 bucket ids of ``values`` (nulls already read as 0): ``searchsorted(boundaries, x, side='right')``,
    so ``x`` on a boundary ``bi`` falls in the bucket above it (``i + 1``)."""
    return np.searchsorted(boundaries, values, side="right").astype(np.int64, copy=False)


@dataclass(frozen=True, eq=False)
class DenseTransforms:
    """Every dense column's transform as per-column float32 vectors (the module docstring's formula).

    Built from a schema whose ``standardize`` columns have their parameters (:meth:`of`); applies to
    ``(B, len(schema.dense))`` float32 arrays with nulls already read as 0. ``buckets`` holds the bucketized
    columns (the schema's sparse features with ``bucketize``), each with its float32 boundaries.
    """

    columns: Tuple[str, ...]
    lo: np.ndarray
    hi: np.ndarray
    log: np.ndarray  # bool
    shift: np.ndarray
    scale: np.ndarray
    buckets: Tuple[Tuple[str, np.ndarray], ...] = ()

    @classmethod
    def of(cls, schema: "DatasetSchema") -> "DenseTransforms":
        """The transforms ``schema`` declares; :class:`DataError` when a ``standardize`` column has no parameters."""
        transforms = [schema.dense_transform_of(c) for c in schema.dense]
        missing = [t.column for t in transforms if not t.ready]
        if missing:
            raise DataError(f"Dense column(s) {missing} are declared `standardize` but the schema holds no mean and "
                            "std for them. Those come from the statistics pass: build the batches from "
                            "schema.with_dense_params(stats) (a training job does), or export a checkpoint written "
                            "by a job of this rayemb.", category="invalid_schema")
        n = len(transforms)
        lo, hi = np.full(n, -np.inf, np.float32), np.full(n, np.inf, np.float32)
        log = np.zeros(n, bool)
        shift, scale = np.zeros(n, np.float32), np.ones(n, np.float32)
        for j, t in enumerate(transforms):
            if t.kind == LOG1P:
                lo[j], log[j] = 0.0, True
            elif t.kind == CLIP:
                lo[j], hi[j] = t.clip
            elif t.kind == STANDARDIZE:
                shift[j], scale[j] = standardize_params(t.mean, t.std)
        # float32 on both sides, as the dense values and the TorchScript form compare them
        buckets = tuple((f.name, np.asarray(f.bucketize, np.float32)) for f in schema.sparse
                        if f.bucketize is not None)
        return cls(tuple(schema.dense), lo, hi, log, shift, scale, buckets)

    @property
    def bucket_columns(self) -> Tuple[str, ...]:
        """The bucketized columns, in schema order (the order their features close the sparse list)."""
        return tuple(c for c, _ in self.buckets)

    def bucket_ids(self, column: str, values: np.ndarray) -> np.ndarray:
        """The int64 bucket ids of bucketized ``column``'s raw ``values`` (nulls read as 0, :func:`dense_values`);
        :class:`DataError` on NaN or infinite values, as for a dense column."""
        boundaries = dict(self.buckets)[column]
        values = np.asarray(values, np.float32)
        if not np.isfinite(values).all():
            raise DataError(f"Bucketized column {column!r} holds {int((~np.isfinite(values)).sum())} NaN or "
                            "infinite value(s); clean them (e.g. fill with 0) before training.",
                            category="invalid_values")
        return bucket_ids(boundaries, values)

    @property
    def _affine(self) -> bool:
        return bool(self.shift.any() or (self.scale != 1).any())

    def apply(self, dense: np.ndarray) -> np.ndarray:
        """Transforms ``dense`` ``(B, C)`` float32 in place and returns it."""
        if dense.shape[1] != len(self.columns):
            raise ValueError(f"dense batch of {dense.shape[1]} columns, transforms of {len(self.columns)}")
        if np.isfinite(self.lo).any():
            np.maximum(dense, self.lo, out=dense)
        if np.isfinite(self.hi).any():
            np.minimum(dense, self.hi, out=dense)
        if self.log.all():  # every column log1p: one call over the whole batch
            np.log1p(dense, out=dense)
        elif self.log.any():
            idx = np.flatnonzero(self.log)
            dense[:, idx] = np.log1p(dense[:, idx])
        if self._affine:
            dense -= self.shift
            dense *= self.scale
        return dense

    def module(self) -> Any:
        """The same transforms as a scriptable ``torch.nn.Module`` (:class:`rayemb.data.transform_module.
        DenseTransformModule`), the vectors as buffers: ``module(dense)`` equals :meth:`apply`."""
        from rayemb.data.transform_module import DenseTransformModule

        return DenseTransformModule(self.lo, self.hi, self.log, self.shift, self.scale,
                                    [b for _, b in self.buckets])


def checkpoint_entry(schema: "DatasetSchema") -> Dict[str, Any]:
    """``{CHECKPOINT_KEY: {column: schema.yaml value}}`` of every dense column of ``schema``, parameters included,
    and of every bucketized one (its boundaries): what a checkpoint's meta.json records of the inputs its model
    was trained on."""
    return {CHECKPOINT_KEY: {
        **{c: schema.dense_transform_of(c).to_yaml() for c in schema.dense},
        **{f.name: DenseTransform(f.name, BUCKETIZE, boundaries=f.bucketize, embedding_dim=f.embedding_dim).to_yaml()
           for f in schema.sparse if f.bucketize is not None}}}


def transforms_of_checkpoint(meta: Mapping[str, Any], columns: Sequence[str],
                             buckets: Optional[Mapping[str, Sequence[float]]] = None) -> Dict[str, DenseTransform]:
    """Each dense column's transform recorded in a checkpoint's ``meta``. A checkpoint without the entry was
    written before transforms could be declared: its model saw ``log1p`` on every column. ``buckets`` (the
    schema's bucketized columns -> boundaries), when given, must be the boundaries the checkpoint recorded: other
    boundaries would send values to rows the model did not learn for them."""
    recorded = meta.get(CHECKPOINT_KEY)
    if recorded is None:
        return {c: DenseTransform(c, LOG1P) for c in columns}
    parsed = {str(c): DenseTransform.parse(str(c), v) for c, v in recorded.items()}
    trained = {c: t.boundaries for c, t in parsed.items() if t.kind == BUCKETIZE}
    dense = sorted(c for c in parsed if c not in trained)
    if dense != sorted(columns):
        raise DataError(f"The checkpoint's model was trained on dense columns {dense}; the schema has "
                        f"{sorted(columns)}. Export with the dataset the checkpoint was trained on.",
                        category="bad_checkpoint")
    if buckets is not None and trained != {c: tuple(map(float, b)) for c, b in buckets.items()}:
        raise DataError(f"The checkpoint's model was trained on bucketized columns {trained}; the schema bucketizes "
                        f"{dict(buckets)}. Export with the schema.yaml the checkpoint was trained on (its "
                        "dense_transforms' bucketize boundaries).", category="bad_checkpoint")
    return {c: parsed[c] for c in columns}


__all__ = ["BUCKETIZE", "CHECKPOINT_KEY", "CLIP", "bucket_ids", "DEFAULT_KIND", "DenseTransform", "DenseTransforms", "IDENTITY", "KINDS", "LOG1P",
           "STANDARDIZE", "checkpoint_entry", "dense_values", "standardize_params", "transforms_of_checkpoint"]
