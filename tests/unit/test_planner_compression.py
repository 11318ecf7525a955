"""Compressed and cached tables in the planner: memory, hit rate, "compress or cache" when a table does not fit."""

from __future__ import annotations

import argparse
import math
import re

import numpy as np
import pytest
import yaml

from rayemb.cli.plan import add_plan_arguments, plan_main
from rayemb.errors import PlanError
from rayemb.planner.compression import (
    CACHE_ROW_MAP_BYTES,
    CACHE_SLOT_BYTES,
    StorageOption,
    StoredCost,
    cache_hit_rate,
    sharded_spec,
    storage_weight_bytes,
    zipf_coverage,
    zipf_exponent,
    zipf_harmonic,
)
from rayemb.planner.cost import BytesCostModel, storage_cost
from rayemb.planner.planner import plan
from rayemb.planner.report import load_plan_json, save_plan_json, summary_table
from rayemb.planner.chooser import StepTimeCostModel
from rayemb.planner.step_time import DEFAULT_CALIBRATION
from rayemb.planner.topology import described_topology
from rayemb.planner.pins import TablePin
from rayemb.planner.types import STORAGE_REMEDIES, Placement, TableSpec

MiB = 2**20
V, E = 1_048_576, 512  # the reference table: 2 GiB of fp32 rows
REF = TableSpec("C1", rows=V, dim=E)
#: 8 GPUs whose 0.25 GiB (217.6 MiB for tables) cannot hold REF even row-wise (256.5 MiB per rank)
SMALL_GPUS = described_topology(8, 8, hbm_gib=0.25)


def _tables(hot_rows=1024, hot_share=0.6):
    return [TableSpec("C1", rows=V, dim=E, hot_rows=hot_rows, hot_share=hot_share), TableSpec("C2", rows=1000, dim=E)]


def test_memory_at_the_reference_size():
    qr = StorageOption(compression="qr").resolved(REF)
    block = StorageOption(compression="block", block_dim=128).resolved(REF)
    assert qr.buckets == 1024
    assert storage_weight_bytes(REF, StorageOption()) == 2048 * MiB
    assert sharded_spec(REF, block).weight_bytes == 512 * MiB  # + the 128 x 512 projection (256 KiB)
    assert storage_weight_bytes(REF, block) == 512 * MiB + 128 * 512 * 4
    assert storage_weight_bytes(REF, qr) == 4 * MiB <= 8 * MiB  # (1024 + 1024) rows x 512 x 4 B
    concat = StorageOption(compression="qr", combine="concat").resolved(REF)
    assert storage_weight_bytes(REF, concat) == 2 * MiB  # each half D/2 wide
    odd = StorageOption(compression="qr", buckets=1000).resolved(REF)
    assert sharded_spec(REF, odd).rows == math.ceil(V / 1000) + 1000
    # with row-wise Adagrad state (4 B per row), placed table-wise: what a rank holds
    topo = described_topology(8, 8, hbm_gib=80)
    assert storage_cost(REF, qr, Placement.TABLE_WISE, topo, 8192).max_shard_bytes == 2048 * (512 * 4 + 4)
    bl = storage_cost(REF, block, Placement.ROW_WISE, topo, 8192)
    assert bl.max_shard_bytes == V // 8 * (128 * 4 + 4) and bl.extra_bytes_per_rank == 128 * 512 * 8
    # a block table's bags cross the wire E_b wide: 4x fewer pooled bytes than plain table-wise
    plain_tw = storage_cost(REF, StorageOption(), Placement.TABLE_WISE, topo, 8192).bytes_per_step
    block_tw = storage_cost(REF, block, Placement.TABLE_WISE, topo, 8192).bytes_per_step
    assert block_tw < 0.5 * plain_tw


