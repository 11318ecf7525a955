"""The dense optimizers, weight decay, gradient clipping and learning-rate schedules of the job's own step.

On 2 gloo ranks a DLRM job is set up as the loop sets it up (``rayemb.train.worker.build.build_step``) once per
config and trained a few steps on a fixed batch per rank:

- every ``train.dense_optimizer`` (with weight decay) trains: finite losses that fall;
- the default config keeps the dense optimizer it always had (fused Adagrad at ``train.dense_lr``, no decay), no
  schedule and no clipping;
- under a schedule the dense optimizer's, the replicated rows' and the fused embedding optimizer's learning rates
  follow the factor step by step, and the fused optimizer really applies its rate: the first step's update of
  the embedding rows is the factor times the update an unscheduled job makes;
- ``train.grad_clip_norm`` bounds the dense gradients' norm (and without it the norm is above the bound).
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest
import torch
from _sparse import local_tensors

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS, BATCH, ROWS = 6, 12, 50
#: the dense optimizers' classes (the embedding rows' are TorchRec's and FBGEMM's)
DENSE = ("Adagrad", "Adam", "AdamW", "SGD")
JOB = {"name": "optimizers", "data": {"path": "unused", "batch_size": BATCH},
       "model": {"embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [8, 1]}}


def _schema() -> Any:
    from rayemb.data.schema import DatasetSchema

    return DatasetSchema.from_dict({"label": "label", "dense": ["d"], "sparse": [
        {"name": "a", "num_embeddings": ROWS}, {"name": "b", "num_embeddings": ROWS}]})


def _tables(model: Any) -> Dict[str, List[np.ndarray]]:
    return {k: local_tensors(v) for k, v in model.state_dict().items() if "embedding" in k}


def _kernels(optimizer: Any) -> List[Any]:
    """FBGEMM's table-batched modules under TorchRec's (nested) fused optimizer: the rate the kernel applies."""
    if hasattr(optimizer, "_emb_module"):
        return [optimizer._emb_module]
    return [m for _, o in getattr(optimizer, "optimizers", []) for m in _kernels(o)]


def _run(rank: int, world_size: int, cfgs: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Each config's job trained STEPS steps on this rank's fixed batch: what the assertions read."""
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.train.sharding import JobPlan, build_model
    from rayemb.train.worker.build import build_step
    from rayemb.train.worker.step import StepBatch

    schema, out = _schema(), {}
    for name, cfg in cfgs.items():
        torch.manual_seed(0)
        meta_model, _, _ = build_model(cfg, schema, {}, {}, torch.device("meta"), torch.device("meta"))
        plan = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu")
                                        ).collective_plan(meta_model, cpu_capable_sharders(), dist.GroupMember.WORLD)
        built = build_step(cfg, schema, JobPlan(sharding_plan=plan, placements={}, hot_ids={}, summary={}),
                           torch.device("cpu"), compile=False)
        if built.lr_schedule is not None:
            built.lr_schedule.start(0, STEPS)
        g = torch.Generator().manual_seed(rank)
        local = BATCH // world_size
        ids = torch.randint(0, ROWS, (2 * local,), generator=g)
        kjt = built.remapper.remap(KeyedJaggedTensor.from_lengths_sync(keys=["a", "b"], values=ids,
                                                                      lengths=torch.full((2 * local,), 1)))
        labels = (ids[:local] % 2).float()  # learnable from table a's rows
        batch = StepBatch((torch.randn(local, 1, generator=g), kjt), labels)
        step = built.train_step()
        dense_opt = next(getattr(o, "_optimizer", o) for _, o in built.optimizer.optimizers
                         if type(getattr(o, "_optimizer", o)).__name__ in DENSE)
        dense = [p for group in dense_opt.param_groups for p in group["params"]]
        fused = built.model.fused_optimizer
        tables0 = _tables(built.model)
        run: Dict[str, Any] = {"losses": [], "dense_lr": [], "fused_lr": [], "kernel_lr": [], "grad_norm": []}
        for s in range(STEPS):
            run["losses"].append(float(step(batch)))
            if s == 0:
                run["delta0"] = {k: [b - a for a, b in zip(v, _tables(built.model)[k])] for k, v in tables0.items()}
            run["dense_lr"].append([grp["lr"] for grp in dense_opt.param_groups])
            run["fused_lr"].append([grp["lr"] for grp in fused.param_groups])
            run["kernel_lr"].append([m.get_learning_rate() for m in _kernels(fused)])
            run["grad_norm"].append(float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in built.clip_params or dense
                             if p.grad is not None]))))
        inner = [getattr(o, "_optimizer", o) for _, o in built.optimizer.optimizers]
        run["dense_optimizers"] = [(type(o).__name__, o.defaults.get("lr"), o.defaults.get("weight_decay"),
                                    o.defaults.get("fused")) for o in inner if type(o).__name__ in DENSE]
        run["schedule"], run["clipped"] = built.lr_schedule is not None, len(built.clip_params)
        out[name] = run
    return out


