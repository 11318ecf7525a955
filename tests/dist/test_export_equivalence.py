"""The exported inference model predicts what the sharded training model predicts.

On 2 gloo ranks, the job's own model code (``rayemb.train.worker.build.sharded_model``:
``build_model`` + ``DistributedModelParallel``) shards a DLRM over a
multi-hot dataset with a plan that has hybrid tables (cold halves row- and
column-wise), plain row-, column- and table-wise tables and a data-parallel
table, trains a few steps and writes a checkpoint with rayemb's checkpoint
store. Each rank then scores its half of the validation rows on the sharded
model. ``rayemb export --checkpoint`` must give a plain model whose
probabilities on every validation row equal the sharded model's to 1e-5, as
must its TorchScript form and the pyfunc model it logs to MLflow. The dataset's
dense column I1 goes below 0 under ``standardize`` (mean and std from the
statistics pass), I2 is clipped and I3 is bucketized (a sparse feature of its
own, a hybrid table whose hot rows are bucket ids): serving applies the
transforms training applied, the TorchScript form's ``forward_raw`` on the raw
values too.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import pytest

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 8
BATCH = 32
DIM = 8
#: table -> (placement, sharding type of the table / of a hybrid table's cold half, hot ids)
PLAN = {
    "C1": ("hybrid", "row_wise", np.arange(0, 24, 2)),
    "C2": ("hybrid", "column_wise", np.array([1, 2, 3, 5, 8])),
    "C3": ("row_wise", "row_wise", None),
    "C4": ("column_wise", "column_wise", None),
    "C5": ("table_wise", "table_wise", None),
    "C6": ("data_parallel", "data_parallel", None),
    "I3": ("hybrid", "row_wise", np.array([0, 2])),
}
BUCKETS = [1, 3, 8]


def _job_plan(cfg: Any, schema: Any, world_size: int) -> Any:
    """The JobPlan of PLAN for the job's DLRM: TorchRec's planner with rayemb's constraints (column shards of 4)."""
    from tests._export import fixed_job_plan

    return fixed_job_plan(cfg, schema, PLAN, DIM, world_size)


def _train_score_rank(rank: int, world_size: int, cfg: Any, schema: Any, checkpoint: str) -> Dict[str, Any]:
    from tests._export import train_save_score

    job_plan = _job_plan(cfg, schema, world_size)
    model, out = train_save_score(rank, world_size, cfg, schema, job_plan, checkpoint, STEPS, BATCH)
    sharding = {name: {p: str(ps.sharding_type) for p, ps in module_plan.items()}
                for name, module_plan in job_plan.sharding_plan.plan.items()}
    shards = {k: len(v.local_shards()) for k, v in model.state_dict().items() if hasattr(v, "local_shards")}
    return {**out, "sharding": sharding, "shards": shards}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from rayemb.config import config_from_dict
    from tests._export import small_dataset

    from rayemb.data.stats import compute_stats
    from tests._dense import declare_transforms

    root = tmp_path_factory.mktemp("export_eq")
    data = declare_transforms(small_dataset(str(root / "data")), {"I1": "standardize", "I2": {"clip": [0.0, 4.0]},
                                                                  "I3": {"bucketize": BUCKETS}}, {"I1": -5.0})
    cfg = config_from_dict({
        "name": "export-eq", "data": {"path": data, "batch_size": BATCH},
        "model": {"embedding_dim": DIM, "bottom_mlp": [16, DIM], "top_mlp": [16, 1]},
        "train": {"dense_lr": 0.1, "embedding_lr": 0.1},
        "tracking": {"output_dir": str(root / "runs"), "experiment": "export-eq"},
    })
    from rayemb.data.schema import DatasetSchema

    schema = DatasetSchema.load(data).with_dense_params(compute_stats(data, in_process=True))
    checkpoint = str(root / "checkpoint")
    ranks = run_multiprocess(_train_score_rank, 2, cfg=cfg, schema=schema, checkpoint=checkpoint)
    config_path = root / "job.yaml"
    config_path.write_text(cfg.to_yaml())
    return {"root": root, "cfg": cfg, "schema": schema, "checkpoint": checkpoint, "config": str(config_path),
            "ranks": ranks}


