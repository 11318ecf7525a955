"""Tables of their own dims and a table two features read: planned, trained on 2 ranks, resharded to 3, exported.

The dataset's schema.yaml gives C1 ``embedding_dim: 16`` (the others the model's 8) and C5 ``table: C2``
(C5's bags read C2's rows; the batches' keys go table by table, C2 then C5, not in the schema's order).
rayemb's planner plans the job's DCN-v2 from the statistics pass (the shared table's counts over both
columns' ids), with C1 and the shared C2 hybrid, for 2 ranks and for 3; on 2 gloo ranks the job's model code
(``rayemb.train.worker.build.sharded_model``) trains a few steps and writes a logical checkpoint, each rank
scoring its half of the validation rows. ``reshard_checkpoint`` makes the checkpoint a 3-rank one, and the
3-rank model of the other plan that loads it must score every row as the 2-rank model did, to 1e-5.
``rayemb export`` must give a model whose logits, probabilities and MLflow pyfunc predictions equal the
sharded model's on the same rows to 1e-5.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict

import numpy as np
import pytest
import yaml

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 6
BATCH = 32
DIM = 8
PINS = {"C1": {"sharding": "hybrid"}, "C2": {"sharding": "hybrid"}, "C4": {"sharding": "column_wise"},
        "C3": {"sharding": "row_wise"}}


def _job_plan(cfg: Any, schema: Any, stats: Any, world_size: int) -> Any:
    """The job's plan for ``world_size`` CPU ranks, as the driver makes it (split, then rayemb's planner)."""
    from rayemb.planner.topology import described_topology
    from rayemb.train.sharding import make_job_plan
    from rayemb.train.world_plan import plan_world

    topology = described_topology(world_size, 1, compute_device="cpu")
    return plan_world(cfg, topology, stats,
                      plan_fn=lambda c, split, topo: make_job_plan(c, schema, stats, split, topo)).job_plan


def _train_rank(rank: int, world_size: int, cfg: Any, schema: Any, job_plan: Any, checkpoint: str) -> Dict[str, Any]:
    from tests._export import train_save_score

    _, out = train_save_score(rank, world_size, cfg, schema, job_plan, checkpoint, STEPS, BATCH)
    return out


def _restore_rank(rank: int, world_size: int, cfg: Any, schema: Any, job_plan: Any, checkpoint: str) -> np.ndarray:
    """Every validation row's logit from the model of ``job_plan`` that loaded ``checkpoint`` (each rank scores
    all rows: the sharded lookups are collectives)."""
    import pyarrow.parquet as pq
    import torch

    from rayemb.checkpoint.store import load_logical
    from rayemb.contract.tables import table_configs
    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import parquet_files
    from rayemb.train.worker.build import sharded_model

    torch.manual_seed(cfg.train.seed + 1)  # another initialisation: every scored weight must come from the file
    model, optimizer, remapper = sharded_model(cfg, schema, job_plan, torch.device("cpu"))
    tables = {t.name: (t.num_embeddings, t.embedding_dim) for t in table_configs(schema, cfg.model.embedding_dim)}
    load_logical(checkpoint, model, optimizer, remapper, tables)
    convert = BatchConverter(schema, cfg.data.id_policy, remap=remapper.remap)
    valid = pq.read_table(parquet_files(cfg.data.path, "valid"))
    model.eval()
    with torch.no_grad():
        out = [model(*(lambda b: (b.dense, b.sparse))(convert(valid.slice(s, BATCH)))).numpy()
               for s in range(0, valid.num_rows, BATCH)]
    return np.concatenate(out)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.stats import compute_stats
    from tests._export import small_dataset

    root = tmp_path_factory.mktemp("table_dims")
    data = small_dataset(str(root / "data"))
    doc = yaml.safe_load((root / "data" / "schema.yaml").read_text())
    for entry in doc["sparse"]:
        if entry["name"] == "C1":
            entry["embedding_dim"] = 16
        if entry["name"] == "C5":  # C5's ids (< 30) are rows of C2's table (50)
            del entry["num_embeddings"]
            entry["table"] = "C2"
    (root / "data" / "schema.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg = config_from_dict({
        "name": "table-dims", "data": {"path": data, "batch_size": BATCH},
        "model": {"embedding_dim": DIM, "name": "dcn_v2",
                  "args": {"cross_layers": 2, "bottom_mlp": [16, 8], "deep_mlp": [16, 8]}},
        "planner": {"tables": PINS},
        "train": {"dense_lr": 0.1, "embedding_lr": 0.1},
        "tracking": {"output_dir": str(root / "runs"), "experiment": "table-dims"},
    })
    schema = DatasetSchema.load(data)
    stats = schema.table_stats(compute_stats(data, exact=True, in_process=True))
    plans = {w: _job_plan(cfg, schema, stats, w) for w in (2, 3)}
    checkpoint = str(root / "checkpoint")
    ranks = run_multiprocess(_train_rank, 2, cfg=cfg, schema=schema, job_plan=plans[2], checkpoint=checkpoint)
    config_path = root / "job.yaml"
    config_path.write_text(cfg.to_yaml())
    return {"root": root, "cfg": cfg, "schema": schema, "stats": stats, "plans": plans, "checkpoint": checkpoint,
            "config": str(config_path), "ranks": ranks}


def _sharded(job) -> np.ndarray:
    logits = np.concatenate([r["logits"] for r in sorted(job["ranks"], key=lambda r: r["lo"])])
    assert np.isfinite(logits).all() and logits.std() > 1e-3  # trained: the rows get different scores
    return logits


def test_the_plan_holds_each_table_with_its_dim_and_the_shared_one_once(job):
    from rayemb.checkpoint.export import unsharded_state

    schema, plans = job["schema"], job["plans"]
    assert sorted(job["stats"].tables) == sorted(schema.table_names) and "C5" not in schema.table_names
    assert schema.pooled_features == ["C1", "C2", "C5", "C3", "C4", "C6"]
    for world, plan in plans.items():
        assert sorted(plan.placements) == sorted(schema.table_names), world
        assert {"C1", "C2"} <= set(plan.hot_ids), world  # both hybrid: hot rows of dim 16 and 8
        assert {"embedding.cold.d8", "embedding.cold.d16"} <= set(plan.sharding_plan.plan), world
    assert len(plans[2].hot_ids["C2"]) != len(plans[3].hot_ids["C2"])  # the 3-rank plan is another plan
    saved = unsharded_state(job["checkpoint"])
    assert sorted(saved["tables"]) == sorted(schema.table_names)  # the checkpoint's layout: by table
    assert tuple(saved["tables"]["C1"]["weight"].shape) == (60, 16)
    assert tuple(saved["tables"]["C2"]["weight"].shape) == (50, DIM)


def test_a_checkpoint_resharded_to_three_ranks_scores_as_the_two_rank_model(job, tmp_path):
    from rayemb.checkpoint.export import reshard_checkpoint

    sharded = _sharded(job)
    r3 = str(tmp_path / "r3")
    meta = reshard_checkpoint(job["checkpoint"], 3, r3)
    assert meta["world_size"] == 3 and meta["resharded_from"]["world_size"] == 2
    ranks = run_multiprocess(_restore_rank, 3, cfg=job["cfg"], schema=job["schema"], job_plan=job["plans"][3],
                             checkpoint=r3)
    for restored in ranks:
        np.testing.assert_allclose(restored[:len(sharded)], sharded, rtol=0, atol=1e-5)


def test_the_export_predicts_what_the_sharded_model_predicts(job, tmp_path, monkeypatch):
    import mlflow
    import pyarrow.parquet as pq
    from mlflow import MlflowClient

    from rayemb.cli import main
    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel, sigmoid

    monkeypatch.chdir(tmp_path)  # nothing MLflow writes may land in the repository
    monkeypatch.setattr(sys, "path", list(sys.path))
    sharded = _sharded(job)
    valid = pq.read_table(parquet_files(job["cfg"].data.path, "valid")).slice(0, len(sharded))
    out, uri = tmp_path / "model", f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["export", "--checkpoint", job["checkpoint"], "--config", job["config"], "--out", str(out),
                 "--tracking-uri", uri, "--experiment", "table-dims"]) == 0
    loaded = InferenceModel.load(str(out))
    assert loaded.schema.table_features("C2") == ["C2", "C5"]
    np.testing.assert_allclose(loaded.logits(valid), sharded, rtol=0, atol=1e-5)
    np.testing.assert_allclose(loaded.predict(valid), sigmoid(sharded), rtol=0, atol=1e-5)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("table-dims").experiment_id])
    mlflow.set_tracking_uri(uri)
    try:
        got = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model").predict(valid.to_pandas())
    finally:
        mlflow.set_tracking_uri("")
    np.testing.assert_allclose(got["prediction"].to_numpy(), sigmoid(sharded), rtol=0, atol=1e-5)
    assert os.path.isdir(out)