def _cfg(*overrides: str) -> Any:
    from rayemb.config import config_from_dict

    return config_from_dict(JOB, list(overrides))


def test_dense_optimizers_schedules_and_clipping():
    from rayemb.config import LR_SCHEDULE_DEFAULTS
    from rayemb.train.worker.schedule import lr_factor

    schedule = {**LR_SCHEDULE_DEFAULTS, "kind": "linear", "warmup_steps": 4, "min_lr_ratio": 0.1}
    cfgs = {
        "default": _cfg(),
        **{opt: _cfg(f"train.dense_optimizer={opt}", "train.weight_decay=0.01")
           for opt in ("adagrad", "adam", "adamw", "sgd")},
        "scheduled": _cfg("train.lr_schedule={kind: linear, warmup_steps: 4, min_lr_ratio: 0.1}"),
        "clipped": _cfg("train.grad_clip_norm=0.001"),
    }
    ranks = run_multiprocess(_run, 2, cfgs=cfgs)
    for runs in ranks:
        for name, run in runs.items():
            losses = run["losses"]
            assert all(np.isfinite(losses)) and losses[-1] < losses[0], (name, losses)
        default = runs["default"]
        assert default["dense_optimizers"] == [("Adagrad", 0.05, 0, True)], default["dense_optimizers"]
        assert not default["schedule"] and default["clipped"] == 0
        assert default["dense_lr"] == [[0.05]] * STEPS
        assert all(lr == [pytest.approx(0.05)] * len(lr) for lr in default["fused_lr"] + default["kernel_lr"])
        for opt, kind in (("adagrad", "Adagrad"), ("adam", "Adam"), ("adamw", "AdamW"), ("sgd", "SGD")):
            assert runs[opt]["dense_optimizers"] == [(kind, 0.05, 0.01, True)], runs[opt]["dense_optimizers"]

        sched = runs["scheduled"]
        for s in range(STEPS):
            f = lr_factor(s, STEPS, schedule)
            assert sched["dense_lr"][s] == [pytest.approx(0.05 * f)], (s, sched["dense_lr"][s])
            assert sched["fused_lr"][s] and all(lr == pytest.approx(0.05 * f) for lr in sched["fused_lr"][s])
            assert sched["kernel_lr"][s] and all(lr == pytest.approx(0.05 * f) for lr in sched["kernel_lr"][s])
        # the fused optimizer applied the scheduled rate: the first update of the rows (a first rowwise Adagrad
        # step is linear in the rate) is the factor times the unscheduled one
        f0 = lr_factor(0, STEPS, schedule)
        moved = 0
        for k, deltas in default["delta0"].items():
            for a, b in zip(deltas, sched["delta0"][k]):
                if np.abs(a).max() > 0:
                    np.testing.assert_allclose(b, f0 * a, rtol=1e-3, atol=1e-7)
                    moved += 1
        assert moved, "no embedding row moved"

        clipped = runs["clipped"]
        assert clipped["clipped"] > 0
        assert max(clipped["grad_norm"]) <= 0.001 * (1 + 1e-4), clipped["grad_norm"]
        assert min(default["grad_norm"]) > 0.001, default["grad_norm"]  # the bound really binds
    # every rank clipped alike: the all-reduced gradients' norms agree
    assert ranks[0]["clipped"]["grad_norm"] == pytest.approx(ranks[1]["clipped"]["grad_norm"])