def test_cached_table_splits_device_and_host_memory():
    lf, rows_per_rank = 0.1, V // 8
    cuda = described_topology(8, 8, hbm_gib=80, ddr_gib=64)
    c = storage_cost(REF, StorageOption(kernel="cached", cache_load_factor=lf), Placement.ROW_WISE, cuda, 8192)
    assert c.max_host_shard_bytes == rows_per_rank * (E * 4 + 4)  # weights + row-wise Adagrad state, on the host
    assert c.host_memory_bytes == V * (E * 4 + 4)
    slots = math.ceil(lf * rows_per_rank)
    assert c.max_shard_bytes == slots * (E * 4 + CACHE_SLOT_BYTES) + rows_per_rank * CACHE_ROW_MAP_BYTES
    assert c.max_shard_bytes < 0.12 * c.max_host_shard_bytes
    # misses: no stats -> uniform ids -> hit rate = load factor; each miss moves a row in and one out
    assert c.hit_rate == pytest.approx(lf, rel=1e-3)
    assert c.host_bytes_per_step == pytest.approx(2 * (1 - c.hit_rate) * 8192 * E * 4)
    # a CPU cluster has no host tier behind its memory: the host table is device memory too
    cpu = described_topology(8, 8, compute_device="cpu", ddr_gib=64)
    c_cpu = storage_cost(REF, StorageOption(kernel="cached", cache_load_factor=lf), Placement.ROW_WISE, cpu, 8192)
    assert c_cpu.max_host_shard_bytes == 0 and c_cpu.max_shard_bytes == c.max_shard_bytes + c.max_host_shard_bytes


def test_hit_rate_follows_a_zipf_frequency_curve():
    n, alpha = 200_000, 1.1
    exact = np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** -alpha)
    assert zipf_harmonic(n, alpha) == pytest.approx(exact[-1], rel=1e-6)
    assert zipf_coverage(5000, n, alpha) == pytest.approx(exact[4999] / exact[-1], rel=1e-6)
    # the split's hot set is one point of the curve: the fit recovers the exponent
    share = float(exact[999] / exact[-1])
    t = TableSpec("t", rows=n, dim=16, hot_rows=1000, hot_share=share)
    assert zipf_exponent(1000, share, n) == pytest.approx(alpha, abs=1e-3)
    rates = [cache_hit_rate(t, lf) for lf in (0.001, 0.01, 0.05, 0.2, 0.5, 1.0)]
    assert all(a < b for a, b in zip(rates, rates[1:])) and rates[-1] == 1.0
    assert rates[2] == pytest.approx(exact[int(0.05 * n) - 1] / exact[-1], rel=1e-4)
    assert rates[0] > 0.5  # skewed ids: 0.1 % of the rows serve most lookups
    # no statistics: uniform ids, hit rate = load factor
    assert cache_hit_rate(TableSpec("u", rows=n, dim=16), 0.2) == pytest.approx(0.2)


def test_what_if_plan_caches_the_table_that_does_not_fit_and_says_why(tmp_path):
    r = plan(_tables(), SMALL_GPUS, 8192)  # engine auto: "fast" once a table is cached
    c1 = r.tables["C1"]
    assert r.engine == "fast" and r.all_fit()
    assert c1.storage["kernel"] == "cached" and c1.compute_kernel == "fused_uvm_caching"
    assert c1.storage["max_device_bytes_per_rank"] <= SMALL_GPUS.capacity_bytes
    assert c1.storage["cache_load_factor"] == 0.2 and 0.2 < c1.storage["predicted_hit_rate"] < 1.0
    assert c1.storage["max_host_bytes_per_rank"] == math.ceil(V / 8) * (E * 4 + 4)
    reason = c1.storage["reason"]
    assert reason.startswith("C1: 256.5 MiB per rank even row_wise > 217.6 MiB table capacity")
    assert "cached (load factor 0.2) row_wise needs" in reason and "hit rate" in reason
    assert r.tables["C2"].storage is None  # tables that fit stay plain
    path = save_plan_json(r, str(tmp_path / "plan.json"))
    back = load_plan_json(path)
    assert back == r.__class__.from_json(r.to_json()) and back.tables["C1"].storage == c1.storage
    printed = summary_table(back)
    assert "cached load factor 0.2" in printed and reason in printed


def test_a_smaller_cache_when_the_default_does_not_fit():
    tight = described_topology(8, 8, hbm_gib=0.05)  # 43.5 MiB per rank: a 0.2 cache (52 MiB) does not fit
    r = plan(_tables(), tight, 8192)
    s = r.tables["C1"].storage
    assert s["kernel"] == "cached" and s["cache_load_factor"] == 0.1  # 26.3 MiB per rank
    assert "(tried first: cached (load factor 0.2) needs 52.1 MiB device" in s["reason"]


