"""A two-tower retrieval model exports pair scores, user vectors and item vectors equal to the sharded model's.

A tiny MovieLens file (``rayemb convert movielens``: one-hot ``user`` and ``item``, multi-hot ``history``,
dense ``history_length``) trains ``model.name: two_tower`` on 2 gloo ranks with the job's own model code
(``rayemb.train.worker.build.sharded_model``; ``item`` row-wise, ``user`` column-wise, ``history`` table-wise) and
the job's loss (the in-batch softmax over both ranks' candidates) for a few steps, then writes a logical
checkpoint. Each rank computes ``(query, candidate)`` of its half of the validation rows, and the ranks
together the candidate of every item id (``rayemb.train.worker.retrieval.catalogue_vectors``, what validation
scores against). ``rayemb export --checkpoint`` must give a model whose pyfunc, loaded in a fresh process,
returns per row the pair score ``query . candidate`` (the default output), the query (``user_embedding``)
and, for every item id, the candidate (``item_embedding``), each equal to the sharded model's to 1e-5; the
export's ``items.parquet`` and ``InferenceModel.item_embeddings()`` hold the whole catalogue (one row per id
of the item table).
"""

from __future__ import annotations

import json
from typing import Any, Dict

import numpy as np
import pytest

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 8
BATCH = 32
DIM = 8
USERS, ITEMS = 64, 40
#: the two-tower's args; temperature 0.5 keeps the scores (|score| <= 1 / temperature) where float32 rounding
#: of a d-term dot product stays far below the 1e-5 the test asks for
ARGS = {"item_feature": "item", "tower_mlp": [16, DIM], "temperature": 0.5}


def _ratings(path: str, seed: int = 0) -> None:
    """``ratings.dat`` of USERS users with 12 ratings each over ITEMS items (MovieLens' ``::`` format)."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for u in range(1, USERS + 1):
            for k, m in enumerate(rng.choice(ITEMS, size=12, replace=False)):
                f.write(f"{u}::{m + 1}::{int(rng.integers(1, 6))}::{1_000_000 + 100 * u + k}\n")


def _job_plan(cfg: Any, schema: Any, world_size: int) -> Any:
    """TorchRec's plan of the job's two-tower model: item row-wise, user column-wise (shards of DIM/2), history
    table-wise."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints

    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.train.sharding import JobPlan, build_model

    meta_model, _, _ = build_model(cfg, schema, {}, {}, torch.device("meta"), torch.device("meta"))
    constraints = {"item": ParameterConstraints(sharding_types=["row_wise"]),
                   "user": ParameterConstraints(sharding_types=["column_wise"], min_partition=DIM // 2),
                   "history": ParameterConstraints(sharding_types=["table_wise"])}
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                    constraints=constraints).collective_plan(meta_model, cpu_capable_sharders(),
                                                                             dist.GroupMember.WORLD)
    return JobPlan(sharding_plan=plan, placements={}, hot_ids={}, summary={})