def test_plan_has_every_placement(job):
    sharding = {}
    for module_plan in job["ranks"][0]["sharding"].values():
        sharding.update(module_plan)
    from rayemb.embedding.remap import COLD_SUFFIX, HOT_SUFFIX

    assert sharding["C1" + COLD_SUFFIX].endswith("row_wise") and sharding["C1" + HOT_SUFFIX].endswith("data_parallel")
    assert sharding["C2" + COLD_SUFFIX].endswith("column_wise") and sharding["C4"].endswith("column_wise")
    assert sharding["C3"].endswith("row_wise") and sharding["C5"].endswith("table_wise")
    assert sharding["C6"].endswith("data_parallel")
    assert sharding["I3" + COLD_SUFFIX].endswith("row_wise") and sharding["I3" + HOT_SUFFIX].endswith("data_parallel")
    # column-wise tables really are split in two shards of DIM/2 columns (one per rank)
    col = [k for k in job["ranks"][0]["shards"] if ".C4." in k or f".C2{COLD_SUFFIX}." in k]
    assert col and all(job["ranks"][0]["shards"][k] + job["ranks"][1]["shards"][k] == 2 for k in col)


def test_exported_model_predicts_what_the_sharded_model_predicts(job, tmp_path, monkeypatch):
    import pyarrow.parquet as pq
    import torch

    from rayemb.checkpoint.export import unsharded_state
    from rayemb.cli import main
    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel, inference_state, model_config, sigmoid

    monkeypatch.chdir(tmp_path)  # nothing MLflow writes may land in the repository
    valid = pq.read_table(parquet_files(job["cfg"].data.path, "valid"))
    half = valid.num_rows // 2
    sharded = np.concatenate([r["logits"] for r in sorted(job["ranks"], key=lambda r: r["lo"])])
    assert sharded.shape == (2 * half,) and np.isfinite(sharded).all()

    # the library path: logical checkpoint -> plain model
    state = inference_state(unsharded_state(job["checkpoint"]), job["schema"], model_config(job["cfg"]))
    direct = InferenceModel.from_state(state, job["schema"], model_config(job["cfg"]))
    logits = direct.logits(valid.slice(0, 2 * half))
    np.testing.assert_allclose(logits, sharded, rtol=0, atol=1e-5)

    # the CLI path: export -> model dir -> probabilities; and the pyfunc model it logged
    out = tmp_path / "model"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["export", "--checkpoint", job["checkpoint"], "--config", job["config"], "--out", str(out),
                 "--tracking-uri", uri, "--experiment", "export-eq"]) == 0
    loaded = InferenceModel.load(str(out))
    probs = loaded.predict(valid.slice(0, 2 * half))
    np.testing.assert_allclose(probs, sigmoid(sharded), rtol=0, atol=1e-5)
    assert probs.std() > 1e-3  # trained: the rows get different scores
    assert set(torch.load(out / "model.pt", weights_only=True)) == set(loaded.model.state_dict())
    # the TorchScript form takes the converted batch (dense after log1p, KJT of logical ids)
    assert loaded.info["torchscript"] == "model.torchscript.pt"
    scripted = torch.jit.load(str(out / "model.torchscript.pt"))
    b = loaded.converter(valid.slice(0, 2 * half))
    schema = job["schema"]
    # forward_raw: the raw dense columns, then the bucketized I3; the KJT without I3 (whose ids it computes)
    raw = np.stack([valid.column(c).to_numpy()[:2 * half].astype(np.float32)
                    for c in [*schema.dense, *schema.bucketized]], axis=1)
    assert raw[:, 0].min() < 0 and loaded.schema == schema  # standardize's mean and std as trained
    assert schema.bucketized == ["I3"] and len(set(b.sparse["I3"].values().tolist())) == len(BUCKETS) + 1
    others, _ = b.sparse.split([len(schema.sparse) - 1, 1])
    with torch.no_grad():
        np.testing.assert_allclose(scripted(b.dense, b.sparse).numpy(), sharded, rtol=0, atol=1e-5)
        np.testing.assert_allclose(scripted.forward_raw(torch.from_numpy(raw), others).numpy(), sharded, rtol=0,
                                   atol=1e-5)

    import mlflow

    from mlflow import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("export-eq").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["rayemb.checkpoint"] == job["checkpoint"]
    mlflow.set_tracking_uri(uri)
    try:
        pyfunc = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
        df = valid.slice(0, 2 * half).to_pandas()
        got = pyfunc.predict(df)["prediction"].to_numpy()
    finally:
        mlflow.set_tracking_uri("")
    np.testing.assert_allclose(got, sigmoid(sharded), rtol=0, atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlartifacts", "mlflow.db", "model"]
    assert sorted(p.name for p in out.iterdir()) == ["model.json", "model.pt", "model.torchscript.pt"]
