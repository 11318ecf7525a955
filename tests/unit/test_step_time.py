"""The step-time model and its chooser: components, probed costs, and choices that follow the links' speed."""

import dataclasses

import pytest

from rayemb.planner.step_time import (
    DEFAULT_CALIBRATION,
    Calibration,
    LinkCost,
    StepTimeCostModel,
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
    from rayemb.planner.types import parse_pins

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
    assert probe_kind(Placement.COLUMN_WISE) == "table_wise"
    assert probe_kind(Placement.TABLE_ROW_WISE) == "row_wise"
    assert probe_kind(Placement.HYBRID) == "hybrid"


def test_fully_hot_table_pinned_hybrid_is_data_parallel():
    """A hot set holding every row leaves no cold half to shard: the pin means all rows replicated."""
    from rayemb.planner.cost import BytesCostModel
    from rayemb.planner.types import parse_pins

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
    from rayemb.train.calibrate import combine

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
