"""``train.comm_precision``: validated at load, counted by the planner at its wire size, keyed in calibrations.

A bad direction or value stops the job at config load with a ConfigError naming the key and the allowed values.
The planner counts the bytes a 16-bit exchange really sends: the pooled rows forward and their gradients
backward each at their direction's element size (half at bf16), the all-reduced gradients of replicated rows
at the backward's, the ids and lengths as they were. A kept calibration or plan probe measured at one precision
is not reused at another.
"""

from __future__ import annotations

import pytest

from rayemb.config import load_config
from rayemb.errors import ConfigError
from rayemb.planner import ClusterTopology, TableSpec, plan
from rayemb.planner.cost import FP32_EXCHANGE, ExchangeBytes, table_bytes
from rayemb.planner.types import Placement

CONFIG = "jobs/configs/synth_small.yaml"
BF16 = ExchangeBytes.of({"forward": "bf16", "backward": "bf16"})
W, B, D = 8, 4096, 64


def test_default_is_fp32_both_ways_and_a_direction_left_out_is_fp32():
    assert load_config(CONFIG).train.comm_precision == {"forward": "fp32", "backward": "fp32"}
    cfg = load_config(CONFIG, ["train.comm_precision={backward: fp16}"])
    assert cfg.train.comm_precision == {"forward": "fp32", "backward": "fp16"}
    assert load_config(CONFIG, ["train.comm_precision.forward=bf16"]).train.comm_precision["forward"] == "bf16"


@pytest.mark.parametrize("override, names", [
    ("train.comm_precision.forward=bf8", ["train.comm_precision.forward", "'bf8'", "fp32", "bf16", "fp16"]),
    ("train.comm_precision.backward=int8", ["train.comm_precision.backward", "'int8'", "fp32", "bf16", "fp16"]),
    ("train.comm_precision.sideways=bf16", ["train.comm_precision", "sideways", "forward", "backward"]),
    ("train.comm_precision=bf16", ["train.comm_precision", "mapping"]),
])
def test_a_bad_value_is_a_config_error_naming_the_key_and_the_allowed_values(override, names):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIG, [override])
    for name in names:
        assert name in str(e.value), (name, str(e.value))


def _pooled_fp32(placement: Placement) -> float:
    """fp32 bytes of the pooled rows (forward) and their gradients (backward) of one table, summed over ranks."""
    if placement == Placement.TABLE_WISE:
        return 2.0 * (W - 1) / W * B * D * 4
    return 2.0 * (W - 1) * B * D * 4  # row-wise: reduce-scatter forward, all-gather backward


@pytest.mark.parametrize("placement", [Placement.TABLE_WISE, Placement.ROW_WISE])
def test_the_planner_counts_half_the_pooled_bytes_at_bf16(placement):
    t = TableSpec("t", rows=10**6, dim=D, pooling_factor=3.0)
    full, half = (table_bytes(t, placement, W, W, B, x) for x in (FP32_EXCHANGE, BF16))
    pooled = _pooled_fp32(placement)
    assert full - half == pytest.approx(pooled / 2, rel=1e-12)
    assert half > pooled / 2  # the ids and lengths stay integers
    forward_only = table_bytes(t, placement, W, W, B, ExchangeBytes.of({"forward": "bf16"}))
    assert full - forward_only == pytest.approx(pooled / 4, rel=1e-12)


def test_replicated_rows_all_reduce_at_the_backwards_size():
    t = TableSpec("t", rows=1000, dim=D)
    full = table_bytes(t, Placement.DATA_PARALLEL, W, W, B)
    assert full == 2.0 * (W - 1) * 1000 * D * 4
    assert table_bytes(t, Placement.DATA_PARALLEL, W, W, B, BF16) == full / 2
    assert table_bytes(t, Placement.DATA_PARALLEL, W, W, B, ExchangeBytes.of({"forward": "bf16"})) == full


def test_a_plan_at_bf16_reports_the_bytes_sent():
    tables = [TableSpec("big", rows=10**6, dim=D, pooling_factor=2.0), TableSpec("small", rows=500, dim=D)]
    topo = ClusterTopology(num_nodes=1, devices_per_node=W)
    full = plan(tables, topo, B, engine="fast")
    half = plan(tables, topo, B, engine="fast", exchange=BF16)
    for name, tp in full.tables.items():
        assert half.tables[name].placement == tp.placement
        expected = table_bytes(tables[0] if name == "big" else tables[1], tp.placement, W, W, B, BF16)
        assert half.tables[name].predicted_bytes_per_step == pytest.approx(expected)
        assert half.tables[name].predicted_bytes_per_step < tp.predicted_bytes_per_step


def test_the_calibration_key_holds_the_comm_precision():
    from rayemb.train.calibration.store import cache_key, key_fields, step_numerics

    keys = {cache_key(key_fields(step_numerics(load_config(CONFIG, o)), {"world": 2}, []))
            for o in ([], ["train.comm_precision.forward=bf16"], ["train.comm_precision.backward=bf16"])}
    assert len(keys) == 3
    # fp32 exchanges are the key measurements kept before the field existed had
    assert "comm_precision" not in step_numerics(load_config(CONFIG, []))


def test_the_step_time_model_times_the_bytes_sent():
    from rayemb.planner.chooser import StepTimeCostModel
    from rayemb.planner.cost import BytesCostModel
    from rayemb.planner.step_time import DEFAULT_CALIBRATION, predict_step_time

    tables = [TableSpec("big", rows=10**6, dim=D, pooling_factor=2.0)]
    topo = ClusterTopology(num_nodes=2, devices_per_node=W // 2)
    placed = {"big": Placement.TABLE_WISE}
    full = predict_step_time(tables, placed, topo, B, DEFAULT_CALIBRATION)
    half = predict_step_time(tables, placed, topo, B, DEFAULT_CALIBRATION, exchange=BF16)
    assert 0 < half.components["transfer"] < full.components["transfer"]
    chooser = StepTimeCostModel(DEFAULT_CALIBRATION, BytesCostModel(exchange=BF16))
    chosen = chooser.choose(tables, topo, B, {})["big"]
    assert chosen.bytes_per_step == table_bytes(tables[0], chosen.placement, W, W // 2, B, BF16)
    assert chooser.prediction.components["transfer"] == pytest.approx(
        predict_step_time(tables, {"big": chosen.placement}, topo, B, DEFAULT_CALIBRATION,
                          exchange=BF16).components["transfer"])


def test_the_planner_and_the_exchanges_agree_on_the_element_sizes():
    from rayemb.config import CHOICES
    from rayemb.embedding.qcomm import ELEMENT_BYTES

    assert ExchangeBytes.SIZES == ELEMENT_BYTES
    assert tuple(ELEMENT_BYTES) == CHOICES["train.comm_precision"]
