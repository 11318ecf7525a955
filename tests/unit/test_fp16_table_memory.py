"""model.embedding_dtype: fp16 tables hold half the bytes of fp32 ones, the planner counts them so, and none is
compressed (compressed tables are fp32 only).

The storage is measured on the sharded model itself (one gloo rank): the bytes of every buffer the
embedding weights live in (FBGEMM's flat TBE weights, fused and dense kernels alike), not a formula.
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import pytest
import torch

from rayemb.data.schema import DatasetSchema
from rayemb.errors import PlanError
from rayemb.planner import TableSpec, plan
from rayemb.planner.topology import described_topology

SCHEMA = DatasetSchema.from_dict({"label": "label", "dense": ["d"],
                                  "sparse": [{"name": n, "num_embeddings": v} for n, v in (("a", 400), ("b", 300),
                                                                                         ("c", 200))]})


def _sharded(dtype: str):
    """The hybrid module of SCHEMA's tables (a: hybrid, row-wise cold half; b: table-wise; c: data-parallel),
    sharded on this one rank with the job's sharders and fused row-wise Adagrad."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.contract.tables import table_configs

    torch.manual_seed(0)
    sparse = HybridEmbeddingBagCollection(table_configs(SCHEMA, 8, dtype), {"a": np.arange(0, 40, 2)},
                                          device=torch.device("meta"))
    apply_optimizer_in_backward(RowWiseAdagrad, sparse.table_parameters(), {"lr": 0.1})
    constraints = sparse.parameter_constraints({"a": "row_wise"}, {"b": ["table_wise"], "c": ["data_parallel"]})
    sharding = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                        constraints=constraints).plan(sparse, cpu_capable_sharders())
    model = DistributedModelParallel(sparse, device=torch.device("cpu"), plan=sharding,
                                     sharders=cpu_capable_sharders())
    return model, sparse.remapper


def _weight_storage(model) -> Tuple[int, Dict[str, torch.dtype]]:
    """(bytes of every distinct buffer holding an embedding weight, weight key -> dtype)."""
    buffers: Dict[int, int] = {}
    dtypes: Dict[str, torch.dtype] = {}
    for key, value in model.state_dict().items():
        tensors = [s.tensor for s in value.local_shards()] if hasattr(value, "local_shards") else [value]
        for t in tensors:
            buffers[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            dtypes[key] = t.dtype
    return sum(buffers.values()), dtypes


def test_fp16_tables_hold_half_the_bytes_and_look_up_fp32_rows(one_rank_group):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    full, full_dtypes = _weight_storage(_sharded("fp32")[0])
    model, remapper = _sharded("fp16")
    half, half_dtypes = _weight_storage(model)
    # every part: the hybrid table's replicated hot rows and sharded cold rows, a fused and a dense-kernel table
    assert set(half_dtypes) == set(full_dtypes) == {"hot.embedding_bags.a__hot.weight",
                                                   "cold.d8.embeddings.a__cold.weight",
                                                   "plain.embedding_bags.b.weight", "plain.embedding_bags.c.weight"}
    assert set(full_dtypes.values()) == {torch.float32} and set(half_dtypes.values()) == {torch.float16}
    assert full == (400 + 300 + 200) * 8 * 4 and half * 2 == full
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a", "b", "c"], values=torch.tensor([2, 5, 1, 3, 7, 0]),
                                              lengths=torch.ones(6, dtype=torch.int32))
    out = model(remapper.remap(kjt)).values()
    assert out.dtype == torch.float32 and out.shape == (2, 24)  # FBGEMM's lookups return fp32 rows
    out.sum().backward()
    state = model.fused_optimizer.state_dict()["state"]
    assert state and all(v.dtype == torch.float32 for s in state.values() for v in s.values())  # fused state fp32


def _one_table(bytes_per_element: int, ddr_gib: float = 8):
    tables = [TableSpec("t", rows=4_000_000, dim=64, bytes_per_element=bytes_per_element),
              TableSpec("h", rows=100_000, dim=64, bytes_per_element=bytes_per_element, hot_rows=1024,
                        hot_share=0.5)]
    pins = {"t": {"sharding": "row_wise"}, "h": {"sharding": "hybrid"}}
    return plan(tables, described_topology(2, 2, compute_device="cpu", ddr_gib=ddr_gib), 1024, pins=pins,
                engine="torchrec")


def test_planned_memory_of_fp16_tables_halves_their_weights():
    full, half = _one_table(4), _one_table(2)
    for name, rows, replicas in (("t", 4_000_000, 0), ("h", 100_000, 1024)):
        weights = (rows + replicas) * 64 * 4  # fp32 weights (a hybrid table's hot rows on both ranks: 2 copies)
        # the optimizer state (fp32) is the same; the fp16 weights are half the fp32 ones
        assert full.tables[name].memory_bytes - half.tables[name].memory_bytes == weights // 2, name
    assert sum(u.memory_bytes for u in full.ranks) - sum(u.memory_bytes for u in half.ranks) == \
        (4_000_000 + 100_000 + 1024) * 64 * 2
    # TorchRec's planner sizes the shards by the tables' real element size: 1 GiB of fp32 rows does not fit two
    # ranks of 0.45 GiB, the same rows in fp16 do
    with pytest.raises(PlanError) as e:
        _one_table(4, ddr_gib=0.45)
    assert e.value.category == "insufficient_storage"
    assert _one_table(2, ddr_gib=0.45).all_fit()


def test_fp16_tables_are_never_compressed():
    from rayemb.embedding.compression_math import CompressionSpec
    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
    from rayemb.errors import ConfigError
    from rayemb.contract.tables import table_configs
    from rayemb.planner.compression import auto_options

    topology = described_topology(2, 2, compute_device="cpu", ddr_gib=8)
    fp32 = {o.compression for o in auto_options(TableSpec("t", rows=1000, dim=16), topology)}
    assert {"qr", "block"} <= fp32
    assert auto_options(TableSpec("t", rows=1000, dim=16, bytes_per_element=2), topology) == []
    HybridEmbeddingBagCollection(table_configs(SCHEMA, 8), {}, device=torch.device("meta"),
                                 compression={"a": CompressionSpec("qr")})
    with pytest.raises(ConfigError, match=r"model.embedding_dtype: fp16 tables cannot be compressed.*\['a'\]"):
        HybridEmbeddingBagCollection(table_configs(SCHEMA, 8, "fp16"), {}, device=torch.device("meta"),
                                     compression={"a": CompressionSpec("qr")})
