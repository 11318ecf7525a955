"""Logical checkpoints load into any plan and world size and come back bit for bit.

A model with every placement rayemb uses — hybrid tables with row-, column-
and table-wise cold halves, plain table-, column-, row-wise and data-parallel
tables, a second embedding dim — trains a few steps on 2 gloo ranks with
row-wise Adagrad (fused for sharded tables, TorchRec's for replicated ones)
and saves checkpoint C. Then on 3 ranks a model of *another plan* (other
placements, another hot set, hybrid tables made plain and plain ones hybrid)
loads C and saves C2 without training; on 2 ranks the first plan loads C2
and saves C3. ``export(C2)``, ``export(C3)`` and ``export(reshard(C, 3))``
must equal ``export(C)`` in every tensor, bit for bit. Loading also continues
training exactly: a model of another plan that loads C and takes one step
matches the original model's next step to float tolerance.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import numpy as np
import pytest
import torch
from _sparse import HeadModel, assert_same_state, checkpoint_step

from rayemb.checkpoint.export import export_checkpoint, reshard_checkpoint, unsharded_state
from rayemb.multiprocess import run_multiprocess

LOCAL_BATCH = 6
LR = 0.05
DIM = 8
# name -> (rows, dim)
TABLES: Dict[str, Tuple[int, int]] = {"a": (40, DIM), "b": (30, DIM), "c": (20, DIM), "d": (24, DIM),
                                      "e": (22, DIM), "f": (10, DIM), "g": (26, 4)}
# table -> (placement, cold/plain sharding type, hot ids or None)
PLAN_A = {"a": ("hybrid", "row_wise", np.arange(0, 12, 2)), "b": ("hybrid", "column_wise", np.array([1, 2, 3])),
          "c": ("table_wise", "table_wise", None), "d": ("column_wise", "column_wise", None),
          "e": ("row_wise", "row_wise", None), "f": ("data_parallel", "data_parallel", None),
          "g": ("hybrid", "table_wise", np.array([0, 5, 7]))}
PLAN_B = {"a": ("column_wise", "column_wise", None), "b": ("hybrid", "row_wise", np.array([0, 4, 9, 29])),
          "c": ("hybrid", "column_wise", np.arange(5)), "d": ("row_wise", "row_wise", None),
          "e": ("data_parallel", "data_parallel", None), "f": ("hybrid", "table_wise", np.array([2])),
          "g": ("row_wise", "row_wise", None)}


def _build(world_size: int, plan: Dict[str, tuple], seed: int, one_ddp: bool = True,
           comm_precision: Optional[Dict[str, str]] = None):
    """The model of ``plan`` sharded as a job shards it (``one_ddp=False``: TorchRec's own DDP per data-parallel
    lookup instead of the job's one DDP), its exchanges at ``comm_precision`` (``train.comm_precision``; None:
    fp32), its optimizer and remapper."""
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from rayemb.embedding.data_parallel import OneDataParallelWrapper, replicated_embedding_parameters
    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
    from rayemb.embedding.qcomm import CommPrecision
    from rayemb.embedding.sharders import cpu_capable_sharders

    precision = CommPrecision.of(comm_precision)
    torch.manual_seed(seed)
    configs = [EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=v, feature_names=[f"f_{n}"])
               for n, (v, d) in TABLES.items()]
    hot = {n: h for n, (p, _, h) in plan.items() if p == "hybrid"}
    sparse = HybridEmbeddingBagCollection(configs, hot, device=torch.device("meta"))
    model = HeadModel(sparse, sum(d for _, d in TABLES.values()))
    apply_optimizer_in_backward(RowWiseAdagrad, sparse.parameters(), {"lr": LR})
    cons = sparse.parameter_constraints({n: t for n, (p, t, _) in plan.items() if p == "hybrid"},
                                        {n: [t] for n, (p, t, _) in plan.items() if p != "hybrid"}, min_partition=4)
    sharders = cpu_capable_sharders(precision)
    sharding = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                        constraints=cons).collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=sharding, sharders=sharders,
                                   data_parallel_wrapper=OneDataParallelWrapper(
                                       allreduce_comm_precision=precision.allreduce) if one_ddp else None)
    replicated = replicated_embedding_parameters(dmp)
    dense = {k: p for k, p in in_backward_optimizer_filter(dmp.named_parameters()) if k not in replicated}
    opt = CombinedOptimizer([dmp.fused_optimizer, KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adagrad(ps, lr=LR)),
                             KeyedOptimizerWrapper(replicated, lambda ps: RowWiseAdagrad(ps, lr=LR))])
    return dmp, opt, sparse.remapper


def _rank(rank: int, world_size: int, plan_name: str, load: str, save: str, train_steps: int,
          first_step: int, seed: int):
    from rayemb.checkpoint.store import load_logical, save_logical

    dmp, opt, remapper = _build(world_size, PLAN_A if plan_name == "A" else PLAN_B, seed)
    if load:
        meta = load_logical(load, dmp, opt, remapper, TABLES)
        first_step = int(meta["step"])
    losses = [checkpoint_step(dmp, opt, remapper, TABLES, LOCAL_BATCH, first_step + i, rank, world_size)
              for i in range(train_steps)]
    if save:
        save_logical(save, dmp, opt, remapper, TABLES, {"epoch": 0, "step": first_step + train_steps})
    return losses


def test_any_plan_any_world_size_round_trips_bit_for_bit(tmp_path):
    c, c2, c3 = (str(tmp_path / n) for n in ("c", "c2", "c3"))
    run_multiprocess(_rank, 2, plan_name="A", load="", save=c, train_steps=3, first_step=0, seed=0)
    run_multiprocess(_rank, 3, plan_name="B", load=c, save=c2, train_steps=0, first_step=0, seed=1)
    run_multiprocess(_rank, 2, plan_name="A", load=c2, save=c3, train_steps=0, first_step=0, seed=2)
    ref = unsharded_state(c)
    assert ref["meta"]["world_size"] == 2 and ref["meta"]["step"] == 3
    for name, (rows, dim) in TABLES.items():
        assert tuple(ref["tables"][name]["weight"].shape) == (rows, dim)
        mom = ref["tables"][name]["momentum1"]
        assert tuple(mom.shape) == (rows,) and bool((mom > 0).any()), name  # trained row-wise state
    assert ref["dense"] and ref["dense_optim"]
    for other in (c2, c3):
        got = unsharded_state(other)
        assert_same_state(got["tables"], ref["tables"], "tables")
        assert_same_state(got["dense"], ref["dense"], "dense")
        assert_same_state(got["dense_optim"], ref["dense_optim"], "dense_optim")

    # the CLI path: reshard to 3 then export == export
    r3 = str(tmp_path / "r3")
    meta = reshard_checkpoint(c, 3, r3)
    assert meta["world_size"] == 3 and meta["resharded_from"]["world_size"] == 2
    assert len([n for n in os.listdir(r3) if n.endswith(".distcp")]) == 3
    a, b = export_checkpoint(c, str(tmp_path / "c.pt")), export_checkpoint(r3, str(tmp_path / "r3.pt"))
    assert a["tables"] == len(TABLES) == b["tables"]
    ea = torch.load(tmp_path / "c.pt", weights_only=True)
    eb = torch.load(tmp_path / "r3.pt", weights_only=True)
    assert_same_state(ea["tables"], eb["tables"])
    assert_same_state(ea["dense"], eb["dense"])
    # and 3 -> 2, through the CLI a user runs
    import subprocess
    import sys

    r2, out = str(tmp_path / "r2"), str(tmp_path / "r2.pt")
    for argv in (["reshard", "--checkpoint", r3, "--world-size", "2", "--out", r2],
                 ["export", "--checkpoint", r2, "--out", out], ["show", "--checkpoint", r2]):
        p = subprocess.run([sys.executable, "-m", "rayemb", "checkpoint", *argv], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-3000:])
    assert '"world_size": 2' in p.stdout
    exported = torch.load(out, weights_only=True)
    assert_same_state(exported["tables"], ea["tables"])
    assert_same_state(exported["dense_optim"], ea["dense_optim"])
    assert tuple(exported["tables"]["a"]["weight"].shape) == TABLES["a"]
    # resharding into an existing directory is refused, nothing written
    p = subprocess.run([sys.executable, "-m", "rayemb", "checkpoint", "reshard", "--checkpoint", c,
                        "--world-size", "3", "--out", r2], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "exists" in p.stderr, p.stderr[-2000:]


def test_resumed_training_continues_the_loss_on_another_plan_and_world(tmp_path):
    c = str(tmp_path / "c")
    straight = run_multiprocess(_rank, 2, plan_name="A", load="", save="", train_steps=4, first_step=0, seed=0)[0]
    run_multiprocess(_rank, 2, plan_name="A", load="", save=c, train_steps=3, first_step=0, seed=0)
    resumed = run_multiprocess(_rank, 3, plan_name="B", load=c, save="", train_steps=1, first_step=0, seed=5)[0]
    fresh = run_multiprocess(_rank, 3, plan_name="B", load="", save="", train_steps=1, first_step=3, seed=5)[0]
    # the resumed step 4 is the uninterrupted run's step 4, not a fresh model's
    assert resumed[0] == pytest.approx(straight[3], abs=1e-5), (resumed, straight)
    assert abs(fresh[0] - straight[3]) > 1e-4, (fresh, straight)
