"""Typed dataset statistics: the values of ``stats.json`` (schema_version 1, docs/stats.md).

:func:`rayemb.data.stats.compute_stats` returns a :class:`DatasetStats`; the
split rule, the planner and the driver read its attributes. ``to_dict`` writes
exactly the stats.json format and ``from_dict`` reads it back (fields a hand-made
or older file lacks take their defaults), so ``from_dict(d).to_dict() == d`` for
every file ``rayemb stats`` writes.

Example::

    >>> stats = load_stats_json("stats.json")
    >>> stats.rows, stats.tables["C1"].heavy_hitters[:2]   # (n, 2) int64: [id, count], count descending
    (9900000, array([[ 31337, 951022], [  4117, 443918]]))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from rayemb.data.checks import ValueSummary

STATS_SCHEMA_VERSION = 1


def _pairs(heavy_hitters: Any) -> np.ndarray:
    """``[[id, count], ...]`` (or an array of that shape) as a read-only (n, 2) int64 array."""
    arr = np.array(heavy_hitters, dtype=np.int64).reshape(-1, 2)
    arr.setflags(write=False)
    return arr


def _optional_int(x: Any) -> Optional[int]:
    return None if x is None else int(x)


@dataclass(frozen=True, eq=False)
class TableStats:
    """Statistics of one sparse table (one entry of stats.json's ``tables``; fields as in docs/stats.md).

    ``heavy_hitters`` is a read-only (n, 2) int64 array of ``[id, count]`` rows
    (the constructor also takes a list of pairs), count descending then id
    ascending; a listed id's true count lies in ``[count, count + error_bound]``. ``pooling_mean``/``pooling_max`` are
    stats.json's ``pooling_factor.mean``/``.max``.
    """

    num_embeddings: int = 0
    rows: int = 0
    values: int = 0
    distinct: int = 0
    distinct_exact: bool = True
    invalid: int = 0
    invalid_examples: Tuple[int, ...] = ()
    nulls: int = 0
    min_id: Optional[int] = None
    max_id: Optional[int] = None
    pooling_mean: float = 1.0
    pooling_max: int = 1
    heavy_hitters: np.ndarray = field(default_factory=lambda: _pairs([]))
    error_bound: int = 0
    #: ``raw`` for a raw-id table (its ids any int64, heavy hitters raw ids, no hot set), else ``encoded``
    ids: str = "encoded"

    def __post_init__(self) -> None:
        object.__setattr__(self, "heavy_hitters", _pairs(self.heavy_hitters))
        object.__setattr__(self, "invalid_examples", tuple(int(x) for x in self.invalid_examples))

    def to_dict(self) -> Dict[str, Any]:
        return {
            "num_embeddings": int(self.num_embeddings),
            "rows": int(self.rows),
            "values": int(self.values),
            "distinct": int(self.distinct),
            "distinct_exact": bool(self.distinct_exact),
            "invalid": int(self.invalid),
            "invalid_examples": list(self.invalid_examples),
            "nulls": int(self.nulls),
            "min_id": self.min_id,
            "max_id": self.max_id,
            "pooling_factor": {"mean": float(self.pooling_mean), "max": int(self.pooling_max)},
            "heavy_hitters": self.heavy_hitters.tolist(),
            "error_bound": int(self.error_bound),
            # written for raw-id tables only: stats.json of encoded tables reads as it always did
            **({"ids": self.ids} if self.ids != "encoded" else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TableStats":
        pf = d.get("pooling_factor", {})
        if not isinstance(pf, Mapping):  # a bare number: the mean
            pf = {"mean": pf}
        return cls(
            num_embeddings=int(d.get("num_embeddings", 0)),
            rows=int(d.get("rows", 0)),
            values=int(d.get("values", 0)),
            distinct=int(d.get("distinct", 0)),
            distinct_exact=bool(d.get("distinct_exact", True)),
            invalid=int(d.get("invalid", 0)),
            invalid_examples=tuple(d.get("invalid_examples", ())),
            nulls=int(d.get("nulls", 0)),
            min_id=_optional_int(d.get("min_id")),
            max_id=_optional_int(d.get("max_id")),
            pooling_mean=float(pf.get("mean", 1.0)),
            pooling_max=int(pf.get("max", 1)),
            heavy_hitters=_pairs(d.get("heavy_hitters", [])),
            error_bound=int(d.get("error_bound", 0)),
            ids=str(d.get("ids", "encoded")),
        )


@dataclass(frozen=True, eq=False)
class DatasetStats:
    """Statistics of one split of a dataset: what ``rayemb stats`` writes to stats.json.

    ``values`` holds the label and dense value checks (:mod:`rayemb.data.checks`);
    None for a stats.json written by an older rayemb, which a job then recomputes.
    ``num_heavy_hitters`` is the Misra–Gries capacity k (None in exact mode).
    """

    rows: int = 0
    fingerprint: Optional[str] = None
    data_dir: Optional[str] = None
    split: Optional[str] = None
    exact: bool = False
    num_heavy_hitters: Optional[int] = None
    elapsed_s: float = 0.0
    values: Optional[ValueSummary] = None
    tables: Dict[str, TableStats] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        """The stats.json dict (keys in the file's order)."""
        out: Dict[str, Any] = {
            "schema_version": STATS_SCHEMA_VERSION,
            "rows": int(self.rows),
            "fingerprint": self.fingerprint,
            "data_dir": self.data_dir,
            "split": self.split,
            "exact": bool(self.exact),
            "num_heavy_hitters": _optional_int(self.num_heavy_hitters),
            "elapsed_s": float(self.elapsed_s),
        }
        if self.values is not None:
            out["values"] = self.values.to_dict()
        out["tables"] = {name: t.to_dict() for name, t in self.tables.items()}
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DatasetStats":
        return cls(
            rows=int(d.get("rows", 0)),
            fingerprint=d.get("fingerprint"),
            data_dir=d.get("data_dir"),
            split=d.get("split"),
            exact=bool(d.get("exact", False)),
            num_heavy_hitters=_optional_int(d.get("num_heavy_hitters")),
            elapsed_s=float(d.get("elapsed_s", 0.0)),
            values=ValueSummary.from_dict(d["values"]) if d.get("values") is not None else None,
            tables={name: TableStats.from_dict(t) for name, t in d.get("tables", {}).items()},
        )


__all__ = ["DatasetStats", "TableStats", "STATS_SCHEMA_VERSION"]
