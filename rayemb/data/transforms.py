"""Dense transforms: what each dense column goes through before the model, declared in schema.yaml.

``schema.yaml``::

    dense: [I1, I2, temperature, score, ratio]
    dense_transform: log1p           # columns not named below (absent: log1p)
    dense_transforms:
      temperature: standardize       # (x - mean) / std; mean and std of the train split, from the statistics pass
      score: {clip: [-1.0, 1.0]}     # min(max(x, lo), hi)
      ratio: identity                # x as it is

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
=============== ============================================ =====================================

``standardize``'s parameters are computed once, by the job's statistics pass
(:class:`rayemb.data.checks.DenseMoments`), and put on the schema
(:meth:`rayemb.data.schema.DatasetSchema.with_dense_params`), which every worker
already receives; the checkpoint's meta.json records every column's transform
with its parameters (:func:`checkpoint_entry`) and the export writes them into
``model.json``'s schema, so serving applies what training applied.

One object applies them, :class:`DenseTransforms`: :meth:`~DenseTransforms.apply`
on the numpy batch (:class:`~rayemb.data.batching.BatchConverter`, in training,
``InferenceModel``, the pyfunc model and ``rayemb predict``), and
:meth:`~DenseTransforms.module` as a scriptable torch module holding the same
vectors as buffers (the TorchScript export). Both compute, column ``j``::

    y = min(max(x, lo[j]), hi[j]);  y = log1p(y) where log[j];  y = (y - shift[j]) * scale[j]

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

LOG1P, STANDARDIZE, CLIP, IDENTITY = "log1p", "standardize", "clip", "identity"
#: every kind a dense column may declare
KINDS = (LOG1P, STANDARDIZE, CLIP, IDENTITY)
#: the transform of a column schema.yaml does not name (and of every column of a schema that names none)
DEFAULT_KIND = LOG1P
#: meta.json's key: every dense column's transform, with its parameters, of the checkpoint's model
CHECKPOINT_KEY = "dense_transforms"

_FORMS = ("log1p | standardize | identity | {clip: [lo, hi]} | {standardize: {mean: M, std: S}}")


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
    ``standardize``'s, None until :meth:`~rayemb.data.schema.DatasetSchema.with_dense_params` fills them)."""

    column: str
    kind: str = DEFAULT_KIND
    clip: Optional[Tuple[float, float]] = None
    mean: Optional[float] = None
    std: Optional[float] = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise _bad(self.column, self.kind, f"unknown kind; allowed: {', '.join(KINDS)}")
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

    def to_yaml(self) -> Any:
        """The schema.yaml value (:meth:`parse` reads it back)."""
        if self.kind == CLIP:
            return {CLIP: list(self.clip)}
        if self.kind == STANDARDIZE and self.mean is not None:
            return {STANDARDIZE: {"mean": self.mean, "std": self.std}}
        return self.kind

    def describe(self) -> str:
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


@dataclass(frozen=True, eq=False)
class DenseTransforms:
    """Every dense column's transform as per-column float32 vectors (the module docstring's formula).

    Built from a schema whose ``standardize`` columns have their parameters (:meth:`of`); applies to
    ``(B, len(schema.dense))`` float32 arrays with nulls already read as 0.
    """

    columns: Tuple[str, ...]
    lo: np.ndarray
    hi: np.ndarray
    log: np.ndarray  # bool
    shift: np.ndarray
    scale: np.ndarray

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
        return cls(tuple(schema.dense), lo, hi, log, shift, scale)

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

        return DenseTransformModule(self.lo, self.hi, self.log, self.shift, self.scale)


def checkpoint_entry(schema: "DatasetSchema") -> Dict[str, Any]:
    """``{CHECKPOINT_KEY: {column: schema.yaml value}}`` of every dense column of ``schema``, parameters included:
    what a checkpoint's meta.json records of the inputs its model was trained on."""
    return {CHECKPOINT_KEY: {c: schema.dense_transform_of(c).to_yaml() for c in schema.dense}}


def transforms_of_checkpoint(meta: Mapping[str, Any], columns: Sequence[str]) -> Dict[str, DenseTransform]:
    """Each dense column's transform recorded in a checkpoint's ``meta``. A checkpoint without the entry was
    written before transforms could be declared: its model saw ``log1p`` on every column."""
    recorded = meta.get(CHECKPOINT_KEY)
    if recorded is None:
        return {c: DenseTransform(c, LOG1P) for c in columns}
    if sorted(recorded) != sorted(columns):
        raise DataError(f"The checkpoint's model was trained on dense columns {sorted(recorded)}; the schema has "
                        f"{sorted(columns)}. Export with the dataset the checkpoint was trained on.",
                        category="bad_checkpoint")
    return {c: DenseTransform.parse(c, recorded[c]) for c in columns}


__all__ = ["CHECKPOINT_KEY", "CLIP", "DEFAULT_KIND", "DenseTransform", "DenseTransforms", "IDENTITY", "KINDS", "LOG1P",
           "STANDARDIZE", "checkpoint_entry", "dense_values", "standardize_params", "transforms_of_checkpoint"]
