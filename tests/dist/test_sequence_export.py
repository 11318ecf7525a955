"""A model with a user-history tower exports and predicts what the sharded training model predicts.

On 2 gloo ranks the job's own model code (``rayemb.train.worker.build.sharded_model``)
shards a DLRM with the ``attention`` tower over a dataset with a sequence
feature ``H1`` (its ``sequence`` EmbeddingCollection row-wise over both ranks,
the pooled tables table- and row-wise), trains a few steps, writes a
checkpoint and scores its half of the validation rows. ``rayemb export
--checkpoint`` must give a model whose probabilities equal the sharded model's
to 1e-5, reloaded from disk and through the pyfunc model it logs; it must
write no TorchScript form (the history branch is skipped under scripting).
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
HISTORY = 6


def _job_plan(cfg: Any, schema: Any, world_size: int) -> Any:
    """TorchRec's plan of the job's DLRM: H1 and C1 row-wise, the other pooled tables table-wise."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints

    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.train.sharding import JobPlan, build_model

    meta_model, _, _ = build_model(cfg, schema, {}, {}, torch.device("meta"), torch.device("meta"))
    constraints = {"H1": ParameterConstraints(sharding_types=["row_wise"]),
                   "C1": ParameterConstraints(sharding_types=["row_wise"])}
    constraints.update({n: ParameterConstraints(sharding_types=["table_wise"]) for n in schema.sparse_names[1:]})
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                    constraints=constraints).collective_plan(meta_model, cpu_capable_sharders(),
                                                                             dist.GroupMember.WORLD)
    return JobPlan(sharding_plan=plan, placements={}, hot_ids={}, summary={})


def _train_score_rank(rank: int, world_size: int, cfg: Any, schema: Any, checkpoint: str) -> Dict[str, Any]:
    from tests._export import train_save_score

    job_plan = _job_plan(cfg, schema, world_size)
    model, out = train_save_score(rank, world_size, cfg, schema, job_plan, checkpoint, STEPS, BATCH)
    sharding = {name: {p: str(ps.sharding_type) for p, ps in module_plan.items()}
                for name, module_plan in job_plan.sharding_plan.plan.items()}
    return {**out, "sharding": sharding}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.synthetic import SyntheticSpec, generate

    root = tmp_path_factory.mktemp("seq_export")
    data = str(root / "data")
    generate(SyntheticSpec(rows=1000, num_tables=3, seed=3, cardinalities=[60, 50, 40], valid_fraction=0.2,
                           sequence_length=HISTORY), data)
    cfg = config_from_dict({
        "name": "seq-export", "data": {"path": data, "batch_size": BATCH},
        "model": {"embedding_dim": DIM, "bottom_mlp": [16, DIM], "top_mlp": [16, 1], "sequence_tower": "attention"},
        "train": {"dense_lr": 0.1, "embedding_lr": 0.1},
        "tracking": {"output_dir": str(root / "runs"), "experiment": "seq-export"},
    })
    schema = DatasetSchema.load(data)
    assert schema.sequence_names == ["H1"]
    checkpoint = str(root / "checkpoint")
    ranks = run_multiprocess(_train_score_rank, 2, cfg=cfg, schema=schema, checkpoint=checkpoint)
    config_path = root / "job.yaml"
    config_path.write_text(cfg.to_yaml())
    return {"cfg": cfg, "schema": schema, "checkpoint": checkpoint, "config": str(config_path), "ranks": ranks}


@pytest.fixture(scope="module")
def exported(job, tmp_path_factory):
    """``rayemb export --checkpoint`` of the job's checkpoint (run from a scratch directory: nothing MLflow
    writes may land in the repository)."""
    import os

    from rayemb.cli import main

    root = tmp_path_factory.mktemp("seq_export_out")
    out, uri = root / "model", f"sqlite:///{root}/mlflow.db"
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["export", "--checkpoint", job["checkpoint"], "--config", job["config"], "--out", str(out),
                     "--tracking-uri", uri, "--experiment", "seq-export"]) == 0
    finally:
        os.chdir(cwd)
    return {"out": out, "uri": uri}