def _train_score_rank(rank: int, world_size: int, cfg: Any, schema: Any, checkpoint: str) -> Dict[str, Any]:
    import pyarrow.parquet as pq
    import torch

    from rayemb.checkpoint.store import save_logical
    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import parquet_files
    from rayemb.contract.model import model_inputs
    from rayemb.contract.tables import table_configs
    from rayemb.train.worker.build import sharded_model
    from rayemb.train.worker.retrieval import InBatchSoftmax, catalogue_vectors, item_feature_of

    cpu = torch.device("cpu")
    torch.manual_seed(cfg.train.seed)
    job_plan = _job_plan(cfg, schema, world_size)
    model, optimizer, remapper = sharded_model(cfg, schema, job_plan, cpu)
    item = item_feature_of(model)
    convert = BatchConverter(schema, cfg.data.id_policy, remap=remapper.remap, keep_ids=item)
    loss_fn = InBatchSoftmax()  # every rank's candidates are each row's negatives
    train = pq.read_table(parquet_files(cfg.data.path, "train"))
    for step in range(STEPS):
        b = convert(train.slice((step * world_size + rank) * BATCH, BATCH))
        loss = loss_fn(model(*model_inputs(b, cpu)), b.ids)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tables = {t.name: (t.num_embeddings, t.embedding_dim) for t in table_configs(schema, cfg.model.embedding_dim)}
    save_logical(checkpoint, model, optimizer, remapper, tables, {"epoch": 0, "step": STEPS, "epoch_complete": True})
    valid = pq.read_table(parquet_files(cfg.data.path, "valid"))
    half = valid.num_rows // world_size
    model.eval()
    with torch.no_grad():
        query, candidate = model(*model_inputs(convert(valid.slice(rank * half, half)), cpu))
        catalogue = catalogue_vectors(model, convert.candidates, schema.feature(item).num_embeddings, BATCH, cpu)
    sharding = {p: str(ps.sharding_type) for plan in job_plan.sharding_plan.plan.values() for p, ps in plan.items()}
    return {"lo": rank * half, "query": query.numpy(), "candidate": candidate.numpy(), "catalogue": catalogue.numpy(),
            "item": item, "sharding": sharding}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from rayemb.cli import main
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema

    root = tmp_path_factory.mktemp("retrieval_export")
    data = str(root / "data")
    _ratings(str(root / "ratings.dat"))
    assert main(["convert", "movielens", "--input", str(root / "ratings.dat"), "--out", data]) == 0
    cfg = config_from_dict({
        "name": "retrieval-export", "data": {"path": data, "batch_size": BATCH},
        "model": {"name": "two_tower", "embedding_dim": DIM, "args": ARGS},
        "train": {"dense_lr": 0.1, "embedding_lr": 0.1},
        "tracking": {"output_dir": str(root / "runs"), "experiment": "retrieval-export"},
    })
    schema = DatasetSchema.load(data)
    checkpoint = str(root / "checkpoint")
    ranks = run_multiprocess(_train_score_rank, 2, cfg=cfg, schema=schema, checkpoint=checkpoint)
    (root / "job.yaml").write_text(cfg.to_yaml())
    return {"data": data, "schema": schema, "checkpoint": checkpoint, "config": str(root / "job.yaml"),
            "ranks": sorted(ranks, key=lambda r: r["lo"])}


def test_the_export_serves_the_sharded_models_scores_and_vectors(job, tmp_path, monkeypatch):
    import pyarrow.parquet as pq
    from mlflow import MlflowClient

    from rayemb.cli import main
    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel
    from tests._pyfunc import fresh_pyfunc

    ranks = job["ranks"]
    assert ranks[0]["item"] == "item"
    sharding = ranks[0]["sharding"]
    assert (sharding["item"], sharding["user"], sharding["history"]) == ("row_wise", "column_wise", "table_wise")
    query = np.concatenate([r["query"] for r in ranks])
    candidate = np.concatenate([r["candidate"] for r in ranks])
    scores = (query.astype(np.float64) * candidate.astype(np.float64)).sum(-1)
    catalogue = ranks[0]["catalogue"]
    items = job["schema"].feature("item").num_embeddings
    assert catalogue.shape == (items, DIM) and np.array_equal(catalogue, ranks[1]["catalogue"])
    assert scores.std() > 1e-2  # trained: the rows get different scores

    monkeypatch.chdir(tmp_path)  # nothing MLflow writes may land in the repository
    files = parquet_files(job["data"], "valid")
    valid = pq.read_table(files)
    assert valid.num_rows == len(query)  # both ranks scored every validation row
    out, uri = tmp_path / "model", f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["export", "--checkpoint", job["checkpoint"], "--config", job["config"], "--out", str(out),
                 "--tracking-uri", uri, "--experiment", "retrieval-export"]) == 0
    info = json.loads((out / "model.json").read_text())
    assert info["retrieval"] == {"item_feature": "item", "items": "items.parquet", "rows": items, "dim": DIM}

    # the whole catalogue: in the export's items.parquet and from the reloaded model, one row per item id
    table = pq.read_table(out / "items.parquet")
    assert table.column("item").to_pylist() == list(range(items))
    np.testing.assert_allclose(np.array(table.column("item_embedding").to_pylist()), catalogue, rtol=0, atol=1e-5)
    loaded = InferenceModel.load(str(out))
    np.testing.assert_allclose(loaded.item_embeddings(), catalogue, rtol=0, atol=1e-5)

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("retrieval-export").experiment_id])
    ids = [7, 0, items - 1, 7, *range(items)]  # any order, repeats allowed
    default, users, vectors = fresh_pyfunc(uri, f"runs:/{run.info.run_id}/model", files, [
        {}, {"params": {"output": "user_embedding"}},
        {"params": {"output": "item_embedding"}, "frame": {"item": ids}}], str(tmp_path))
    assert list(default) == ["score"] and list(users) == ["user_embedding"] and list(vectors) == ["item_embedding"]
    np.testing.assert_allclose(default["score"], scores, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.array(users["user_embedding"]), query, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.array(vectors["item_embedding"]), catalogue[ids], rtol=0, atol=1e-5)
