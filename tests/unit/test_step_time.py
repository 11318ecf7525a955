"""The step-time model and its chooser: components, probed costs, and choices that follow the links' speed."""

import dataclasses

import pytest

from rayemb.planner.chooser import StepTimeCostModel
from rayemb.planner.step_time import (
    DEFAULT_CALIBRATION,
    Calibration,
    LinkCost,
    predict_step_time,
    probe_kind,
)
from rayemb.planner.types import ClusterTopology, Placement, TableSpec

TOPO = ClusterTopology(num_nodes=1, devices_per_node=2)
BATCH = 1024


def _tables():
    # one small table (data-parallel material) and two skewed large ones (hybrid material)
    return [
        TableSpec("small", rows=100, dim=64),
        TableSpec("big1", rows=200_000, dim=64, hot_rows=100, hot_share=0.9),
        TableSpec("big2", rows=200_000, dim=64, hot_rows=100, hot_share=0.9),
    ]


def _probed(link: LinkCost) -> Calibration:
    """A calibration as measured on a host where the hybrid's extra modules cost more than TW's.

    The probed cost per replicated element holds its gradient's all-reduce on the link (2 ranks: one fp32
    element sent per element and step), as the probe on live links measures it.
    """
    return dataclasses.replace(
        DEFAULT_CALIBRATION, all_reduce=link, all_to_all=link, replicated_elem_s=2e-9 + 4 * link.seconds_per_byte,
        groups={"data_parallel": (0.004, 0.0005), "table_wise": (0.006, 0.0002), "row_wise": (0.008, 0.0002),
                "hybrid": (0.012, 0.0004)},
    )


FAST = LinkCost(latency_s=1e-4, seconds_per_byte=1e-9)  # ~1 GB/s loopback
SLOW = LinkCost(latency_s=5e-4, seconds_per_byte=1 / 6.25e6)  # 50 mbit


def test_components_add_up_and_bytes_cost_time_at_beta():
    tables = _tables()
    placements = {"small": Placement.DATA_PARALLEL, "big1": Placement.TABLE_WISE, "big2": Placement.TABLE_WISE}
    fast = predict_step_time(tables, placements, TOPO, BATCH, _probed(FAST))
    slow = predict_step_time(tables, placements, TOPO, BATCH, _probed(SLOW))
    assert fast.total_s == pytest.approx(sum(fast.components.values()))
    # the same bytes at a 160x slower link: only the transfer term grows, by the ratio of betas
    assert slow.components["transfer"] == pytest.approx(fast.components["transfer"] * SLOW.seconds_per_byte
                                                        / FAST.seconds_per_byte)
    assert slow.components["overhead"] == fast.components["overhead"]
    # probed kinds: one fixed cost per kind present (data_parallel + table_wise), no separate latency term
    assert fast.components["overhead"] == pytest.approx(0.004 + 0.006)
    assert fast.components["latency"] == 0.0


def test_unprobed_model_counts_collective_calls():
    tables = _tables()
    placements = {"small": Placement.DATA_PARALLEL, "big1": Placement.TABLE_WISE, "big2": Placement.TABLE_WISE}
    cal = dataclasses.replace(DEFAULT_CALIBRATION, all_to_all=LinkCost(1e-3, 0.0), all_reduce=LinkCost(1e-3, 0.0))
    pred = predict_step_time(tables, placements, TOPO, BATCH, cal)
    # one replicated bucket (1 all-reduce) + one table-wise group (5 all-to-alls), 1 ms each
    assert pred.components["latency"] == pytest.approx(6e-3)
    assert pred.components["overhead"] == pytest.approx(2 * cal.group_overhead_s)


def test_chooser_avoids_hybrid_on_fast_links_and_picks_it_on_slow_ones():
    tables = _tables()
    fast = StepTimeCostModel(_probed(FAST)).choose(tables, TOPO, BATCH, {})
    slow = StepTimeCostModel(_probed(SLOW)).choose(tables, ClusterTopology(2, 1), BATCH, {})
    assert fast["big1"].placement != Placement.HYBRID and fast["big2"].placement != Placement.HYBRID
    assert slow["big1"].placement == Placement.HYBRID and slow["big2"].placement == Placement.HYBRID


