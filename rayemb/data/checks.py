"""Checks of a dataset's values, counted in the statistics pass and applied before any worker starts.

A label that is null, NaN, infinite or anything but 0/1 goes straight into the
loss; a NaN dense value poisons every weight it touches. Neither shows up as an
error until the run has finished with garbage, so the statistics pass counts
them per file (a mergeable :class:`ValueSummary`, summed on the driver) and
:func:`check_values` fails the job before any worker starts, naming the column,
how many values and examples. Likewise :func:`check_ids` applies
``data.id_policy`` to the out-of-range sparse ids the pass counted.

The same pass measures each dense column's moments (:class:`DenseMoments`: count, mean, spread, min, max of
the values the model's transform sees, nulls as 0): ``standardize``'s parameters
(:mod:`rayemb.data.transforms`), and :func:`warn_dense_transforms` names a ``log1p`` column holding negatives.

Example::

    >>> s = ValueSummary.of_table(pa.table({"label": [0.0, 1.0, 0.5]}), "label", [])
    >>> s.label_not_binary, s.label_examples
    (1, [0.5])
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayemb.config import ID_POLICIES
from rayemb.data.transforms import dense_values
from rayemb.errors import DataError

if TYPE_CHECKING:
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.stats_types import DatasetStats

logger = logging.getLogger(__name__)

#: example bad label values kept for error messages
NUM_LABEL_EXAMPLES = 5


@dataclass(frozen=True)
class DenseMoments:
    """Count, mean, sum of squared deviations (``m2``), min and max of one dense column's finite values (merge
    with ``+``: Chan et al.'s pairwise update, exact for any split of the rows)."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    @classmethod
    def of(cls, x: np.ndarray) -> "DenseMoments":
        x = x[np.isfinite(x)]
        if not len(x):
            return cls()
        mean = float(x.mean())
        return cls(len(x), mean, float(np.square(x - mean).sum()), float(x.min()), float(x.max()))

    @property
    def std(self) -> float:
        """The population standard deviation (0 for fewer than 2 values)."""
        return math.sqrt(self.m2 / self.count) if self.count else 0.0

    def __add__(self, other: "DenseMoments") -> "DenseMoments":
        if not other.count:
            return self
        if not self.count:
            return other
        n = self.count + other.count
        delta = other.mean - self.mean
        return DenseMoments(n, self.mean + delta * other.count / n,
                            self.m2 + other.m2 + delta * delta * self.count * other.count / n,
                            min(self.min, other.min), max(self.max, other.max))

    def to_dict(self) -> Dict[str, Any]:
        """stats.json's entry; ``std`` is for reading, :meth:`from_dict` takes ``m2``."""
        finite = self.count > 0
        return {"count": self.count, "mean": self.mean, "std": self.std, "m2": self.m2,
                "min": self.min if finite else None, "max": self.max if finite else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DenseMoments":
        count = int(d.get("count", 0))
        if not count:
            return cls()
        return cls(count, float(d["mean"]), float(d["m2"]), float(d["min"]), float(d["max"]))


@dataclass
class ValueSummary:
    """Counts of bad label and dense values in some rows (merge with ``+``)."""

    rows: int = 0
    label_nulls: int = 0
    label_non_finite: int = 0
    label_not_binary: int = 0
    label_positives: int = 0
    label_examples: List[float] = field(default_factory=list)
    #: label column -> its values that are finite but not 0 or 1 (labels holding none left out): a regression
    #: label's are no problem
    label_not_binary_by: Dict[str, int] = field(default_factory=dict)
    #: dense column -> NaN or infinite (non-null) values
    dense_non_finite: Dict[str, int] = field(default_factory=dict)
    #: dense column -> moments of its finite values, nulls as 0 (what the model's transform sees)
    dense_moments: Dict[str, DenseMoments] = field(default_factory=dict)
    #: the weight column counted (schema.yaml ``weight``), None: the data has none, or the summary predates the count
    weight: Optional[str] = None
    #: weights that are null, NaN, infinite or negative, with example values
    weight_invalid: int = 0
    weight_examples: List[float] = field(default_factory=list)
    #: the sum of the valid weights: 0 over a split's rows leaves nothing to train on or score
    weight_sum: float = 0.0

    @classmethod
    def of_table(cls, table: pa.Table, label: Union[None, str, Sequence[str]],
                 dense: Sequence[str], weight: Optional[str] = None) -> "ValueSummary":
        """``label``: the label column, or every task's (their bad values summed; positives: the first's);
        ``weight``: the row weight column, if any."""
        s = cls(rows=table.num_rows)
        if weight is not None:
            col = table.column(weight)
            w = col.to_numpy(zero_copy_only=False).astype(np.float64) if col.num_chunks else np.zeros(0)
            bad = ~(np.isfinite(w) & (w >= 0))  # a null reads as NaN
            s.weight, s.weight_invalid, s.weight_sum = weight, int(bad.sum()), float(w[~bad].sum())
            s.weight_examples = _unique_examples(w[bad].tolist())
        labels = [label] if isinstance(label, str) else list(label or [])
        examples: List[float] = []
        for i, name in enumerate(labels):
            col = table.column(name)
            s.label_nulls += int(col.null_count)
            y = pc.drop_null(col).to_numpy().astype(np.float64, copy=False) if col.num_chunks else np.zeros(0)
            finite = np.isfinite(y)
            binary = (y == 0.0) | (y == 1.0)
            s.label_non_finite += int((~finite).sum())
            s.label_not_binary += int((finite & ~binary).sum())
            if (finite & ~binary).any():
                s.label_not_binary_by[name] = s.label_not_binary_by.get(name, 0) + int((finite & ~binary).sum())
            if i == 0:
                s.label_positives = int((y == 1.0).sum())
            examples += y[~binary].tolist()
        if examples:
            s.label_examples = _unique_examples(examples)
        for name in dense:
            col = table.column(name)
            x = dense_values(col).astype(np.float64, copy=False)
            s.dense_moments[name] = DenseMoments.of(x)
            n = int((~np.isfinite(x)).sum())
            if n:
                s.dense_non_finite[name] = n
        return s

    def __add__(self, other: "ValueSummary") -> "ValueSummary":
        dense = dict(self.dense_non_finite)
        for k, v in other.dense_non_finite.items():
            dense[k] = dense.get(k, 0) + v
        examples = _unique_examples([*self.label_examples, *other.label_examples])
        moments = dict(self.dense_moments)
        for k, v in other.dense_moments.items():
            moments[k] = moments[k] + v if k in moments else v
        by = dict(self.label_not_binary_by)
        for k, n in other.label_not_binary_by.items():
            by[k] = by.get(k, 0) + n
        return ValueSummary(
            weight=self.weight or other.weight, weight_invalid=self.weight_invalid + other.weight_invalid,
            weight_examples=_unique_examples([*self.weight_examples, *other.weight_examples]),
            weight_sum=self.weight_sum + other.weight_sum,
            rows=self.rows + other.rows,
            label_nulls=self.label_nulls + other.label_nulls,
            label_non_finite=self.label_non_finite + other.label_non_finite,
            label_not_binary=self.label_not_binary + other.label_not_binary,
            label_positives=self.label_positives + other.label_positives,
            label_examples=examples,
            label_not_binary_by=by,
            dense_non_finite=dense,
            dense_moments=moments,
        )

    def to_dict(self) -> Dict[str, Any]:
        return {
            "rows": self.rows,
            "label": {"nulls": self.label_nulls, "non_finite": self.label_non_finite,
                      "not_binary": self.label_not_binary, "positives": self.label_positives,
                      "examples": self.label_examples,
                      **({"not_binary_by": dict(self.label_not_binary_by)} if self.label_not_binary_by else {})},
            "dense_non_finite": dict(self.dense_non_finite),
            # a stats.json written before the moments were measured reads and writes as it was
            **({"dense": {k: v.to_dict() for k, v in self.dense_moments.items()}} if self.dense_moments else {}),
            **({"weight": {"column": self.weight, "invalid": self.weight_invalid, "examples": self.weight_examples,
                           "sum": self.weight_sum}} if self.weight else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ValueSummary":
        lab = d.get("label", {})
        return cls(rows=int(d.get("rows", 0)), label_nulls=int(lab.get("nulls", 0)),
                   label_non_finite=int(lab.get("non_finite", 0)), label_not_binary=int(lab.get("not_binary", 0)),
                   label_positives=int(lab.get("positives", 0)), label_examples=list(lab.get("examples", [])),
                   label_not_binary_by={k: int(v) for k, v in lab.get("not_binary_by", {}).items()},
                   dense_non_finite={k: int(v) for k, v in d.get("dense_non_finite", {}).items()},
                   dense_moments={k: DenseMoments.from_dict(v) for k, v in d.get("dense", {}).items()},
                   weight=d["weight"]["column"] if "weight" in d else None,
                   weight_invalid=int(d.get("weight", {}).get("invalid", 0)),
                   weight_examples=list(d.get("weight", {}).get("examples", [])),
                   weight_sum=float(d.get("weight", {}).get("sum", 0.0)))


def _unique_examples(values: Sequence[float]) -> List[float]:
    """Sorted distinct values (NaN once, last), at most NUM_LABEL_EXAMPLES."""
    finite = sorted({float(v) for v in values if not np.isnan(v)})
    has_nan = any(np.isnan(v) for v in values)
    return (finite + ([float("nan")] if has_nan else []))[:NUM_LABEL_EXAMPLES]


def check_values(summary: ValueSummary, label: Union[str, Sequence[str]], where: str,
                 regression: Sequence[str] = ()) -> None:
    """Raises :class:`DataError` when ``summary`` (of the dataset split ``where``) holds bad labels or dense values.
    ``label``: the label column, or every task's; ``regression``: the labels of regression tasks, whose values
    need only be finite."""
    label = label if isinstance(label, str) or len(label) != 1 else label[0]
    not_binary = summary.label_not_binary
    if regression:
        if summary.label_not_binary_by:
            not_binary -= sum(n for k, n in summary.label_not_binary_by.items() if k in regression)
        elif set(regression) >= ({label} if isinstance(label, str) else set(label)):
            not_binary = 0  # a summary without per-label counts, every label a regression one
    problems = []
    if summary.label_nulls:
        problems.append(f"label column {label!r} has {summary.label_nulls:,} null value(s)")
    if summary.label_non_finite:
        problems.append(f"label column {label!r} has {summary.label_non_finite:,} NaN or infinite value(s)")
    if not_binary:
        problems.append(f"label column {label!r} has {not_binary:,} value(s) that are not 0 or 1")
    if problems and summary.label_examples:
        problems[-1] += f" (e.g. {summary.label_examples})"
    if problems:
        problems[-1] += "; rayemb trains click models, so labels must be 0 or 1 — drop or fix those rows"
    if summary.dense_non_finite:
        cols = ", ".join(f"{k!r} ({v:,})" for k, v in sorted(summary.dense_non_finite.items()))
        problems.append(f"dense column(s) {cols} hold NaN or infinite values — fill them (e.g. with 0) or drop "
                        "those rows")
    if summary.weight and summary.weight_invalid:
        problems.append(f"weight column {summary.weight!r} has {summary.weight_invalid:,} null, NaN, infinite or "
                        f"negative value(s) (e.g. {summary.weight_examples}) — every row's weight must be a finite "
                        "number >= 0: fix or drop those rows")
    elif summary.weight and summary.rows and summary.weight_sum == 0:
        problems.append(f"weight column {summary.weight!r} is 0 on every row, so no row counts in the loss or the "
                        "metrics — give the rows that matter a weight > 0, or remove `weight:` from schema.yaml")
    if problems:
        raise DataError(f"Dataset {where} ({summary.rows:,} rows): " + "; ".join(problems) + ".",
                        category="invalid_values")


def check_ids(stats: "DatasetStats", schema: "DatasetSchema", policy: str = "error") -> None:
    """Applies ``data.id_policy`` to the out-of-range ids that ``stats`` counted.

    ``"error"`` raises :class:`DataError` naming every offending column, how many
    values and example values; ``"hash"`` (id mod num_embeddings) and ``"clip"``
    (to ``[0, num_embeddings - 1]``) log a warning, since the batch conversion
    remaps those ids.
    """
    if policy not in ID_POLICIES:
        raise DataError(f"Unknown id policy {policy!r}; data.id_policy must be one of {ID_POLICIES}.")
    bad = []
    for feat in schema.sparse:
        t = stats.tables.get(feat.name)
        if t is None:
            raise DataError(
                f"stats.json has no entry for sparse column {feat.name!r}; it was computed for another dataset. "
                "Recompute it with `rayemb stats --data DIR --out stats.json`."
            )
        if t.invalid and feat.ids != "raw":  # any int64 is a raw id (statistics of raw tables count none invalid)
            bad.append(
                f"column {feat.name!r}: {t.invalid:,} of {t.values:,} ids outside [0, {feat.num_embeddings}) "
                f"(e.g. {list(t.invalid_examples)}, observed range [{t.min_id}, {t.max_id}])"
            )
    if not bad:
        return
    if policy == "error":
        raise DataError(
            "Dataset has out-of-range sparse ids: " + "; ".join(bad) + ". Fix num_embeddings in schema.yaml to "
            "cover the ids, or choose a policy: `--set data.id_policy=hash` (id mod num_embeddings) or "
            "`--set data.id_policy=clip` (clamp to the table).",
            category="invalid_ids",
        )
    logger.warning("out-of-range ids will be remapped by id_policy=%s: %s", policy, "; ".join(bad))


def dense_transform_warnings(summary: ValueSummary, schema: "DatasetSchema") -> List[str]:
    """One line per ``log1p`` dense column whose values go below 0 (``log1p`` reads them all as 0: the
    column's sign is lost), naming a transform that keeps it."""
    from rayemb.data.transforms import LOG1P

    out = []
    for c in schema.dense:
        m = summary.dense_moments.get(c)
        if m is not None and m.count and m.min < 0 and schema.dense_transform_of(c).kind == LOG1P:
            out.append(f"dense column {c!r} holds negative values (min {m.min:g}) under log1p, which reads every "
                       f"one as 0; declare `dense_transforms: {{{c}: standardize}}` (or identity, or clip) in "
                       "schema.yaml to keep them")
    return out


def warn_dense_transforms(summary: ValueSummary, schema: "DatasetSchema") -> List[str]:
    """Logs :func:`dense_transform_warnings` (a job goes on: the values are valid, the transform loses them)."""
    lines = dense_transform_warnings(summary, schema)
    for line in lines:
        logger.warning("%s", line)
    return lines
