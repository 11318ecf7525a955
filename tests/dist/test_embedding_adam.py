"""Adam for the embedding tables (``train.embedding_optimizer: adam`` / ``rowwise_adam``) on 2 gloo ranks.

A DLRM job is set up as the loop sets it up (``rayemb.train.worker.build.build_step``), its tables data-parallel
(replicated rows: the placement whose Adam runs on CPU ranks), and trained on a batch per rank and step:

- every step's update of the rows is Adam's (FBGEMM's math: bias-corrected moments, ``eps`` outside the square
  root; ``rowwise_adam``: the second moment per row) applied in float64 to the step's all-reduced gradient,
  from the same initial rows, to 1e-5;
- a checkpoint taken mid-way holds both moments; a job resumed from it continues exactly as the uninterrupted
  one, and the moments reshard onto one rank unchanged;
- the same optimizer on a sharded table of a CPU job is refused with one ConfigError naming the table and its
  placement (FBGEMM 1.8.0 has no CPU kernel for it).
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest
import torch

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS, SAVED_AT, BATCH, ROWS, LR = 5, 2, 8, 30, 0.05
BETAS, EPS = (0.9, 0.999), 1e-8
TABLES = {"a": (ROWS, 8), "b": (ROWS, 8)}
JOB = {"name": "adam", "data": {"path": "unused", "batch_size": BATCH},
       "model": {"embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [8, 1]},
       "train": {"embedding_lr": LR}}


def _schema() -> Any:
    from rayemb.data.schema import DatasetSchema

    return DatasetSchema.from_dict({"label": "label", "dense": ["d"], "sparse": [
        {"name": n, "num_embeddings": v} for n, (v, _) in TABLES.items()]})


def _built(optimizer: str, world_size: int, sharding: str, seed: int) -> Any:
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    from rayemb.config import config_from_dict
    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.train.sharding import JobPlan, build_model
    from rayemb.train.worker.build import build_step

    cfg = config_from_dict(JOB, [f"train.embedding_optimizer={optimizer}"])
    torch.manual_seed(seed)
    meta_model, _, _ = build_model(cfg, _schema(), {}, {}, torch.device("meta"), torch.device("meta"))
    kernel = "dense" if sharding == "data_parallel" else "fused"
    constraints = {n: ParameterConstraints(sharding_types=[sharding], compute_kernels=[kernel]) for n in TABLES}
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                    constraints=constraints).collective_plan(
        meta_model, cpu_capable_sharders(), dist.GroupMember.WORLD)
    return build_step(cfg, _schema(), JobPlan(sharding_plan=plan, placements={}, hot_ids={}, summary={}),
                      torch.device("cpu"), compile=False)


def _batch(built: Any, step: int, rank: int, world_size: int) -> Any:
    """This rank's rows of the global batch of ``step``: the same rows whatever the world size."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rayemb.train.worker.step import StepBatch

    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, ROWS // 2, (len(TABLES), BATCH), generator=g)  # half the rows never seen
    dense = torch.randn(BATCH, 1, generator=g)
    local = BATCH // world_size
    rows = slice(rank * local, (rank + 1) * local)
    kjt = built.remapper.remap(KeyedJaggedTensor.from_lengths_sync(
        keys=list(TABLES), values=ids[:, rows].reshape(-1), lengths=torch.ones(len(TABLES) * local, dtype=torch.int32)))
    return StepBatch((dense[rows], kjt), (ids[0, rows] % 2).float())


def _replicated(built: Any) -> Any:
    """The optimizer of the replicated embedding rows (inside the job's CombinedOptimizer)."""
    from rayemb.train.worker.optim import Fp32StateAdam, RowWiseAdam

    inner = [getattr(o, "_optimizer", o) for _, o in built.optimizer.optimizers]
    return next(o for o in inner if isinstance(o, (Fp32StateAdam, RowWiseAdam)))


def _rows(built: Any) -> Dict[str, np.ndarray]:
    from rayemb.embedding.data_parallel import replicated_embedding_parameters

    return {k: p.detach().double().numpy().copy() for k, p in replicated_embedding_parameters(built.model).items()}


def _moments(built: Any) -> Dict[str, Dict[str, np.ndarray]]:
    from rayemb.embedding.data_parallel import replicated_embedding_parameters

    opt = _replicated(built)
    return {k: {s: opt.state[p][s].double().numpy().copy() for s in ("exp_avg", "exp_avg_sq")}
            for k, p in replicated_embedding_parameters(built.model).items()}


