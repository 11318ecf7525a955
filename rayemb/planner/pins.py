"""A user's per-table constraints on the plan: config ``tables: {C1: {sharding: row_wise, hybrid: false}}``.

:func:`parse_pins` checks them against the dataset's tables before any planning;
the chooser (:mod:`rayemb.planner.cost`) keeps to each :class:`TablePin`, and the
storage keys go on to :mod:`rayemb.planner.compression`::

    >>> pins = parse_pins({"C1": {"sharding": "row_wise"}}, ["C1", "C2"])
    >>> pins["C1"].allows(Placement.ROW_WISE), pins["C1"].allows(Placement.HYBRID)
    (True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from rayemb.errors import PlanError
from rayemb.placements import Placement
from rayemb.planner.types import INVALID_PIN

#: pin keys of compressed and cached tables (rayemb.planner.compression)
STORAGE_PIN_KEYS = ("compression", "buckets", "combine", "block_dim", "kernel", "cache_load_factor")


@dataclass(frozen=True)
class TablePin:
    """A user's per-table constraint (config ``tables: {C1: {sharding: row_wise, hybrid: false}}``).

    ``sharding`` forces a placement (any :class:`Placement` value);
    ``hybrid`` False forbids, True requires the hybrid placement;
    ``compute_kernel`` is passed to TorchRec (e.g. ``fused``, ``fused_uvm_caching``); ``storage`` holds
    the :data:`STORAGE_PIN_KEYS` as given (checked by :mod:`rayemb.planner.compression`).
    """

    sharding: Optional[Placement] = None
    hybrid: Optional[bool] = None
    compute_kernel: Optional[str] = None
    storage: Tuple[Tuple[str, Any], ...] = ()

    @classmethod
    def from_dict(cls, table: str, d: Mapping[str, Any]) -> "TablePin":
        known = {"sharding", "hybrid", "compute_kernel", *STORAGE_PIN_KEYS}
        unknown = sorted(set(d) - known)
        if unknown:
            raise PlanError(
                f"Pin for table {table!r} has unknown key(s) {unknown}; known keys are {sorted(known)}, "
                "e.g. {sharding: row_wise, hybrid: false, compute_kernel: fused}.", INVALID_PIN)
        sharding = d.get("sharding")
        if sharding is not None:
            try:
                sharding = Placement(str(sharding))
            except ValueError:
                raise PlanError(
                    f"Pin for table {table!r} asks for sharding {sharding!r}, which is not a placement; "
                    f"use one of {[p.value for p in Placement]}.", INVALID_PIN) from None
        hybrid = d.get("hybrid")
        if hybrid is not None and not isinstance(hybrid, bool):
            raise PlanError(f"Pin for table {table!r}: hybrid must be true or false, got {hybrid!r}.", INVALID_PIN)
        if sharding is not None and hybrid is not None and (sharding == Placement.HYBRID) != hybrid:
            raise PlanError(
                f"Pin for table {table!r} contradicts itself: sharding={sharding.value} with hybrid={hybrid}. "
                "Drop one of the two keys.", INVALID_PIN)
        kernel = d.get("compute_kernel")
        return cls(sharding=sharding, hybrid=hybrid, compute_kernel=None if kernel is None else str(kernel),
                   storage=tuple((k, d[k]) for k in STORAGE_PIN_KEYS if k in d))

    def allows(self, placement: Placement) -> bool:
        if self.sharding is not None:
            return placement == self.sharding
        if self.hybrid is True:
            return placement == Placement.HYBRID
        if self.hybrid is False:
            return placement != Placement.HYBRID
        return True


def parse_pins(pins: Optional[Mapping[str, Any]], table_names: Sequence[str]) -> Dict[str, TablePin]:
    """``{name: TablePin}`` from a plain mapping (config ``tables:`` section); unknown tables are an error."""
    out: Dict[str, TablePin] = {}
    for name, d in (pins or {}).items():
        if name not in table_names:
            raise PlanError(
                f"A pin names table {name!r}, which is not among the dataset's sparse features "
                f"{list(table_names)[:8]}{'...' if len(table_names) > 8 else ''}. Fix the table name.", INVALID_PIN)
        out[name] = d if isinstance(d, TablePin) else TablePin.from_dict(name, d or {})
    return out


__all__ = ["STORAGE_PIN_KEYS", "TablePin", "parse_pins"]