def test_chooser_never_worse_than_the_bytes_choice():
    from rayemb.planner.cost import BytesCostModel

    tables = _tables()
    for link in (FAST, SLOW):
        cal = _probed(link)
        model = StepTimeCostModel(cal)
        mine = {n: c.placement for n, c in model.choose(tables, TOPO, BATCH, {}).items()}
        theirs = {n: c.placement for n, c in BytesCostModel().choose(tables, TOPO, BATCH, {}).items()}
        assert predict_step_time(tables, mine, TOPO, BATCH, cal).total_s <= \
            predict_step_time(tables, theirs, TOPO, BATCH, cal).total_s + 1e-12
        assert model.prediction is not None


def test_pins_are_honoured():
    from rayemb.planner.pins import parse_pins

    tables = _tables()
    pins = parse_pins({"big1": {"sharding": "row_wise"}}, [t.name for t in tables])
    choice = StepTimeCostModel(_probed(SLOW)).choose(tables, TOPO, BATCH, pins)
    assert choice["big1"].placement == Placement.ROW_WISE


def test_fully_hot_table_is_never_hybrid():
    tables = [TableSpec("tiny", rows=50, dim=16, hot_rows=50, hot_share=1.0)]
    choice = StepTimeCostModel(_probed(SLOW)).choose(tables, ClusterTopology(2, 1), BATCH, {})
    assert choice["tiny"].placement != Placement.HYBRID


def test_calibration_round_trips_through_json():
    import json

    cal = _probed(SLOW)
    again = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again == cal


def test_probe_kinds():
    assert probe_kind(Placement.COLUMN_WISE) == "column_wise"
    assert probe_kind(Placement.TABLE_COLUMN_WISE) == "table_wise"
    assert probe_kind(Placement.TABLE_ROW_WISE) == "row_wise"
    assert probe_kind(Placement.HYBRID) == "hybrid"
    # a calibration recorded before column-wise had a probe of its own prices it as table-wise
    assert probe_kind(Placement.COLUMN_WISE, {"table_wise": (0.0, 0.0)}) == "table_wise"
    assert probe_kind(Placement.COLUMN_WISE, {"column_wise": (0.0, 0.0)}) == "column_wise"


def test_column_wise_is_priced_by_its_own_probe():
    """Column-wise steps much slower than table-wise on gloo: with its own probe the model sees it and prefers TW."""
    tables = [TableSpec("big1", rows=200_000, dim=64), TableSpec("big2", rows=200_000, dim=64)]
    cal = _probed(FAST)
    cal = dataclasses.replace(cal, groups={**cal.groups, "column_wise": (0.018, 0.004)})
    cw = predict_step_time(tables, {t.name: Placement.COLUMN_WISE for t in tables}, TOPO, BATCH, cal)
    tw = predict_step_time(tables, {t.name: Placement.TABLE_WISE for t in tables}, TOPO, BATCH, cal)
    assert cw.components["overhead"] == pytest.approx(0.018) and tw.components["overhead"] == pytest.approx(0.006)
    assert cw.total_s > tw.total_s + 0.012
    old = dataclasses.replace(cal, groups={k: v for k, v in cal.groups.items() if k != "column_wise"})
    assert predict_step_time(tables, {t.name: Placement.COLUMN_WISE for t in tables}, TOPO, BATCH,
                             old).components["overhead"] == pytest.approx(0.006)