def _train(rank: int, world_size: int, optimizer: str, ckpt: str, resume: str) -> Dict[str, Any]:
    """STEPS steps from fresh rows (saving at SAVED_AT into ``ckpt``), or from ``resume`` to STEPS: the rows,
    moments and every step's all-reduced gradient of the replicated rows."""
    from rayemb.checkpoint.store import load_logical, save_logical

    built = _built(optimizer, world_size, "data_parallel", seed=0 if not resume else 7)
    first = 0
    if resume:
        first = int(load_logical(resume, built.model, built.optimizer, built.remapper, TABLES)["step"])
    grads: List[Dict[str, np.ndarray]] = []
    named = {id(p): k for k, p in __import__("rayemb.embedding.data_parallel", fromlist=["x"])
             .replicated_embedding_parameters(built.model).items()}
    _replicated(built).register_step_pre_hook(lambda opt, *_: grads.append(
        {named[id(p)]: p.grad.double().numpy().copy() for g in opt.param_groups for p in g["params"]}))
    out: Dict[str, Any] = {"initial": _rows(built), "first": first}
    step = built.train_step()
    for s in range(first, STEPS if world_size > 1 else first):
        step(_batch(built, s, rank, world_size))
        if s + 1 == SAVED_AT and ckpt:
            save_logical(ckpt, built.model, built.optimizer, built.remapper, TABLES, {"epoch": 0, "step": SAVED_AT})
            out["saved_moments"] = _moments(built)
    out.update(rows=_rows(built), moments=_moments(built), grads=grads)
    return out


def _reference(initial: Dict[str, np.ndarray], grads: List[Dict[str, np.ndarray]], rowwise: bool
               ) -> Dict[str, np.ndarray]:
    """FBGEMM's Adam / partial row-wise Adam in float64 over the given gradients."""
    b1, b2 = BETAS
    out = {}
    for k, w in initial.items():
        w, m, v = w.copy(), np.zeros_like(w), np.zeros((w.shape[0], 1) if rowwise else w.shape)
        for t, step in enumerate(grads, start=1):
            g = step[k]
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * ((g * g).mean(axis=1, keepdims=True) if rowwise else g * g)
            w = w - LR * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + EPS)
        out[k] = w
    return out


@pytest.mark.parametrize("optimizer", ["adam", "rowwise_adam"])
def test_adam_on_replicated_rows_is_fbgemms_math_and_resumes_exactly(tmp_path, optimizer):
    from rayemb.checkpoint.export import unsharded_state

    ckpt = str(tmp_path / "ckpt")
    ranks = run_multiprocess(_train, 2, optimizer=optimizer, ckpt=ckpt, resume="")
    for run in ranks:
        assert len(run["grads"]) == STEPS
        ref = _reference(run["initial"], run["grads"], rowwise=optimizer == "rowwise_adam")
        for k, rows in run["rows"].items():
            assert np.abs(rows - run["initial"][k]).max() > 1e-3, k  # the rows trained
            np.testing.assert_allclose(rows, ref[k], rtol=0, atol=1e-5, err_msg=k)
    np.testing.assert_equal(ranks[0]["rows"], ranks[1]["rows"])  # replicated: every rank alike

    # the checkpoint holds both moments, in the shape the optimizer keeps them
    saved = unsharded_state(ckpt)["tables"]
    moments = ranks[0]["saved_moments"]
    for key, states in moments.items():
        table = next(t for t in TABLES if f".{t}." in f".{key}")
        np.testing.assert_array_equal(saved[table]["momentum1"].double().numpy().reshape(states["exp_avg"].shape),
                                      states["exp_avg"])
        np.testing.assert_array_equal(saved[table]["momentum2"].double().numpy().reshape(-1),
                                      states["exp_avg_sq"].reshape(-1))
        assert (states["exp_avg_sq"] > 0).any()

    # resumed from step SAVED_AT (other initial rows before the load): the uninterrupted job's rows
    resumed = run_multiprocess(_train, 2, optimizer=optimizer, ckpt="", resume=ckpt)
    for run, straight in zip(resumed, ranks):
        assert run["first"] == SAVED_AT and len(run["grads"]) == STEPS - SAVED_AT
        for k in straight["rows"]:
            np.testing.assert_allclose(run["rows"][k], straight["rows"][k], rtol=0, atol=1e-6, err_msg=k)
            for s in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_allclose(run["moments"][k][s], straight["moments"][k][s], rtol=0, atol=1e-7)
    # and onto one rank: the moments as saved
    (one,) = run_multiprocess(_train, 1, optimizer=optimizer, ckpt="", resume=ckpt)
    for k, states in moments.items():
        for s in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(one["moments"][k][s], states[s])


def _refused(rank: int, world_size: int, optimizer: str) -> str:
    from rayemb.errors import ConfigError

    try:
        _built(optimizer, world_size, "row_wise", seed=0)
    except ConfigError as e:
        return str(e)
    return ""


def test_adam_on_a_sharded_cpu_table_is_one_config_error():
    for message in run_multiprocess(_refused, 2, optimizer="adam"):
        assert "train.embedding_optimizer" in message and "'a'" in message and "row_wise" in message, message
        assert "data_parallel" in message and "use_gpu" in message, message