def _valid_and_sharded(job) -> tuple:
    """The validation rows both ranks scored, and the sharded model's logits of them."""
    import pyarrow.parquet as pq

    from rayemb.data.schema import parquet_files

    valid = pq.read_table(parquet_files(job["cfg"].data.path, "valid"))
    half = valid.num_rows // 2
    sharded = np.concatenate([r["logits"] for r in sorted(job["ranks"], key=lambda r: r["lo"])])
    assert sharded.shape == (2 * half,) and np.isfinite(sharded).all()
    return valid.slice(0, 2 * half), sharded


def test_exported_sequence_model_predicts_what_the_sharded_model_predicts(job, exported, monkeypatch, tmp_path):
    import mlflow
    import torch
    from mlflow import MlflowClient

    from rayemb.serve.model import InferenceModel, sigmoid

    assert job["ranks"][0]["sharding"]["sequence"]["H1"].endswith("row_wise")
    monkeypatch.chdir(tmp_path)
    rows, sharded = _valid_and_sharded(job)
    out, uri = exported["out"], exported["uri"]
    loaded = InferenceModel.load(str(out))
    assert loaded.sequence and loaded.info["model"]["sequence_tower"] == "attention"
    probs = loaded.predict(rows)
    np.testing.assert_allclose(probs, sigmoid(sharded), rtol=0, atol=1e-5)
    assert probs.std() > 1e-3
    # the history matters: the same rows with every history emptied score differently
    emptied = rows.set_column(rows.column_names.index("H1"), "H1",
                              pyarrow_empty_lists(rows.num_rows))
    assert np.abs(loaded.predict(emptied) - probs).max() > 1e-3
    state = torch.load(out / "model.pt", weights_only=True)
    assert tuple(state["sequence.embeddings.H1.weight"].shape) == (job["schema"].sequence[0].num_embeddings, DIM)
    info = json.loads((out / "model.json").read_text())
    assert info["torchscript"] is None and "TorchScript" in info["torchscript_skipped"]
    assert sorted(p.name for p in out.iterdir()) == ["model.json", "model.pt"]
    with pytest.raises(Exception, match="H1"):  # the history column is an input
        loaded.predict(rows.drop(["H1"]))

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("seq-export").experiment_id])
    mlflow.set_tracking_uri(uri)
    try:
        pyfunc = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
        inputs = {c.name: str(c.type) for c in pyfunc.metadata.get_input_schema().inputs}
        got = pyfunc.predict(rows.to_pandas())["prediction"].to_numpy()
    finally:
        mlflow.set_tracking_uri("")
    assert "H1" in inputs and "long" in inputs["H1"]
    np.testing.assert_allclose(got, sigmoid(sharded), rtol=0, atol=1e-5)


def pyarrow_empty_lists(n: int) -> Any:
    import pyarrow as pa

    return pa.array([[] for _ in range(n)], type=pa.list_(pa.int64()))


def test_rayemb_predict_scores_the_history(job, exported, ray_2_cpus, tmp_path, capsys):
    """``rayemb predict`` (Ray Data) reads the history column and gives the sharded model's probabilities;
    input without it fails before any work, naming the column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayemb.cli import main
    from rayemb.serve.model import sigmoid

    rows, sharded = _valid_and_sharded(job)
    data = tmp_path / "valid"
    data.mkdir()
    pq.write_table(rows, data / "part-00000.parquet")
    preds = tmp_path / "preds"
    assert main(["predict", "--model", str(exported["out"]), "--data", str(data), "--out", str(preds)]) == 0
    table = pa.concat_tables([pq.read_table(f) for f in sorted(preds.glob("*.parquet"))])
    np.testing.assert_allclose(table.column("prediction").to_numpy(), sigmoid(sharded), rtol=0, atol=1e-5)

    bad = tmp_path / "no_history"
    bad.mkdir()
    pq.write_table(rows.drop(["H1"]), bad / "part-00000.parquet")
    assert main(["predict", "--model", str(exported["out"]), "--data", str(bad), "--out", str(tmp_path / "x")]) == 2
    assert "['H1']" in capsys.readouterr().err and not (tmp_path / "x").exists()