def test_all_reduce_and_all_to_all_overlap_on_the_wire():
    """DDP's all-reduce runs beside the sharded all-to-alls: their wire time is the longest of each alone and
    of all bytes at the faster family's rate, never their sum when one family is slower per byte."""
    from rayemb.planner.step_time import _overlap

    ar, a2a = LinkCost(0.0, 1e-8), LinkCost(0.0, 2e-8)  # gloo's all-to-all: half the all-reduce's rate
    cal = dataclasses.replace(DEFAULT_CALIBRATION, all_reduce=ar, all_to_all=a2a)
    # 1 MB each: 10 + 20 ms alone, 2 MB at 1e-8 = 20 ms together -> 10 ms saved
    assert _overlap({"all_reduce": 1e6, "all_to_all": 1e6}, cal) == pytest.approx(-0.010)
    # one family alone: nothing to overlap
    assert _overlap({"all_reduce": 0.0, "all_to_all": 1e6}, cal) == 0.0
    # all-reduce dominating: the all-to-all hides behind it only as far as the link has room
    assert _overlap({"all_reduce": 3e6, "all_to_all": 0.5e6}, cal) == pytest.approx(3.5e6 * 1e-8 - (0.03 + 0.01))
    # in a prediction: a data-parallel table (all-reduce) beside table-wise ones (all-to-all), plus the dense sync
    tables = _tables()
    placements = {"small": Placement.DATA_PARALLEL, "big1": Placement.TABLE_WISE, "big2": Placement.TABLE_WISE}
    probed = dataclasses.replace(_probed(FAST), all_reduce=ar, all_to_all=a2a, dense_sync_bytes=4e5)
    pred = predict_step_time(tables, placements, ClusterTopology(2, 1), BATCH, probed)
    assert pred.components["overlap"] < 0.0
    assert pred.total_s == pytest.approx(sum(pred.components.values()))
    no_sync = predict_step_time(tables, placements, ClusterTopology(2, 1), BATCH,
                                dataclasses.replace(probed, dense_sync_bytes=0.0))
    assert pred.components["overlap"] < no_sync.components["overlap"]  # more all-reduce bytes to hide
    one = predict_step_time(tables, placements, ClusterTopology(1, 1), BATCH, probed)
    assert one.components["overlap"] == 0.0


def test_fully_hot_table_pinned_hybrid_is_data_parallel():
    """A hot set holding every row leaves no cold half to shard: the pin means all rows replicated."""
    from rayemb.planner.cost import BytesCostModel
    from rayemb.planner.pins import parse_pins

    tables = [TableSpec("tiny", rows=18, dim=16, hot_rows=18, hot_share=1.0),
              TableSpec("big", rows=100_000, dim=16, hot_rows=100, hot_share=0.8)]
    pins = parse_pins({"tiny": {"hybrid": True}, "big": {"hybrid": True}}, ["tiny", "big"])
    for chooser in (BytesCostModel(), StepTimeCostModel(_probed(FAST))):
        choice = chooser.choose(tables, TOPO, BATCH, pins)
        assert choice["tiny"].placement == Placement.DATA_PARALLEL
        assert choice["big"].placement == Placement.HYBRID


def test_probe_costs_are_normalised_to_compute_and_priced_back_in_full():
    """A probe's cost per table holds its own table's transfer; normalising removes it (never below zero)
    and the prediction adds the real table's transfer back: a probe-like table costs what the probe measured."""
    from rayemb.planner.step_time import normalize_probes

    cal = _probed(SLOW)
    topo = ClusterTopology(2, 1)
    local_batch = BATCH // 2
    like = TableSpec("p", rows=cal.probe_rows, dim=64, pooling_factor=1.0)
    moved = predict_step_time([like], {"p": Placement.TABLE_WISE}, topo, BATCH,
                              dataclasses.replace(cal, groups={})).components["transfer"]
    raw = {"table_wise": (0.006, 0.0002 + moved), "row_wise": (0.008, 0.0)}
    norm = normalize_probes(raw, {"all_reduce": SLOW, "all_to_all": SLOW}, cal.replicated_elem_s, local_batch, 64,
                            2, cal.probe_rows, cal.probe_hot_rows, cal.probe_hot_share)
    assert norm["table_wise"] == pytest.approx((0.006, 0.0002))
    assert norm["row_wise"] == (0.008, 0.0)  # clamped: a probe faster than its own transfer counts as free
    measured = dataclasses.replace(cal, groups=norm)
    pred = predict_step_time([like], {"p": Placement.TABLE_WISE}, topo, BATCH, measured)
    assert pred.per_table_s["p"] == pytest.approx(raw["table_wise"][1])
    multi = TableSpec("p", rows=cal.probe_rows, dim=64, pooling_factor=4.0)
    more = predict_step_time([multi], {"p": Placement.TABLE_WISE}, topo, BATCH, measured)
    assert more.per_table_s["p"] > pred.per_table_s["p"]  # 3 more ids per bag: lookups and id bytes
    assert all(v >= 0 for v in more.components.values())


