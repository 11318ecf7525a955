"""rayemb.train.checkpoint: per-rank checkpoints of a sharded model round-trip exactly and refuse other layouts.

Two gloo ranks shard one EmbeddingBagCollection under ``DistributedModelParallel``
with a table-wise, a column-wise, a row-wise and a data-parallel table, fused
row-wise Adagrad in backward for the sharded tables and TorchRec's
``RowWiseAdagrad`` for the data-parallel one (as the training loop does). After
2 steps each rank saves, trains 2 more steps (every row is looked up every
step, so every weight and optimizer state changes), loads, and checks every
tensor of the model and optimizer state dicts (each local shard of a
ShardedTensor) equals the saved one exactly. A model whose table is column-wise
where the checkpoint has it table-wise is refused with a DataError naming the
file. The driver-side ``check_checkpoint_dir`` checks run in this process.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any, Dict

import pytest
import torch

from rayemb.errors import DataError
from rayemb.multiprocess import run_multiprocess
from rayemb.train.checkpoint import check_checkpoint_dir, rank_file, write_meta

WORLD_SIZE = 2
LOCAL_BATCH = 4
DIM = 8
LR = 0.1
# table -> (rows, sharding type); t3 is data-parallel (dense kernel, a regular optimizer)
TABLES = {"t0": (24, "table_wise"), "t1": (16, "column_wise"), "t2": (12, "row_wise"), "t3": (10, "data_parallel")}
OTHER_LAYOUT = {"t0": "column_wise", "t1": "table_wise"}  # t0 saved table-wise, loaded column-wise


def _build(world_size: int, layout: Dict[str, str]):
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from rayemb.embedding.sharders import cpu_capable_sharders

    tables = [EmbeddingBagConfig(name=n, embedding_dim=DIM, num_embeddings=rows, feature_names=[f"f_{n}"],
                                 pooling=PoolingType.SUM) for n, (rows, _) in TABLES.items()]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": LR})
    constraints = {
        n: ParameterConstraints(sharding_types=[layout[n]],
                                compute_kernels=["dense" if layout[n] == "data_parallel" else "fused"],
                                min_partition=DIM // 2)
        for n in TABLES
    }
    sharders = cpu_capable_sharders()
    topology = Topology(world_size=world_size, local_world_size=world_size, compute_device="cpu")
    plan = EmbeddingShardingPlanner(topology=topology, constraints=constraints).collective_plan(
        ebc, sharders, dist.GroupMember.WORLD)
    assert {n: ps.sharding_type for n, ps in plan.plan[""].items()} == layout
    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    assert [n.rsplit(".", 2)[-2] for n in dense] == ["t3"], list(dense)
    optimizer = CombinedOptimizer([model.fused_optimizer,
                                   KeyedOptimizerWrapper(dense, lambda ps: RowWiseAdagrad(ps, lr=LR))])
    return model, optimizer


def _batch(step: int):
    """Every row of every table in this rank's batch (ids spread over the samples), shifted by step."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    values, lengths = [], []
    for rows, _ in TABLES.values():
        ids = (torch.arange(rows) + step) % rows
        values += [ids[i::LOCAL_BATCH] for i in range(LOCAL_BATCH)]
        lengths += [len(ids[i::LOCAL_BATCH]) for i in range(LOCAL_BATCH)]
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{n}" for n in TABLES], values=torch.cat(values),
                                               lengths=torch.tensor(lengths))


def _train(model, optimizer, rank: int, steps: range) -> None:
    w = torch.linspace(-1.0, 1.0, LOCAL_BATCH * DIM).reshape(LOCAL_BATCH, DIM) * (rank + 1)
    for step in steps:
        out = model(_batch(step)).to_dict()
        loss = sum((out[f"f_{n}"] * w * (i + 1)).sum() for i, n in enumerate(TABLES))
        optimizer.zero_grad()
        loss.backward()  # also the fused optimizer
        optimizer.step()