def test_without_a_host_tier_it_compresses():
    cpu = described_topology(2, 2, compute_device="cpu", ddr_gib=1.0)  # 870 MiB per rank, C1 needs 1 GiB
    r = plan(_tables(), cpu, 1024)
    s = r.tables["C1"].storage
    assert s["compression"] == "block" and s["block_dim"] == 128 and s["kernel"] == "fused"
    assert "no host tier" in s["reason"] and r.all_fit()
    tiny = described_topology(2, 2, compute_device="cpu", ddr_gib=0.05)  # block E_b=32 (66 MiB per rank) does not fit
    s = plan(_tables(), tiny, 1024).tables["C1"].storage
    assert s["compression"] == "qr" and s["buckets"] == 1024
    assert "block (E_b=32) needs" in s["reason"]
    assert r.tables["C1"].memory_bytes < 600 * MiB


def test_pins_are_respected():
    topo = described_topology(8, 8, hbm_gib=80)
    pins = {"C1": {"compression": "qr", "buckets": 512, "combine": "concat"},
            "C2": {"kernel": "cached", "cache_load_factor": 0.5, "sharding": "row_wise"}}
    r = plan(_tables(), topo, 8192, pins=pins)  # both fit plainly; the pins still win
    assert r.tables["C1"].storage["compression"] == "qr" and r.tables["C1"].storage["buckets"] == 512
    assert r.tables["C1"].storage["reason"].startswith("pinned qr (m=512, concat)")
    assert r.tables["C2"].placement == Placement.ROW_WISE and r.tables["C2"].storage["cache_load_factor"] == 0.5
    # TorchRec's kernel name pins a cache too
    uvm = plan(_tables(), topo, 8192, pins={"C1": {"compute_kernel": "fused_uvm_caching"}})
    assert uvm.tables["C1"].storage["kernel"] == "cached"
    # a pin that does not fit is an error, not a silent change
    with pytest.raises(PlanError) as e:
        plan(_tables(), SMALL_GPUS, 8192, pins={"C1": {"compression": "block", "block_dim": 512, "sharding": "table_wise"}})
    assert e.value.category == "insufficient_storage"
    for bad in ({"compression": "zip"}, {"compression": "qr", "sharding": "row_wise"}, {"kernel": "cached",
                "cache_load_factor": 0}, {"compression": "block", "block_dim": 1024}, {"kernel": "cached", "hybrid": True},
                {"compression": "qr", "kernel": "cached"}):
        with pytest.raises(PlanError) as e:
            plan(_tables(), topo, 8192, pins={"C1": bad})
        assert e.value.category == "invalid_pin", bad
    # the training job's engine (TorchRec's planner) gets FBGEMM's caching kernel for a cached table on CUDA
    tr = plan(_tables(), topo, 8192, pins={"C2": {"kernel": "cached", "sharding": "row_wise"}}, engine="torchrec")
    assert tr.tables["C2"].compute_kernel == "fused_uvm_caching"
    kernels = {name: ps.compute_kernel for mp in tr.sharding_plan.plan.values() for name, ps in mp.items()}
    assert kernels.pop("C2") == "fused_uvm_caching" and "fused_uvm_caching" not in kernels.values(), kernels


def test_a_cached_pin_is_plain_on_cpu_ranks(caplog):
    """A GPU job config runs on CPU: the whole table is in host memory there, so the kernel is the fused one."""
    cpu = described_topology(2, 2, hbm_gib=16, compute_device="cpu")
    for pin in ({"kernel": "cached", "cache_load_factor": 0.5}, {"compute_kernel": "fused_uvm_caching"}):
        with caplog.at_level("WARNING", logger="rayemb.planner.planner"):
            r = plan(_tables(), cpu, 8192, pins={"C2": pin}, engine="fast")
        assert r.tables["C2"].storage is None and r.tables["C2"].compute_kernel in ("fused", "dense"), pin
        assert "cached kernel needs a device with host memory" in caplog.text
        caplog.clear()


