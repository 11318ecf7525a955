"""plan(): cost choices, pins, errors, plan.json, TorchRec plans, the CLI entry, and scale."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from rayemb.errors import PlanError
from rayemb.planner.cost import BytesCostModel, table_bytes, table_cost
from rayemb.cli.plan import add_plan_arguments, plan_main
from rayemb.planner.planner import plan
from rayemb.planner.report import load_plan_json, save_plan_json, summary_table
from rayemb.planner.tables import criteo_1tb_tables
from rayemb.planner.topology import described_topology
from rayemb.planner.types import Placement, PlanResult, TableSpec

CPU2 = described_topology(2, 2, compute_device="cpu", ddr_gib=8)


def test_cost_formulas_follow_the_placement_byte_table():
    t = TableSpec("t", rows=1000, dim=16, pooling_factor=1.0, hot_rows=100, hot_share=0.9)
    w, b = 8, 4096
    assert table_bytes(t, Placement.DATA_PARALLEL, w, 8, b) == 2 * (w - 1) * 1000 * 16 * 4
    tw = table_bytes(t, Placement.TABLE_WISE, w, 8, b)
    q = (w - 1) / w
    # int64 ids, int32 lengths, the per-rank split sizes, pooled rows forward and gradients backward
    assert tw == pytest.approx(q * b * 8 + q * b * 4 + w * (w - 1) * 8 + 2 * q * b * 16 * 4)
    hyb = table_bytes(t, Placement.HYBRID, w, 8, b)
    # one-hot, h=0.9: the hybrid moves ~(1-h) of the pooled rows plus the hot all-reduce
    assert hyb < tw
    long_bags = TableSpec("m", rows=1000, dim=16, pooling_factor=50.0, hot_rows=100, hot_share=0.3)
    assert table_bytes(long_bags, Placement.HYBRID, w, 8, b) > table_bytes(long_bags, Placement.TABLE_WISE, w, 8, b)
    assert table_bytes(t, Placement.ROW_WISE, 1, 1, b) == 0.0
    rw = table_cost(TableSpec("r", rows=1001, dim=8), Placement.ROW_WISE, 4, 4, b)
    assert rw.max_shard_bytes == 251 * (8 * 4 + 4) and rw.memory_bytes == 1001 * 36


def test_cost_model_chooses_dp_small_hybrid_hot_pooled_long_bags():
    tables = [
        TableSpec("tiny", rows=50, dim=16),
        TableSpec("hot", rows=5_000_000, dim=16, hot_rows=4096, hot_share=0.9),
        TableSpec("bags", rows=5_000_000, dim=16, pooling_factor=40, hot_rows=4096, hot_share=0.2),
    ]
    c = BytesCostModel().choose(tables, described_topology(16, 8, hbm_gib=80), 65536, {})
    assert c["tiny"].placement == Placement.DATA_PARALLEL
    assert c["hot"].placement == Placement.HYBRID
    assert c["bags"].placement.is_pooled_model_parallel


def test_pins_are_honoured_and_checked():
    tables = [TableSpec(f"t{i}", rows=20_000, dim=16, hot_rows=64, hot_share=0.8) for i in range(4)]
    pins = {"t0": {"sharding": "row_wise"}, "t1": {"hybrid": False}, "t2": {"sharding": "column_wise"},
            "t3": {"sharding": "table_wise", "compute_kernel": "fused"}}
    r = plan(tables, CPU2, 1024, pins=pins, engine="fast")
    assert r.tables["t0"].placement == Placement.ROW_WISE and r.tables["t0"].ranks == (0, 1)
    assert r.tables["t1"].placement != Placement.HYBRID
    assert r.tables["t2"].placement == Placement.COLUMN_WISE
    assert r.tables["t3"].placement == Placement.TABLE_WISE and len(r.tables["t3"].ranks) == 1
    for bad in ({"nope": {"sharding": "row_wise"}}, {"t0": {"sharding": "diagonal"}},
                {"t0": {"sharding": "row_wise", "hybrid": True}}, {"t0": {"shard": "row_wise"}}):
        with pytest.raises(PlanError) as e:
            plan(tables, CPU2, 1024, pins=bad, engine="fast")
        assert e.value.category == "invalid_pin"


def test_insufficient_storage_lists_remedies():
    huge = [TableSpec("C1", rows=2_000_000_000, dim=128)]
    with pytest.raises(PlanError) as e:  # unpinned, the planner would compress it (test_planner_compression.py)
        plan(huge, described_topology(8, 8, hbm_gib=16), 8192, pins={"C1": {"compression": "none"}})
    assert e.value.category == "insufficient_storage"
    assert "more devices" in str(e.value) and "UVM" in str(e.value)
    with pytest.raises(PlanError) as e:  # pinned table-wise: one shard cannot fit one device
        plan([TableSpec("C1", rows=100_000_000, dim=128)], described_topology(64, 8, hbm_gib=16), 65536,
             pins={"C1": {"sharding": "table_wise"}})
    assert e.value.category == "insufficient_storage"


def test_plan_json_schema_and_roundtrip_without_torchrec(tmp_path):
    tables = [TableSpec("a", rows=100, dim=8), TableSpec("b", rows=300_000, dim=8, hot_rows=16, hot_share=0.7)]
    r = plan(tables, described_topology(4, 2, compute_device="cpu", ddr_gib=4), 512, engine="fast")
    d = r.to_json()
    assert d["schema_version"] == 2 and d["world_size"] == 4
    assert d["predicted_bytes_per_step"] == pytest.approx(sum(t["predicted_bytes_per_step"] for t in d["tables"].values()))
    for t in d["tables"].values():
        assert {"placement", "sharding_type", "ranks", "hot_rows", "predicted_bytes_per_step"} <= set(t)
    assert [x["rank"] for x in d["ranks"]] == [0, 1, 2, 3]
    assert all(x["memory_bytes"] <= x["capacity_bytes"] for x in d["ranks"])
    path = save_plan_json(r, str(tmp_path / "plan.json"))
    code = (
        "import sys, json; from rayemb.planner import load_plan_json; "
        f"p = load_plan_json({path!r}); "
        "assert 'torchrec' not in sys.modules and 'torch' not in sys.modules, 'torch imported'; "
        "print(json.dumps(p.to_json(), sort_keys=True))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == json.loads(json.dumps(d, sort_keys=True))
    assert load_plan_json(path) == PlanResult.from_json(d)
    (tmp_path / "bad.json").write_text('{"schema_version": 7}')
    with pytest.raises(PlanError) as e:
        load_plan_json(str(tmp_path / "bad.json"))
    assert e.value.category == "invalid_plan_file"


def test_torchrec_engine_returns_a_sharding_plan_with_hybrid_halves():
    tables = [TableSpec("small", rows=40, dim=16), TableSpec("hot", rows=200_000, dim=16, hot_rows=64, hot_share=0.9),
              TableSpec("big", rows=300_000, dim=16, pooling_factor=30)]
    r = plan(tables, CPU2, 1024, engine="torchrec")
    assert r.engine == "torchrec" and r.sharding_plan is not None
    assert r.tables["small"].placement == Placement.DATA_PARALLEL
    assert r.tables["hot"].placement == Placement.HYBRID and r.tables["hot"].hot_rows == 64
    assert r.tables["hot"].sharding_type == "row_wise" and r.tables["hot"].ranks == (0, 1)
    paths = set(r.sharding_plan.plan)
    assert {"plain", "hot"} <= paths and any(p.startswith("cold") for p in paths)
    assert r.sharding_plan.plan["hot"]["hot__hot"].sharding_type == "data_parallel"
    assert sum(u.memory_bytes for u in r.ranks) > 0 and r.all_fit()


def test_fast_engine_plan_converts_to_torchrec_module_plan():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rayemb.planner.torchrec_plan import to_sharding_plan

    tables = [TableSpec("a", rows=10, dim=16), TableSpec("b", rows=50_000, dim=64),
              TableSpec("c", rows=500_000, dim=64)]
    topo = described_topology(4, 2, compute_device="cpu", ddr_gib=4)
    r = plan(tables, topo, 512, engine="fast", pins={"b": {"sharding": "column_wise"}})
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                                     feature_names=[t.name]) for t in tables],
                                 device=torch.device("meta"))
    mp = to_sharding_plan(r, ebc)
    assert mp["a"].sharding_type == "data_parallel"
    assert mp["b"].sharding_type == "column_wise" and sorted(mp["b"].ranks) == list(r.tables["b"].ranks)
    assert mp["c"].sharding_type == r.tables["c"].sharding_type
    assert sorted(set(mp["c"].ranks)) == list(r.tables["c"].ranks)


@pytest.mark.timeout(120)
def test_what_if_1024_gpus_500_tables_every_rank_fits():
    r = plan(criteo_1tb_tables(500, dim=128), described_topology(1024, 8, hbm_gib=80), 1024 * 1024)
    assert r.engine == "fast" and len(r.tables) == 500 and r.world_size == 1024
    assert r.all_fit()
    # the largest Criteo tables cannot live on one 80 GiB device whole with the rest; they are split
    assert r.tables["C1"].placement in (Placement.ROW_WISE, Placement.TABLE_ROW_WISE)
    assert len(r.ranks) == 1024
    text = summary_table(r)
    assert "1024 ranks" in text and "C1" in text


def test_plan_cli_entry_writes_plan_and_png(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    schema = {"schema_version": 1, "label": "label", "dense": ["I1"],
              "sparse": [{"name": f"C{i}", "num_embeddings": n, "multi_hot": False}
                         for i, n in enumerate([10, 2000, 300_000], start=1)]}
    (data / "schema.yaml").write_text(yaml.safe_dump(schema))
    stats = {"schema_version": 1, "rows": 10_000, "tables": {
        "C3": {"values": 20_000, "pooling_factor": {"mean": 1.0, "max": 1},
               "heavy_hitters": [[i, 3000 // (i + 1)] for i in range(64)]}}}
    cfg = {"name": "t", "data": {"path": str(data), "batch_size": 256},
           "model": {"embedding_dim": 16, "bottom_mlp": [16], "top_mlp": [8, 1]}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    (tmp_path / "pins.yaml").write_text(yaml.safe_dump({"C2": {"sharding": "row_wise"}}))
    parser = add_plan_arguments(argparse.ArgumentParser())
    out = tmp_path / "plan.json"
    args = parser.parse_args(["--config", str(tmp_path / "job.yaml"), "--world-size", "4", "--gpus-per-node", "2",
                              "--cpu", "--ddr-gib", "2", "--pins", str(tmp_path / "pins.yaml"),
                              "--out", str(out)])
    try:
        from rayemb.data.stats_types import STATS_SCHEMA_VERSION
        stats["schema_version"] = STATS_SCHEMA_VERSION
        (tmp_path / "stats.json").write_text(json.dumps(stats))
        args.stats = str(tmp_path / "stats.json")
    except ImportError:
        args.stats = None
    assert plan_main(args) == 0
    p = load_plan_json(str(out))
    assert p.world_size == 4 and set(p.tables) == {"C1", "C2", "C3"}
    assert p.tables["C2"].placement == Placement.ROW_WISE
    assert (tmp_path / "plan.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "C3" in printed and "capacity" in printed


def test_cpu_sharder_offers_row_wise_where_torchrec_does_not():
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    from rayemb.embedding.sharders import CpuCapableEmbeddingBagCollectionSharder

    assert "row_wise" not in EmbeddingBagCollectionSharder().sharding_types("cpu")
    ours = CpuCapableEmbeddingBagCollectionSharder().sharding_types("cpu")
    assert {"row_wise", "table_row_wise", "table_wise", "column_wise", "data_parallel"} <= set(ours)
    assert CpuCapableEmbeddingBagCollectionSharder().sharding_types("cuda") == \
        EmbeddingBagCollectionSharder().sharding_types("cuda")
