"""Calibration on real gloo ranks: collectives, kernels and probes of real sharded modules give a usable model."""

import pytest

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.timing]

SHAPE = dict(local_batch=256, num_dense=13, num_sparse=8, dim=16, bottom_mlp=[32, 16], top_mlp=[32, 1])


def _rank(rank, world_size):
    import torch
    import torch.distributed as dist

    from rayemb.train.calibration.calibrate import measure_rank

    torch.set_num_threads(1)
    measured = measure_rank(torch.device("cpu"), world_size, {**SHAPE, "prefetch_input_dist": True})  # as jobs step
    parts = [None] * world_size
    dist.all_gather_object(parts, measured["compute"])
    return {"links": measured["links"], "compute": parts}


def test_calibration_on_two_gloo_ranks_prices_plans():
    import json

    from rayemb.planner.chooser import StepTimeCostModel
    from rayemb.planner.step_time import Calibration, predict_step_time
    from rayemb.planner.types import ClusterTopology, Placement, TableSpec
    from rayemb.train.calibration.calibrate import combine
    from rayemb.train.calibration.probes import PROBE_KINDS

    results = run_multiprocess(_rank, 2)
    cal = combine(results, "gloo", 1, seconds=1.0, shape=SHAPE)
    assert cal.source == "measured" and cal.world_size == 2
    # every figure measured and positive where it must be: a step costs time, bytes cost time
    assert cal.all_reduce.seconds_per_byte > 0 and cal.all_to_all.seconds_per_byte > 0
    assert cal.dense_step_s > 0 and cal.lookup_s > 0 and cal.replicated_elem_s > 0
    # the DDP wrapper's hooks and all-reduce round trip cost something, and less than a whole probe step
    assert 0 < cal.ddp_step_s < max(fixed + 8 * per for fixed, per in cal.groups.values())
    assert set(cal.groups) == set(PROBE_KINDS)
    assert all(fixed >= 0 and per >= 0 for fixed, per in cal.groups.values())
    assert any(fixed > 0 for fixed, _ in cal.groups.values())
    assert cal.overlap_fraction is not None and 0.0 <= cal.overlap_fraction <= 1.0  # measured across the ranks
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal

    tables = [TableSpec(f"t{i}", rows=20_000, dim=16, hot_rows=300, hot_share=0.8) for i in range(4)]
    topo = ClusterTopology(1, 2)
    model = StepTimeCostModel(cal)
    choice = model.choose(tables, topo, 512, {})
    chosen = predict_step_time(tables, {n: c.placement for n, c in choice.items()}, topo, 512, cal).total_s
    for p in (Placement.TABLE_WISE, Placement.DATA_PARALLEL, Placement.HYBRID):
        assert chosen <= predict_step_time(tables, {t.name: p for t in tables}, topo, 512, cal).total_s + 1e-12
    # a larger replicated table costs more per step under the measured model
    small = predict_step_time([TableSpec("a", rows=1_000, dim=16)], {"a": Placement.DATA_PARALLEL}, topo, 512, cal)
    large = predict_step_time([TableSpec("a", rows=500_000, dim=16)], {"a": Placement.DATA_PARALLEL}, topo, 512, cal)
    assert large.total_s > small.total_s


def _remeasure(rank, world_size):
    import torch

    from rayemb.planner.step_time import LinkCost
    from rayemb.train.calibration.calibrate import measure_collectives

    torch.set_num_threads(1)
    free = {"all_reduce": LinkCost(1e-3, 0.0), "all_to_all": LinkCost(1e-3, 0.0)}  # bytes free: beta clamped to 0
    return measure_collectives(torch.device("cpu"), world_size, dict(free))


def test_collectives_measured_again_with_a_larger_message_when_bytes_came_out_free():
    links = run_multiprocess(_remeasure, 2)[0]
    # the interleaved set's figures were not kept: every rank measured again, and bytes cost time
    assert links["all_reduce"].seconds_per_byte > 0 and links["all_to_all"].seconds_per_byte > 0