def test_storage_error_advice_works_when_followed():
    with pytest.raises(PlanError) as e:
        plan(_tables(), SMALL_GPUS, 8192, pins={"C1": {"sharding": "table_wise"}})
    assert e.value.category == "insufficient_storage"
    advised = yaml.safe_load(re.search(r"pin `([^`]+)`", str(e.value)).group(1))
    assert advised["C1"]["sharding"] == "table_wise"
    r = plan(_tables(), SMALL_GPUS, 8192, pins=advised)
    assert r.tables["C1"].placement == Placement.TABLE_WISE and r.all_fit()
    # every pin the general remedies name works too (a rank holds 217.6 MiB; the plain table needs 256.5 MiB)
    named = re.findall(r"\{[^}]*\}", STORAGE_REMEDIES)
    assert len(named) == 3
    for text in named:
        pin = yaml.safe_load(text.replace("<dim/4>", str(E // 4)))
        r = plan(_tables(), SMALL_GPUS, 8192, pins={"C1": pin})
        assert r.all_fit() and r.tables["C1"].storage["reason"].startswith("pinned"), pin
    with pytest.raises(PlanError) as e:
        plan(_tables(), SMALL_GPUS, 8192, pins={"C1": {"compression": "none"}})
    assert e.value.category == "insufficient_storage"


def test_step_time_model_prices_compressed_tables():
    chooser = StepTimeCostModel(DEFAULT_CALIBRATION)
    cpu = described_topology(2, 2, compute_device="cpu", ddr_gib=1.0)
    choice = chooser.choose(_tables(), cpu, 1024, {})
    assert isinstance(choice["C1"], StoredCost) and choice["C1"].option.compression == "block"
    assert chooser.prediction.components["storage"] > 0
    assert chooser.prediction.total_s == pytest.approx(sum(chooser.prediction.components.values()))
    # QR looks up two rows per id (512 ids per rank here), then moves its pooled bags like any table
    pin = {"C1": TablePin.from_dict("C1", {"compression": "qr", "sharding": "table_wise"})}
    qr = chooser.choose(_tables(), cpu, 1024, pin)["C1"]
    transfer = DEFAULT_CALIBRATION.all_to_all.time(qr.bytes_per_step / 2, calls=0)
    assert chooser.prediction.per_table_s["C1"] == pytest.approx(2 * 512 * DEFAULT_CALIBRATION.lookup_s + transfer)
    bytes_choice = BytesCostModel().choose(_tables(), SMALL_GPUS, 8192, {})
    assert bytes_choice["C1"].option.kernel == "cached"


def test_rayemb_plan_cli_shows_the_choice(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    schema = {"schema_version": 1, "label": "label", "dense": ["I1"],
              "sparse": [{"name": "C1", "num_embeddings": 4_000_000, "multi_hot": False},
                         {"name": "C2", "num_embeddings": 1000, "multi_hot": False}]}
    (data / "schema.yaml").write_text(yaml.safe_dump(schema))
    cfg = {"name": "t", "data": {"path": str(data), "batch_size": 256},
           "model": {"embedding_dim": 64, "bottom_mlp": [64], "top_mlp": [8, 1]}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "plan.json"
    args = add_plan_arguments(argparse.ArgumentParser()).parse_args(
        ["--config", str(tmp_path / "job.yaml"), "--world-size", "8", "--gpus-per-node", "8", "--hbm-gib", "0.1",
         "--out", str(out)])
    assert plan_main(args) == 0
    s = load_plan_json(str(out)).tables["C1"].storage
    assert s["kernel"] == "cached" and "table capacity" in s["reason"]
    printed = capsys.readouterr().out
    assert "compressed or cached tables" in printed and s["reason"] in printed


def test_a_plan_too_big_in_total_stores_its_largest_free_table_until_it_fits():
    """Criteo-1TB tables (dim 128) on 8 x 16 GiB: each table fits a rank, all of them do not."""
    from rayemb.constants import CRITEO_1TB_CARDINALITIES

    tables = [TableSpec(f"C{i + 1}", rows=int(v), dim=128) for i, v in enumerate(CRITEO_1TB_CARDINALITIES)]
    topo = described_topology(8, 8, hbm_gib=16)
    r = plan(tables, topo, 65536, engine="fast")
    assert all(u.fits() for u in r.ranks)
    stored = {n: t.storage for n, t in r.tables.items() if t.storage}
    assert stored, "some table must be cached or compressed"
    for name, s in stored.items():
        assert s["reason"].startswith("the plan did not fit plainly") and name in s["reason"], s
    # the largest tables go first: nothing smaller than a stored table stays plain while a larger one is free
    smallest_stored = min(t.rows for t in tables if t.name in stored)
    assert all(t.name in stored or t.rows <= smallest_stored for t in tables if t.rows > smallest_stored)
    # pins that forbid storing every table leave the error, which names the remedies
    with pytest.raises(PlanError) as e:
        plan(tables, topo, 65536, engine="fast", pins={t.name: {"compression": "none"} for t in tables})
    assert e.value.category == "insufficient_storage" and "does not fit" in str(e.value) and "more devices" in str(e.value)