def _flatten(value: Any, prefix: str = "") -> Dict[str, Any]:
    """Every tensor (each local shard of a ShardedTensor, by offsets) and leaf of a nested state dict, cloned."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out: Dict[str, Any] = {}
    if isinstance(value, ShardedTensor):
        for s in value.local_shards():
            out[f"{prefix}@{list(s.metadata.shard_offsets)}"] = s.tensor.detach().clone()
        out[f"{prefix}#local_shards"] = len(value.local_shards())
    elif isinstance(value, dict):
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}/{k}"))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}[{i}]"))
    elif isinstance(value, torch.Tensor):
        out[prefix] = value.detach().clone()
    else:
        out[prefix] = value
    return out


def _snapshot(model, optimizer) -> Dict[str, Any]:
    return {**_flatten(model.state_dict(), "model"), **_flatten(optimizer.state_dict(), "optimizer")}


def _differs(a: Any, b: Any) -> bool:
    return not torch.equal(a, b) if isinstance(a, torch.Tensor) else a != b


def _checkpoint_rank(rank: int, world_size: int, directory: str) -> Dict[str, Any]:
    from rayemb.logs import quiet_third_party_logs
    from rayemb.train.checkpoint import load_rank, save_rank

    quiet_third_party_logs()
    torch.manual_seed(0)
    layout = {n: t for n, (_, t) in TABLES.items()}
    model, optimizer = _build(world_size, layout)
    _train(model, optimizer, rank, range(0, 2))
    saved = _snapshot(model, optimizer)
    path = save_rank(directory, rank, model, optimizer, {"epoch": 1, "step": 2})
    assert path == rank_file(directory, rank) and not os.path.exists(f"{path}.tmp")

    _train(model, optimizer, rank, range(2, 4))
    trained = _snapshot(model, optimizer)
    assert trained.keys() == saved.keys()
    tensors = [k for k, v in saved.items() if isinstance(v, torch.Tensor)]
    changed = [k for k in tensors if _differs(saved[k], trained[k])]
    weights = [k for k in tensors if k.startswith("model/")]
    opt_state = [k for k in tensors if k.startswith("optimizer/state/")]
    assert len(weights) == 3 + any(".t0." in k for k in weights)  # t0 (table-wise) is on one rank only
    assert sum("momentum1" in k for k in opt_state) == len(weights) - 1  # fused tables: t0-t2
    assert {k.rsplit("/", 1)[1] for k in opt_state if ".t3." in k} == {"step", "sum"}  # RowWiseAdagrad of t3
    # every table weight (each local shard) and optimizer state this rank holds moved in steps 3-4
    assert set(weights) | set(opt_state) <= set(changed), sorted(set(weights) | set(opt_state) - set(changed))

    extra = load_rank(directory, rank, model, optimizer)
    assert extra == {"epoch": 1, "step": 2}
    loaded = _snapshot(model, optimizer)
    assert loaded.keys() == saved.keys()
    mismatched = [k for k in saved if _differs(saved[k], loaded[k])]
    assert not mismatched, mismatched

    plain = torch.load(path, map_location="cpu", weights_only=True)
    assert set(plain) == {"model", "optimizer", "epoch", "step"}

    # the same tables under another layout: refused, naming the file
    other, other_opt = _build(world_size, {**layout, **OTHER_LAYOUT})
    with pytest.raises(DataError) as e:
        load_rank(directory, rank, other, other_opt)
    assert e.value.category == "bad_checkpoint"
    return {"path": path, "error": str(e.value), "n_tensors": len(tensors),
            "local_shards": {k: v for k, v in saved.items() if k.endswith("#local_shards")}}


@pytest.mark.timeout(180)
def test_sharded_checkpoint_round_trips_exactly_and_refuses_another_layout(tmp_path):
    results = run_multiprocess(_checkpoint_rank, WORLD_SIZE, timeout_s=170, directory=str(tmp_path))
    for rank, r in enumerate(results):
        assert r["path"] == os.path.join(str(tmp_path), f"rank{rank}.pt")
        assert r["error"].startswith(f"Checkpoint file {r['path']!r} cannot be loaded (ValueError: model.")
        assert "it was written with another plan or world size" in r["error"]
        assert "train.resume_from" in r["error"]
    # t0 (table-wise) lives on one rank only; t1 (column-wise) and t2 (row-wise) have a shard on each
    shards = [r["local_shards"] for r in results]
    t0 = [sum(v for k, v in s.items() if k.startswith("model/") and ".t0." in k) for s in shards]
    assert sorted(t0) == [0, 1]
    for table in ("t1", "t2"):
        assert [sum(v for k, v in s.items() if k.startswith("model/") and f".{table}." in k) for s in shards] == [1, 1]
    for rank in range(WORLD_SIZE):
        # a plain-tensor file: loads without unpickling any code
        state = torch.load(rank_file(str(tmp_path), rank), weights_only=True)
        assert state["epoch"] == 1 and state["step"] == 2


# ---- driver side: check_checkpoint_dir ---- #


def _write_checkpoint(directory, world_size: int = 2, fingerprint="plan-abc") -> None:
    os.makedirs(directory, exist_ok=True)
    for r in range(world_size):
        torch.save({"model": {"w": torch.full((256,), 7.0 + r)}, "epoch": 0, "step": 10}, rank_file(str(directory), r))
    write_meta(str(directory), {"world_size": world_size, "plan_fingerprint": fingerprint, "epoch": 0, "step": 10})


def test_check_checkpoint_dir_accepts_a_complete_checkpoint(tmp_path):
    _write_checkpoint(tmp_path)
    meta = check_checkpoint_dir(str(tmp_path), 2, "plan-abc")
    assert meta == {"world_size": 2, "plan_fingerprint": "plan-abc", "epoch": 0, "step": 10}
    assert check_checkpoint_dir(str(tmp_path), 2) == meta  # no fingerprint to compare
    _write_checkpoint(tmp_path / "old", fingerprint=None)  # written before fingerprints: accepted
    assert check_checkpoint_dir(str(tmp_path / "old"), 2, "plan-xyz")["world_size"] == 2


def _error(directory, world_size: int = 2, fingerprint="plan-abc") -> str:
    with pytest.raises(DataError) as e:
        check_checkpoint_dir(str(directory), world_size, fingerprint)
    assert e.value.category == "bad_checkpoint"
    return str(e.value)


def test_check_checkpoint_dir_world_size_mismatch(tmp_path):
    _write_checkpoint(tmp_path)
    assert _error(tmp_path, 4).startswith(f"Checkpoint {str(tmp_path)!r} was written by 2 ranks; this job has 4. ")


def test_check_checkpoint_dir_plan_fingerprint_mismatch(tmp_path):
    _write_checkpoint(tmp_path)
    assert _error(tmp_path, 2, "plan-xyz").startswith(
        f"Checkpoint {str(tmp_path)!r} was written with plan plan-abc; this job plans plan-xyz ")


def test_check_checkpoint_dir_missing_rank_file(tmp_path):
    _write_checkpoint(tmp_path)
    os.remove(rank_file(str(tmp_path), 1))
    msg = _error(tmp_path)
    assert msg.startswith(f"Checkpoint {str(tmp_path)!r} (train.resume_from): rank1.pt is missing. ")
    assert "rank0.pt" not in msg


def test_check_checkpoint_dir_truncated_file(tmp_path):
    _write_checkpoint(tmp_path)
    path = rank_file(str(tmp_path), 0)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    msg = _error(tmp_path)
    assert msg.startswith(f"Checkpoint {str(tmp_path)!r} (train.resume_from): rank0.pt is not a readable checkpoint (")
    assert "rank1.pt" not in msg


def test_check_checkpoint_dir_corrupt_member(tmp_path):
    _write_checkpoint(tmp_path)
    path = rank_file(str(tmp_path), 1)
    data = bytearray(open(path, "rb").read())
    i = data.find(torch.full((64,), 8.0).numpy().tobytes())
    assert i > 0
    data[i + 5] ^= 0xFF  # a flipped bit inside the tensor data: the member's CRC no longer matches
    open(path, "wb").write(bytes(data))
    assert zipfile.is_zipfile(path)
    msg = _error(tmp_path)
    assert "rank1.pt is corrupt (member " in msg and "rank0.pt" not in msg


def test_check_checkpoint_dir_missing_dir_or_meta(tmp_path):
    assert "does not exist" in _error(tmp_path / "nope")
    _write_checkpoint(tmp_path)
    os.remove(tmp_path / "meta.json")
    assert "has no readable meta.json" in _error(tmp_path)
    (tmp_path / "meta.json").write_text("{not json")
    assert "has no readable meta.json" in _error(tmp_path)


def test_every_problem_is_listed(tmp_path):
    _write_checkpoint(tmp_path, world_size=3)
    os.remove(rank_file(str(tmp_path), 0))
    with open(rank_file(str(tmp_path), 2), "r+b") as f:
        f.truncate(100)
    msg = _error(tmp_path, 3)
    assert "rank0.pt is missing; rank2.pt is not a readable checkpoint" in msg