def test_combine_averages_ranks_and_keeps_rank0_links():
    from rayemb.train.calibration.calibrate import combine

    def rank(scale):
        return {"lookup_s": 1e-7 * scale, "dense_lookup_s": 1e-7, "replicated_elem_s": 1e-9, "pool_s": 1e-8,
                "group_overhead_s": 1e-3, "dense_step_s": 5e-3, "dense_param_bytes": 1e5,
                "groups": {"table_wise": (2e-3 * scale, 1e-4)}}
    links = {"all_reduce": LinkCost(1e-4, 1e-9), "all_to_all": LinkCost(2e-4, 2e-9)}
    from rayemb.planner.step_time import normalize_probes

    shape = {"local_batch": 64, "dim": 8}
    cal = combine([{"links": links, "compute": [rank(1), rank(3)]}, {"links": {}, "compute": []}], "gloo", 2, 3.0,
                  shape)
    expected = normalize_probes({"table_wise": (4e-3, 1e-4)}, links, 1e-9, 64, 8, 2, cal.probe_rows,
                                cal.probe_hot_rows, cal.probe_hot_share)
    assert cal.lookup_s == pytest.approx(2e-7) and cal.groups["table_wise"] == pytest.approx(expected["table_wise"])
    assert cal.groups["table_wise"][0] == pytest.approx(4e-3) and cal.groups["table_wise"][1] < 1e-4
    assert cal.all_to_all == links["all_to_all"] and cal.num_nodes == 2 and cal.world_size == 2
    # the dense arch's gradient all-reduce (one DDP bucket) joins the fixed step cost
    assert cal.dense_step_s == pytest.approx(5e-3 + links["all_reduce"].time(1e5))
    assert cal.dense_sync_bytes == pytest.approx(1e5)  # 2 ranks: each sends its whole buffer once


def test_data_parallel_probes_are_normalised_by_their_own_small_tables():
    """Data-parallel probes use small tables (PROBE_DP_ROWS): only those rows' all-reduce is taken off, so their
    per-table compute survives; an older calibration (no probe_dp_rows) normalises by probe_rows as before."""
    from rayemb.planner.step_time import normalize_probes
    from rayemb.train.calibration.calibrate import combine
    from rayemb.train.calibration.probes import PROBE_DP_ROWS, PROBE_ROWS

    elem = 4e-8  # replicated element cost (its all-reduce included)
    raw = {"data_parallel": (3e-3, 3e-4 + PROBE_DP_ROWS * 16 * elem)}
    links = {"all_reduce": FAST, "all_to_all": FAST}
    norm = normalize_probes(raw, links, elem, 256, 16, 2, PROBE_ROWS, 200, 0.55, PROBE_DP_ROWS)
    assert norm["data_parallel"] == pytest.approx((3e-3, 3e-4))
    old = normalize_probes(raw, links, elem, 256, 16, 2, PROBE_ROWS, 200, 0.55)  # 2,000 rows taken off: clamped
    assert PROBE_DP_ROWS < PROBE_ROWS and old["data_parallel"] == (3e-3, 0.0)
    rank = {"lookup_s": 1e-7, "dense_lookup_s": 1e-7, "replicated_elem_s": elem, "pool_s": 1e-8,
            "group_overhead_s": 1e-3, "dense_step_s": 5e-3, "dense_param_bytes": 1e5, "groups": raw}
    cal = combine([{"links": links, "compute": [rank, rank]}, {"links": {}, "compute": []}], "gloo", 2, 1.0,
                  {"local_batch": 256, "dim": 16})
    assert cal.probe_dp_rows == PROBE_DP_ROWS and cal.groups["data_parallel"] == pytest.approx((3e-3, 3e-4))


