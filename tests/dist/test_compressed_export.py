"""The exported model of a job with compressed tables predicts what the sharded model predicts.

On 2 gloo ranks the job's own model code (``rayemb.train.worker.build.sharded_model``:
``build_model`` -> ``hybrid_from_placements`` reading each table plan's
``storage``, then ``DistributedModelParallel``) shards a DLRM whose tables are
QR-mult (table-wise), QR-add (data-parallel), QR-concat (column-wise), block
(row-wise), hybrid and plain, trains a few steps and writes a logical
checkpoint, whose meta.json records each compressed table's storage. Each rank
scores its half of the validation rows. ``rayemb export --checkpoint`` must
build an unsharded model with the same compression (physical tables and the
block projection) whose probabilities equal the sharded model's to 1e-5.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Optional

import numpy as np
import pytest

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 8
BATCH = 32
DIM = 8
#: table -> (placement, sharding type, hot ids, storage)
PLAN = {
    "C1": ("table_wise", "table_wise", None, {"compression": "qr", "buckets": 8, "combine": "mult"}),
    "C2": ("data_parallel", "data_parallel", None, {"compression": "qr", "combine": "add"}),
    "C3": ("column_wise", "column_wise", None, {"compression": "qr", "buckets": 6, "combine": "concat"}),
    "C4": ("row_wise", "row_wise", None, {"compression": "block", "block_dim": 4}),
    "C5": ("hybrid", "row_wise", np.arange(0, 10, 2), None),
    "C6": ("table_wise", "table_wise", None, None),
}


@dataclass(frozen=True)
class _Placement:
    placement: str
    sharding_type: str
    storage: Optional[Dict[str, Any]] = None


def _job_plan(cfg: Any, schema: Any, world_size: int) -> Any:
    import torch
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    from rayemb.embedding.placements import hybrid_from_placements
    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.contract.tables import table_configs
    from rayemb.train.sharding import JobPlan, build_model

    placements = {t: _Placement(p, s, st) for t, (p, s, _, st) in PLAN.items()}
    hot = {t: h for t, (p, _, h, _) in PLAN.items() if p == "hybrid"}
    _, constraints = hybrid_from_placements(table_configs(schema, DIM), placements, hot, device=torch.device("meta"))
    meta_model, _, _ = build_model(cfg, schema, placements, hot, torch.device("meta"), torch.device("meta"))
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                    constraints=constraints).collective_plan(meta_model, cpu_capable_sharders(),
                                                                             dist.GroupMember.WORLD)
    return JobPlan(sharding_plan=plan, placements=placements, hot_ids=hot, summary={})


def _train_score_rank(rank: int, world_size: int, cfg: Any, schema: Any, checkpoint: str) -> Dict[str, Any]:
    import torch

    from tests._export import train_save_score

    job_plan = _job_plan(cfg, schema, world_size)
    model, out = train_save_score(rank, world_size, cfg, schema, job_plan, checkpoint, STEPS, BATCH)
    planned = sorted(t for module_plan in job_plan.sharding_plan.plan.values() for t in module_plan)
    # the projection and the replicated rows are identical on both ranks (DDP-averaged, one optimizer step each)
    dense = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()
             if "projections" in k and isinstance(v, torch.Tensor)}
    return {**out, "planned": planned, "dense": dense}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from tests._export import small_dataset

    root = tmp_path_factory.mktemp("compressed_export")
    data = small_dataset(str(root / "data"))
    cfg = config_from_dict({
        "name": "compressed-export", "data": {"path": data, "batch_size": BATCH},
        "model": {"embedding_dim": DIM, "bottom_mlp": [16, DIM], "top_mlp": [16, 1]},
        "train": {"dense_lr": 0.1, "embedding_lr": 0.1},
        "tracking": {"output_dir": str(root / "runs"), "experiment": "compressed-export"},
    })
    schema = DatasetSchema.load(data)
    checkpoint = str(root / "checkpoint")
    ranks = run_multiprocess(_train_score_rank, 2, cfg=cfg, schema=schema, checkpoint=checkpoint)
    config_path = root / "job.yaml"
    config_path.write_text(cfg.to_yaml())
    return {"cfg": cfg, "schema": schema, "checkpoint": checkpoint, "config": str(config_path), "ranks": ranks}


def test_checkpoint_records_the_physical_tables_and_their_storage(job):
    meta = json.loads(open(f"{job['checkpoint']}/meta.json").read())
    assert meta["compression"] == {"C1": {"compression": "qr", "buckets": 8, "combine": "mult"},
                                   "C2": {"compression": "qr", "buckets": 8, "combine": "add"},  # ceil(sqrt(50))
                                   "C3": {"compression": "qr", "buckets": 6, "combine": "concat"},
                                   "C4": {"compression": "block", "block_dim": 4}}
    assert meta["tables"]["C1__q"] == {"num_embeddings": 8, "dim": DIM, "dtype": "fp32"}  # ceil(60 / 8)
    assert meta["tables"]["C3__r"] == {"num_embeddings": 6, "dim": DIM // 2, "dtype": "fp32"}
    assert meta["tables"]["C4__block"] == {"num_embeddings": 45, "dim": 4, "dtype": "fp32"}
    assert "C1" not in meta["tables"] and meta["tables"]["C6"]["num_embeddings"] == 35
    planned = job["ranks"][0]["planned"]
    assert {"C1__q", "C1__r", "C2__q", "C3__q", "C4__block", "C6"} <= set(planned), planned
    a, b = (r["dense"] for r in job["ranks"])
    assert a and all(np.array_equal(a[k], b[k]) for k in a)


def test_exported_compressed_model_predicts_what_the_sharded_model_predicts(job, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from rayemb.cli import main
    from rayemb.data.schema import parquet_files
    from rayemb.embedding.compressed import CompressedEmbeddingBagCollection
    from rayemb.serve.model import InferenceModel, sigmoid

    monkeypatch.chdir(tmp_path)
    valid = pq.read_table(parquet_files(job["cfg"].data.path, "valid"))
    half = valid.num_rows // 2
    sharded = np.concatenate([r["logits"] for r in sorted(job["ranks"], key=lambda r: r["lo"])])
    out = tmp_path / "model"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["export", "--checkpoint", job["checkpoint"], "--config", job["config"], "--out", str(out),
                 "--tracking-uri", uri, "--experiment", "compressed-export"]) == 0
    loaded = InferenceModel.load(str(out))
    emb = loaded.model.embedding
    assert isinstance(emb, CompressedEmbeddingBagCollection)
    assert {t: s.kind for t, s in emb.compression().items()} == {"C1": "qr", "C2": "qr", "C3": "qr", "C4": "block",
                                                                  "C5": "none", "C6": "none"}
    probs = loaded.predict(valid.slice(0, 2 * half))
    np.testing.assert_allclose(probs, sigmoid(sharded), rtol=0, atol=1e-5)
    assert probs.std() > 1e-3
    assert loaded.info["model"]["compression"]["C4"] == {"compression": "block", "block_dim": 4}
    assert loaded.info["torchscript"] is None  # the compressed module does not script; state dict + pyfunc only
