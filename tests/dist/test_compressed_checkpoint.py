"""Logical checkpoints of compressed tables: any plan, any world size, bit for bit.

The job's embedding module (``HybridEmbeddingBagCollection`` whose ``plain``
child is a ``CompressedEmbeddingBagCollection``, built by
``hybrid_from_placements`` from per-table plans with a ``storage`` entry, as
the job builds it) holds a QR-mult table, a QR-add table, a block table, a
plain table and a hybrid one. It is built on the meta device and given the
embedding optimizer in backward for all its parameters, exactly as the job's
``sharded_model`` does: DMP materialises the dense ones (block projection,
data-parallel QR-mult rows) as new parameters that take the regular
optimizers. Plan A trains 3 steps on 2 gloo ranks and saves C; plan B (other
placements: QR-mult data-parallel, so replicated dense rows, instead of
table-wise; block row-wise instead of table-wise; ...) loads C on 3 ranks and
saves C2; plan A loads C2 on 2 ranks and saves C3. The physical tables
(``q__q``, ``q__r``, ``blk__block``, ...) are checkpointed as tables of their
own shapes and ``export`` of C2 and C3 equals C's in every tensor, bit for bit
(weights, row-wise Adagrad state, projection and its optimizer state). A
model of plan B that loads C continues the loss of the uninterrupted run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np
import pytest
import torch
from _sparse import HeadModel, assert_same_state, checkpoint_step

from rayemb.checkpoint.export import unsharded_state
from rayemb.multiprocess import run_multiprocess

LOCAL_BATCH = 6
LR = 0.05
DIM = 8
# name -> (rows, dim)
TABLES: Dict[str, Tuple[int, int]] = {"q": (60, DIM), "qa": (50, DIM), "blk": (40, DIM), "p": (20, DIM),
                                      "h": (30, DIM)}
STORAGE = {"q": {"compression": "qr", "buckets": 8, "combine": "mult"},
           "qa": {"compression": "qr", "buckets": 5, "combine": "add"},
           "blk": {"compression": "block", "block_dim": 4}}
# table -> (placement, sharding type, hot ids)
PLAN_A = {"q": ("table_wise", "table_wise", None), "qa": ("column_wise", "column_wise", None),
          "blk": ("table_wise", "table_wise", None), "p": ("row_wise", "row_wise", None),
          "h": ("hybrid", "row_wise", np.array([0, 3, 7]))}
PLAN_B = {"q": ("data_parallel", "data_parallel", None), "qa": ("data_parallel", "data_parallel", None),
          "blk": ("row_wise", "row_wise", None), "p": ("hybrid", "table_wise", np.array([1, 2])),
          "h": ("column_wise", "column_wise", None)}
#: the tables a checkpoint holds: compressed ones as their physical tables
STORED = {"q__q": (8, DIM), "q__r": (8, DIM), "qa__q": (10, DIM), "qa__r": (5, DIM), "blk__block": (40, 4),
          "p": (20, DIM), "h": (30, DIM)}


@dataclass
class _Plan:
    """The fields of :class:`rayemb.planner.types.TablePlan` the module reads."""

    placement: str
    sharding_type: str
    storage: Optional[Dict[str, Any]]


def _build(world_size: int, plan: Dict[str, tuple], seed: int):
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from rayemb.embedding.data_parallel import replicated_embedding_parameters
    from rayemb.embedding.placements import hybrid_from_placements
    from rayemb.embedding.sharders import cpu_capable_sharders

    torch.manual_seed(seed)
    configs = [EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=v, feature_names=[f"f_{n}"])
               for n, (v, d) in TABLES.items()]
    placements = {n: _Plan(p, t, STORAGE.get(n)) for n, (p, t, _) in plan.items()}
    hot = {n: h for n, (p, _, h) in plan.items() if p == "hybrid"}
    sparse, cons = hybrid_from_placements(configs, placements, hot, device=torch.device("meta"))
    model = HeadModel(sparse, sum(d for _, d in TABLES.values()))
    # as the job: every embedding parameter; the dense ones are re-created by DMP (meta) and lose it
    apply_optimizer_in_backward(RowWiseAdagrad, sparse.parameters(), {"lr": LR})
    sharders = cpu_capable_sharders()
    sharding = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                        constraints=cons).collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=sharding, sharders=sharders)
    replicated = replicated_embedding_parameters(dmp)
    dense = {k: p for k, p in in_backward_optimizer_filter(dmp.named_parameters()) if k not in replicated}
    assert any("projections.blk" in k for k in dense), sorted(dense)  # the projection takes the dense optimizer
    opt = CombinedOptimizer([dmp.fused_optimizer,
                             KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adagrad(ps, lr=LR)),
                             KeyedOptimizerWrapper(replicated, lambda ps: RowWiseAdagrad(ps, lr=LR))])
    planned = {t for mp in sharding.plan.values() for t in mp}
    return dmp, opt, sparse.remapper, planned, sorted(replicated)


def _rank(rank: int, world_size: int, plan_name: str, load: str, save: str, train_steps: int,
          first_step: int, seed: int):
    from rayemb.checkpoint.store import load_logical, save_logical

    dmp, opt, remapper, planned, replicated = _build(world_size, PLAN_A if plan_name == "A" else PLAN_B, seed)
    if load:
        meta = load_logical(load, dmp, opt, remapper, TABLES)
        first_step = int(meta["step"])
    losses = [checkpoint_step(dmp, opt, remapper, TABLES, LOCAL_BATCH, first_step + i, rank, world_size)
              for i in range(train_steps)]
    if save:
        save_logical(save, dmp, opt, remapper, TABLES, {"epoch": 0, "step": first_step + train_steps})
    return {"losses": losses, "planned": sorted(planned), "replicated": replicated}


def test_compressed_tables_round_trip_bit_for_bit_across_plans_and_worlds(tmp_path):
    c, c2, c3 = (str(tmp_path / n) for n in ("c", "c2", "c3"))
    a = run_multiprocess(_rank, 2, plan_name="A", load="", save=c, train_steps=3, first_step=0, seed=0)[0]
    b = run_multiprocess(_rank, 3, plan_name="B", load=c, save=c2, train_steps=0, first_step=0, seed=1)[0]
    run_multiprocess(_rank, 2, plan_name="A", load=c2, save=c3, train_steps=0, first_step=0, seed=2)
    # plan A: QR-mult rows are TorchRec tables; plan B: data-parallel, so dense replicated rows
    assert {"q__q", "q__r", "qa__q", "qa__r", "blk__block"} <= set(a["planned"]), a["planned"]
    assert "q__q" not in b["planned"] and any(k.endswith("replicated.embeddings.q__q.weight") for k in b["replicated"])
    ref = unsharded_state(c)
    assert ref["meta"]["world_size"] == 2 and ref["meta"]["step"] == 3
    assert sorted(ref["tables"]) == sorted(STORED)
    for name, (rows, dim) in STORED.items():
        assert tuple(ref["tables"][name]["weight"].shape) == (rows, dim), name
        mom = ref["tables"][name]["momentum1"]
        assert tuple(mom.shape) == (rows,) and bool((mom > 0).any()), name  # trained row-wise state
    proj = [k for k in ref["dense"] if "projections.blk" in k]
    assert proj and any("projections.blk" in k for k in ref["dense_optim"]), (sorted(ref["dense"]), proj)
    for other in (c2, c3):
        got = unsharded_state(other)
        assert_same_state(got["tables"], ref["tables"], "tables")
        assert_same_state(got["dense"], ref["dense"], "dense")
        assert_same_state(got["dense_optim"], ref["dense_optim"], "dense_optim")


def test_resumed_compressed_training_continues_the_loss_on_another_plan_and_world(tmp_path):
    c = str(tmp_path / "c")
    straight = run_multiprocess(_rank, 2, plan_name="A", load="", save="", train_steps=4, first_step=0, seed=0)[0]
    run_multiprocess(_rank, 2, plan_name="A", load="", save=c, train_steps=3, first_step=0, seed=0)
    resumed = run_multiprocess(_rank, 3, plan_name="B", load=c, save="", train_steps=1, first_step=0, seed=5)[0]
    fresh = run_multiprocess(_rank, 3, plan_name="B", load="", save="", train_steps=1, first_step=3, seed=5)[0]
    assert resumed["losses"][0] == pytest.approx(straight["losses"][3], abs=1e-5), (resumed, straight)
    assert abs(fresh["losses"][0] - straight["losses"][3]) > 1e-4, (fresh, straight)
