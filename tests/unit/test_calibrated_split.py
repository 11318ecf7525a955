"""Across nodes the hot set comes from the calibrated step-time model's break-even, not HugeCTR's formula."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rayemb.data.stats_types import DatasetStats, TableStats
from rayemb.planner.step_time import DEFAULT_CALIBRATION, LinkCost, hot_threshold, predict_step_time
from rayemb.planner.tables import split_rule, tables_from_schema
from rayemb.planner.types import ClusterTopology, Placement

BATCH, DIM = 1024, 16
TWO_NODES = ClusterTopology(num_nodes=2, devices_per_node=1)

# as calibrated on the emulated 2-node cluster at 100 mbit (bench-results/multinode.json): gloo's all-to-all
# moves about half the all-reduce's bytes/s; the probed replicated element holds its all-reduce
MEASURED = dataclasses.replace(
    DEFAULT_CALIBRATION, all_reduce=LinkCost(1.5e-4, 8.5e-8), all_to_all=LinkCost(0.0, 1.64e-7),
    replicated_elem_s=3.44e-7, lookup_s=3.36e-7, pool_s=9.0e-8, dense_lookup_s=1.07e-7,
    source="measured", world_size=2, num_nodes=2,
)


def test_threshold_is_the_break_even_of_a_hot_row_and_a_cold_occurrence():
    q = 0.5
    hot_row = DIM * 3.44e-7
    cold = (q * (8 + 2 * DIM * 4) * 1.64e-7 + (3.36e-7 + 9.0e-8 - 1.07e-7)) / 2
    assert hot_threshold(MEASURED, 2, DIM) == pytest.approx(hot_row / cold)
    assert 0.9 < hot_threshold(MEASURED, 2, DIM) < 1.0  # vs HugeCTR's 4 for two nodes
    assert hot_threshold(MEASURED, 1, DIM) == math.inf  # one rank exchanges nothing


def test_a_replicated_row_costs_at_least_its_all_reduce():
    # a probe that measured ~0 (noise) must not make every id seen hot
    noisy = dataclasses.replace(MEASURED, replicated_elem_s=0.0)
    floor = DIM * 2 * 0.5 * 4 * 8.5e-8
    cold = (0.5 * (8 + 2 * DIM * 4) * 1.64e-7 + (3.36e-7 + 9.0e-8 - 1.07e-7)) / 2
    assert hot_threshold(noisy, 2, DIM) == pytest.approx(floor / cold)


def _stats(rows: int = 100_000) -> DatasetStats:
    # a Zipf-like table: id i seen ~ rows * 0.1 / (i + 1) ** 1.1 times
    counts = np.maximum((rows * 0.1 / np.arange(1, 4001) ** 1.1).astype(int), 1)
    hh = [[i, int(c)] for i, c in enumerate(counts)]
    return DatasetStats(rows=rows, tables={"C1": TableStats(num_embeddings=50_000, values=rows, heavy_hitters=hh,
                                                            error_bound=0)})


def test_split_rule_uses_the_calibrated_threshold_only_across_nodes_and_when_measured():
    stats = _stats()
    calibrated = split_rule(TWO_NODES, BATCH, DIM, calibration=MEASURED)
    assert calibrated.threshold() == pytest.approx(hot_threshold(MEASURED, 2, DIM))
    assert calibrated.split(stats).rule == "calibrated"
    assert split_rule(TWO_NODES, BATCH, DIM).threshold() == pytest.approx(4.0)  # HugeCTR: N * N / (N - 1)
    assert split_rule(TWO_NODES, BATCH, DIM, calibration=DEFAULT_CALIBRATION).given_threshold is None
    one_node = ClusterTopology(num_nodes=1, devices_per_node=2)
    assert split_rule(one_node, BATCH, DIM, calibration=MEASURED).given_threshold is None
    assert calibrated.split(stats).tables["C1"].num_hot > split_rule(TWO_NODES, BATCH, DIM).split(stats).tables["C1"].num_hot


class _Schema:
    class _F:
        name, num_embeddings, multi_hot = "C1", 50_000, False
    sparse = [_F()]


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_calibrated_hot_set_is_predicted_faster_than_hugectrs_and_than_a_larger_or_smaller_one(scale):
    """The split minimises the model's predicted hybrid step: HugeCTR's hot set and ones off the break-even
    by a factor of two either way all predict a slower step."""
    stats = _stats()

    def predicted(threshold: float) -> float:
        rule = split_rule(TWO_NODES, BATCH, DIM, calibration=MEASURED)
        rule.given_threshold = threshold
        spec = tables_from_schema(_Schema, DIM, stats=stats, split=rule.split(stats))
        return predict_step_time(spec, {"C1": Placement.HYBRID}, TWO_NODES, BATCH, MEASURED).total_s

    best = predicted(hot_threshold(MEASURED, 2, DIM))
    assert best < predicted(4.0)
    assert best < predicted(scale * hot_threshold(MEASURED, 2, DIM))
