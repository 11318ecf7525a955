"""The step-time chooser: placements minimising :func:`~rayemb.planner.step_time.predict_step_time`, memory permitting.

The model (what a plan costs per step) lives in :mod:`rayemb.planner.step_time`;
this module searches the placements :class:`~rayemb.planner.cost.BytesCostModel`
allows for the plan it predicts fastest. Pure: no torch.

Example::

    >>> from rayemb.planner.step_time import DEFAULT_CALIBRATION
    >>> t = [TableSpec("C1", rows=50_000, dim=16, hot_rows=500, hot_share=0.9)]
    >>> choice = StepTimeCostModel(DEFAULT_CALIBRATION).choose(t, ClusterTopology(1, 2), 1024, {})
    >>> sorted(choice)
    ['C1']
"""

from __future__ import annotations

import logging
from typing import Dict, List, Mapping, Optional, Sequence

from rayemb.planner.compression import StoredCost
from rayemb.planner.cost import BytesCostModel, replicated_bytes_per_rank, stored_row_bytes, table_cost
from rayemb.planner.step_time import Calibration, StepTimePrediction, _group_of, predict_step_time
from rayemb.planner.pins import TablePin
from rayemb.planner.types import ClusterTopology, Cost, Placement, PlacementChooser, TableSpec

logger = logging.getLogger(__name__)


class StepTimeCostModel(PlacementChooser):
    """Chooses placements minimising predicted step time (:func:`predict_step_time`), memory permitting.

    Candidates, memory limits and the replicated-rows budget are those of
    :class:`~rayemb.planner.cost.BytesCostModel` (whose choice is the
    starting point); then a local search moves one table at a time to the
    placement that lowers the predicted step time most, until no move helps.
    Hybrid is therefore chosen only where it is predicted faster. A plan placing
    every table alike (one module group) within ``tie_margin`` of that choice's
    prediction is taken instead (docs/planner.md, "Ties"). Its sharding
    types are final (``placements_are_final``): the torchrec engine places
    their ranks without swapping types by TorchRec's own perf estimate, which
    does not know the calibrated costs (it turned table-wise into column-wise
    at random on gloo, where column-wise is much slower). Transfers are timed at
    ``bytes_model.exchange`` (``train.comm_precision``).
    """

    placements_are_final = True

    def __init__(self, calibration: Calibration, bytes_model: Optional[BytesCostModel] = None,
                 max_passes: int = 8, tie_margin: float = 0.0) -> None:
        self.calibration = calibration
        self.bytes_model = bytes_model or BytesCostModel()
        self.max_passes = max_passes
        #: a plan of fewer module groups within this fraction of the best prediction wins (see choose)
        self.tie_margin = tie_margin
        #: the prediction of the last :meth:`choose`
        self.prediction: Optional[StepTimePrediction] = None

    def choose(self, tables: Sequence[TableSpec], topology: ClusterTopology, global_batch: int,
               pins: Mapping[str, TablePin]) -> Dict[str, Cost]:
        start = self.bytes_model.choose(tables, topology, global_batch, pins)
        # compressed / cached tables keep the bytes model's choice: their placement is already the cheapest that fits
        stored = {n: c for n, c in start.items() if isinstance(c, StoredCost) and not c.option.is_plain}
        cap, w, l = topology.capacity_bytes, topology.world_size, topology.devices_per_node
        budget = self.bytes_model.replicated_fraction * cap
        total_mp = sum(t.rows * stored_row_bytes(t) for t in tables)  # as the bytes model
        options: Dict[str, List[Cost]] = {}
        forced = set()
        for t in tables:
            # a hybrid table whose hot set holds every row is a data-parallel table in another module: skip it
            cs = [c for c in self.bytes_model.candidates(t, topology, global_batch, total_mp / w, pins.get(t.name))
                  if c.fits_in(cap) and not (c.placement == Placement.HYBRID and t.hot_rows >= t.rows)]
            if start[t.name].placement not in [c.placement for c in cs]:
                cs.append(start[t.name])
            options[t.name] = [start[t.name]] if t.name in stored else cs
            if t.name in stored or all(replicated_bytes_per_rank(c, t) > 0 for c in cs):
                forced.add(t.name)  # pinned replicated: the budget yields, as in the bytes model
        by_name = {t.name: t for t in tables}
        choice: Dict[str, Placement] = {n: c.placement for n, c in start.items()}

        def replicated(ch: Mapping[str, Placement]) -> float:
            return sum(replicated_bytes_per_rank(table_cost(by_name[n], p, w, l, global_batch), by_name[n])
                       for n, p in ch.items() if n not in forced)

        def total(ch: Mapping[str, Placement]) -> float:
            return predict_step_time(tables, ch, topology, global_batch, self.calibration, stored,
                                     self.bytes_model.exchange).total_s

        def moves(ch: Mapping[str, Placement]):
            # one table at a time, and every table of one placement at once: a module group's fixed cost is
            # paid once, so moving tables one by one into a group nobody uses yet never looks worth it
            for t in tables:
                for c in options[t.name]:
                    if c.placement != ch[t.name]:
                        yield {**ch, t.name: c.placement}
            for src in set(ch.values()):
                for dst in {c.placement for cs in options.values() for c in cs} - {src}:
                    movable = [n for n, p in ch.items() if p == src and dst in [c.placement for c in options[n]]]
                    if movable:
                        yield {**ch, **{n: dst for n in movable}}

        best = total(choice)
        for _ in range(self.max_passes):
            improved = False
            for trial in list(moves(choice)):
                held = replicated(trial)
                if held > budget and held > replicated(choice):
                    continue
                cost = total(trial)
                if cost < best * (1 - 1e-6):
                    best, choice, improved = cost, trial, True
            if not improved:
                break
        # Ties go to one module group (docs/planner.md, "Ties"): the probes, one kind at a time, miss what mixing costs
        groups = lambda ch: len({g for p in ch.values() for g in _group_of(p)})  # noqa: E731
        kinds = {c.placement for cs in options.values() for c in cs}
        for cost, trial in sorted(((total(t), t) for t in ({n: d for n in choice} for d in kinds if all(
                d in [c.placement for c in options[n]] for n in choice))), key=lambda x: x[0]):
            if groups(trial) < groups(choice) and cost <= best * (1 + self.tie_margin) and not (
                    replicated(trial) > budget and replicated(trial) > replicated(choice)):
                best, choice = cost, trial
                break
        self.prediction = predict_step_time(tables, choice, topology, global_batch, self.calibration, stored,
                                            self.bytes_model.exchange)
        logger.info("step-time model: %.2f ms/step predicted (%s)", 1e3 * best,
                    ", ".join(f"{k} {1e3 * v:.2f}" for k, v in self.prediction.components.items()))
        return {t.name: stored.get(t.name) or table_cost(t, choice[t.name], w, l, global_batch, self.bytes_model.exchange)
                for t in tables}


__all__ = ["StepTimeCostModel"]