def test_one_ddp_wrapper_per_step_however_many_kinds_replicate():
    """The data-parallel and hybrid probes each held a DistributedDataParallel wrapper; a job has one. Measured
    apart (ddp_s), it comes off those two kinds' fixed costs and is priced once per step: a plan with both kinds
    pays it once, not twice, and a plan with neither still pays the dense arch's."""
    from rayemb.planner.step_time import normalize_probes

    ddp = 0.003
    raw = {"data_parallel": (0.004 + ddp, 0.0), "hybrid": (0.009 + ddp, 0.0), "table_wise": (0.002, 0.0)}
    args = ({"all_reduce": SLOW, "all_to_all": SLOW}, 1e-9, BATCH // 2, 64, 2, 2_000, 200, 0.55)
    norm = normalize_probes(raw, *args, ddp_s=ddp)
    expected = {"data_parallel": (0.004, 0.0), "hybrid": (0.009, 0.0), "table_wise": (0.002, 0.0)}
    assert set(norm) == set(expected) and all(norm[k] == pytest.approx(v) for k, v in expected.items())
    assert normalize_probes({"hybrid": (0.001, 0.0)}, *args, ddp_s=ddp)["hybrid"] == (0.0, 0.0)  # clamped
    split = dataclasses.replace(_probed(SLOW), groups=norm, ddp_step_s=ddp)
    old = dataclasses.replace(_probed(SLOW), groups=normalize_probes(raw, *args))  # each probe's wrapper counted
    tables = _tables()
    plans = {
        "both": {"small": Placement.DATA_PARALLEL, "big1": Placement.HYBRID, "big2": Placement.HYBRID},
        "data_parallel": {t.name: Placement.DATA_PARALLEL for t in tables},
        "neither": {t.name: Placement.TABLE_WISE for t in tables},
    }
    delta = {name: predict_step_time(tables, p, TOPO, BATCH, split).total_s
             - predict_step_time(tables, p, TOPO, BATCH, old).total_s for name, p in plans.items()}
    assert delta == pytest.approx({"both": -ddp, "data_parallel": 0.0, "neither": ddp})
    assert predict_step_time(tables, plans["both"], TOPO, BATCH, split).components["ddp"] == ddp
    one_rank = predict_step_time(tables, plans["both"], ClusterTopology(1, 1), BATCH, split)
    assert one_rank.components["ddp"] == 0.0  # one rank: no wrapper
    assert Calibration.from_dict(split.to_dict()) == split
    legacy = split.to_dict()
    del legacy["ddp_step_s"]  # plan.json files from before the field: nothing measured, nothing priced
    assert Calibration.from_dict(legacy).ddp_step_s == 0.0


def test_combine_takes_the_measured_ddp_wrapper_off_the_replicating_probes():
    from rayemb.train.calibration.calibrate import combine

    links = {"all_reduce": LinkCost(1e-4, 1e-9), "all_to_all": LinkCost(2e-4, 2e-9)}
    rank = {"lookup_s": 1e-7, "dense_lookup_s": 1e-7, "replicated_elem_s": 1e-9, "pool_s": 1e-8,
            "group_overhead_s": 1e-3, "dense_step_s": 5e-3, "dense_param_bytes": 1e5,
            "groups": {"data_parallel": (4e-3, 0.0), "table_wise": (2e-3, 0.0)}}
    shape = {"local_batch": 64, "dim": 8}
    without = combine([{"links": links, "compute": [rank, rank]}], "gloo", 2, 1.0, shape)
    ranks = [dict(rank, ddp_step_s=1e-3), dict(rank, ddp_step_s=2e-3)]
    cal = combine([{"links": links, "compute": ranks}], "gloo", 2, 1.0, shape)
    assert without.ddp_step_s == 0.0 and cal.ddp_step_s == pytest.approx(1.5e-3)
    assert cal.groups["data_parallel"][0] == pytest.approx(without.groups["data_parallel"][0] - 1.5e-3)
    assert cal.groups["table_wise"] == without.groups["table_wise"]
    # the dense arch's all-reduce round trip is inside ddp_step_s now: only its bytes stay in the dense step
    assert without.dense_step_s - cal.dense_step_s == pytest.approx(links["all_reduce"].latency_s)


def test_torchrec_engine_keeps_the_step_time_models_sharding_types():
    """The calibrated choice is final: TorchRec's planner places ranks but swaps no table-wise table for
    column-wise (or row-wise) by its own perf estimate -- it did so at random on gloo, where column-wise is much slower."""
    from rayemb.planner import plan
    from rayemb.planner.torchrec_plan import _sharding_types_for

    tables = [TableSpec(f"t{i}", rows=20_000 + 1000 * i, dim=64) for i in range(6)]
    tables += [TableSpec(f"s{i}", rows=50, dim=64) for i in range(4)]
    topo = ClusterTopology(num_nodes=1, devices_per_node=2)
    model = StepTimeCostModel(_probed(FAST))
    chosen = {n: c.placement for n, c in model.choose(tables, topo, BATCH, {}).items()}
    result = plan(tables, topo, BATCH, engine="torchrec", chooser=model)
    assert {n: tp.placement for n, tp in result.tables.items()} == chosen
    assert Placement.TABLE_WISE in chosen.values()
    # without the flag TorchRec may pick among the pooled types around the choice
    assert _sharding_types_for(Placement.TABLE_WISE, None, topo) == ["table_wise", "row_wise", "column_wise"]
    assert _sharding_types_for(Placement.TABLE_WISE, None, topo, exact=True) == ["table_wise"]


def test_a_probed_table_costs_at_least_its_kernels():
    """A probe slope clamped to zero (noise) does not make tables free: the micro-benchmarked kernels are a floor."""
    cal = dataclasses.replace(_probed(FAST), groups={k: (v[0], 0.0) for k, v in _probed(FAST).groups.items()},
                              lookup_s=1e-6, dense_lookup_s=2e-7, pool_s=1e-7)
    local = BATCH // 2
    t = TableSpec("big", rows=200_000, dim=64, hot_rows=100, hot_share=0.75)
    one = ClusterTopology(1, 2)
    for p, per_id in ((Placement.TABLE_WISE, 1e-6), (Placement.DATA_PARALLEL, 2e-7),
                      (Placement.HYBRID, 0.75 * 2e-7 + 0.25 * (1e-6 + 1e-7))):
        pred = predict_step_time([t], {"big": p}, one, BATCH, cal)
        assert pred.components["lookup"] == pytest.approx(local * per_id)


def test_ties_go_to_one_module_group():
    """Within tie_margin of the best mix, the plan placing every table alike wins; beyond it, the mix stays."""
    cal = dataclasses.replace(_probed(FAST), groups={"data_parallel": (0.002, 0.00005), "table_wise": (0.004, 0.0002),
                                                     "row_wise": (0.009, 0.0004), "hybrid": (0.02, 0.001)})
    tables = ([TableSpec(f"s{i}", rows=100, dim=16) for i in range(21)]
              + [TableSpec(f"b{i}", rows=50_000, dim=16) for i in range(5)])

    def chosen(margin):
        model = StepTimeCostModel(cal, tie_margin=margin)
        return {n: c.placement for n, c in model.choose(tables, TOPO, BATCH, {}).items()}, model.prediction.total_s

    mix, t_mix = chosen(0.0)
    assert set(mix.values()) == {Placement.DATA_PARALLEL, Placement.TABLE_WISE}  # the lowest prediction: a mix
    t_tw = predict_step_time(tables, {t.name: Placement.TABLE_WISE for t in tables}, TOPO, BATCH, cal).total_s
    gap = t_tw / t_mix - 1
    assert 0 < gap < 0.2
    assert chosen(gap * 0.9)[0] == mix
    uniform, t = chosen(gap * 1.1)
    assert set(uniform.values()) == {Placement.TABLE_WISE} and t == pytest.approx(t_tw)
