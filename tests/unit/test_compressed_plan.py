"""Compressed tables from the planner to the job's module, checkpoint keys and storage specs.

The torchrec engine plans the physical tables of the module the job builds
(same names, same module paths), maps them back to the logical tables, and
``hybrid_from_placements`` builds that module from the plan's ``storage``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayemb.embedding.compression_math import CompressionSpec, spec_storage, storage_spec
from rayemb.errors import ConfigError, PlanError
from rayemb.planner.planner import plan
from rayemb.planner.topology import described_topology
from rayemb.planner.types import Placement, TableSpec

TABLES = [TableSpec("C1", rows=5000, dim=16, hot_rows=100, hot_share=0.5), TableSpec("C2", rows=3000, dim=16),
          TableSpec("C3", rows=200, dim=16, hot_rows=20, hot_share=0.6), TableSpec("C4", rows=2000, dim=16)]
TOPO = described_topology(2, 2, compute_device="cpu", ddr_gib=4)


def _configs():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    return [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name])
            for t in TABLES]


def _planned(result):
    return {path: set(mp) for path, mp in result.sharding_plan.plan.items()}


def test_torchrec_engine_plans_the_physical_tables_of_the_jobs_module():
    from rayemb.embedding.placements import hybrid_from_placements

    pins = {"C1": {"compression": "qr"}, "C2": {"compression": "block", "block_dim": 4},
            "C4": {"compression": "qr", "combine": "add", "sharding": "data_parallel"}}
    r = plan(TABLES, TOPO, 64, pins=pins, engine="torchrec")
    planned = _planned(r)
    assert planned["plain.rows.d16"] == {"C1__q", "C1__r"}  # QR mult: per-id rows
    assert {"C2__block", "C4__q", "C4__r", "C3"} <= planned["plain.bags"]
    assert r.tables["C1"].storage["compression"] == "qr" and r.tables["C1"].storage["buckets"] == 71
    assert r.tables["C2"].storage["block_dim"] == 4 and r.tables["C3"].storage is None
    assert r.tables["C4"].placement == Placement.DATA_PARALLEL
    # the QR table's two parts keep the compressed table's placement
    for sub in ("C1__q", "C1__r"):
        assert r.sharding_plan.plan["plain.rows.d16"][sub].sharding_type == r.tables["C1"].sharding_type
    # the job's module from the same plan has exactly the planned tables under the same paths
    module, constraints = hybrid_from_placements(_configs(), r.tables, {}, device=torch.device("meta"))
    assert set(constraints) == set().union(*planned.values())
    paths = {n.rsplit(".", 3)[0] for n, _ in module.named_parameters() if "projections" not in n}
    assert paths == set(planned) == {"plain.rows.d16", "plain.bags"}
    assert tuple(module.plain.projections["C2"].weight.shape) == (16, 4)
    assert {t: s.kind for t, s in module.compression().items()} == {"C1": "qr", "C2": "block", "C4": "qr"}


def test_data_parallel_qr_mult_rows_are_dense_and_still_reported():
    from rayemb.embedding.placements import hybrid_from_placements

    r = plan(TABLES, TOPO, 64, pins={"C1": {"compression": "qr", "sharding": "data_parallel"}}, engine="torchrec")
    assert not any("C1__q" in mp for mp in r.sharding_plan.plan.values())  # not a TorchRec table
    assert r.tables["C1"].placement == Placement.DATA_PARALLEL and r.tables["C1"].ranks == (0, 1)
    assert all(u.memory_bytes > 0 for u in r.ranks)
    module, _ = hybrid_from_placements(_configs(), r.tables, {}, device=torch.device("meta"))
    assert tuple(module.plain.replicated["embeddings"]["C1__q"].weight.shape) == (71, 16)
    assert all(p is not module.plain.replicated["embeddings"]["C1__q"].weight for p in module.table_parameters())


def test_split_state_dict_places_physical_tables_of_a_compressed_module():
    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection

    module = HybridEmbeddingBagCollection(_configs(), {"C3": np.arange(5)}, compression={
        "C1": CompressionSpec("qr"), "C2": CompressionSpec("block", block_dim=4)})
    weights = {n: p.detach().clone() + 1 for n, p in (
        ("C1__q", module.plain.rows["d16"].embeddings["C1__q"].weight),
        ("C1__r", module.plain.rows["d16"].embeddings["C1__r"].weight),
        ("C2__block", module.plain.bags.embedding_bags["C2__block"].weight),
        ("C4", module.plain.bags.embedding_bags["C4"].weight))}
    weights["C3"] = torch.zeros(200, 16)
    state = module.split_state_dict(weights)
    assert torch.equal(state["plain.rows.d16.embeddings.C1__q.weight"], weights["C1__q"])
    assert torch.equal(state["plain.bags.embedding_bags.C4.weight"], weights["C4"])
    missing = set(module.state_dict()) - set(state)
    assert missing == {"plain.projections.C2.weight"}  # dense, not a table
    module.load_state_dict(state, strict=False)


def test_compressed_and_hybrid_together_is_refused():
    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection

    with pytest.raises(PlanError) as e:
        plan(TABLES, TOPO, 64, pins={"C1": {"compression": "qr", "hybrid": True}}, engine="torchrec")
    assert e.value.category == "invalid_pin" and "hybrid" in str(e.value)
    with pytest.raises(ConfigError) as e2:
        HybridEmbeddingBagCollection(_configs(), {"C1": np.arange(3)}, compression={"C1": CompressionSpec("qr")},
                                     device=torch.device("meta"))
    assert "C1" in str(e2.value)


def test_storage_entries_and_specs_round_trip():
    assert storage_spec(None) == CompressionSpec() == storage_spec({"compression": "none", "kernel": "cached"})
    for spec, rows in ((CompressionSpec("qr", combine="add"), 50), (CompressionSpec("block", block_dim=4), 10),
                       (CompressionSpec("qr", buckets=8, combine="concat"), 60)):
        st = spec_storage(spec, rows)
        back = storage_spec(st)
        assert back.kind == spec.kind and storage_spec(spec_storage(back, rows)) == back
    assert spec_storage(CompressionSpec("qr"), 50)["buckets"] == 8  # resolved: ceil(sqrt(50))


def test_checkpoint_keys_of_compressed_and_sequence_tables():
    from rayemb.checkpoint.layout import embedding_key, stored_tables

    assert embedding_key("embedding.plain.bags.embedding_bags.C1__q.weight") == ("plain", "C1__q")
    assert embedding_key("embedding.plain.rows.d16.embeddings.C1__r.weight") == ("plain", "C1__r")
    assert embedding_key("_dmp_wrapped_module.module.embedding.plain.replicated.embeddings.C3__q.weight") == (
        "plain", "C3__q")
    assert embedding_key("sequence.embeddings.H1.weight") == ("plain", "H1")
    assert embedding_key("embedding.plain.embedding_bags.C4.weight") == ("plain", "C4")
    assert embedding_key("embedding.plain.projections.C2.weight") is None  # dense
    state = {"embedding.plain.rows.d16.embeddings.C1__q.weight": torch.zeros(71, 16),
             "embedding.plain.rows.d16.embeddings.C1__r.weight": torch.zeros(71, 16),
             "embedding.plain.bags.embedding_bags.C2__block.weight": torch.zeros(3000, 4),
             "embedding.plain.bags.embedding_bags.C4.weight": torch.zeros(2000, 16)}
    got = stored_tables({"C1": (5000, 16), "C2": (3000, 16), "C4": (2000, 16)}, state)
    assert got == {"C1__q": (71, 16), "C1__r": (71, 16), "C2__block": (3000, 4), "C4": (2000, 16)}
