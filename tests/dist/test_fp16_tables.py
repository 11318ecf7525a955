"""model.embedding_dtype: fp16 on 2 gloo ranks: the job's model trains, checkpoints, reloads and exports.

The job's own model code (``rayemb.train.worker.build.sharded_model``) shards a DLRM with the plan of
``test_export_equivalence.py`` (hybrid tables with row- and column-wise cold halves, plain row-, column-,
table-wise and data-parallel tables) once with fp16 tables and once with fp32 ones, trains each and saves a
checkpoint. Then:

* the fp16 job's tables are fp16 in every placement, and its training loss falls;
* its checkpoint states ``dtype: fp16`` per table and stores fp16 rows (optimizer state fp32);
* loaded by an fp32 job on 3 ranks, every row is the exact fp32 widening of the saved one; the fp32 job's
  checkpoint loaded by an fp16 job on 3 ranks holds its rows rounded to nearest fp16; the optimizer state
  comes back unchanged both ways; ``rayemb checkpoint reshard`` to 3 ranks keeps the fp16 rows bit for bit;
* the exported model (fp32 tables holding the fp16 rows widened, exactly) scores every validation row as the
  sharded fp16 model does, to 1e-5: the same tolerance as an fp32 export, since no row is rounded on the way.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import pytest
import torch
from _sparse import assert_same_state

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 16
BATCH = 32
DIM = 8  # test_export_equivalence's plan is made for this dim


def _config(root: Any, data: str, dtype: str) -> Any:
    from rayemb.config import config_from_dict

    return config_from_dict({
        "name": f"fp16-{dtype}", "data": {"path": data, "batch_size": BATCH},
        "model": {"embedding_dim": DIM, "bottom_mlp": [16, DIM], "top_mlp": [16, 1], "embedding_dtype": dtype},
        "train": {"dense_lr": 0.1, "embedding_lr": 0.1},
        "tracking": {"output_dir": str(root / "runs"), "experiment": "fp16-tables"},
    })


def _tables(cfg: Any, schema: Any) -> Dict[str, Any]:
    from rayemb.contract.tables import table_configs

    return {t.name: (t.num_embeddings, t.embedding_dim) for t in table_configs(schema, cfg.model.embedding_dim)}


def _train_rank(rank: int, world_size: int, cfg: Any, schema: Any, checkpoint: str) -> Dict[str, Any]:
    from test_export_equivalence import _job_plan

    from rayemb.checkpoint.layout import embedding_key
    from tests._export import train_save_score

    model, out = train_save_score(rank, world_size, cfg, schema, _job_plan(cfg, schema, world_size), checkpoint,
                                  STEPS, BATCH)
    dtypes = {k: str(v.dtype) for k, v in model.state_dict().items() if embedding_key(k) is not None}
    return {**out, "dtypes": dtypes}


def _reload_rank(rank: int, world_size: int, cfg: Any, schema: Any, load: str, save: str) -> None:
    """The job's model of ``cfg`` on ``world_size`` ranks loads ``load`` and saves it, untrained, to ``save``."""
    from test_export_equivalence import _job_plan

    from rayemb.checkpoint.store import load_logical, save_logical
    from rayemb.train.worker.build import sharded_model

    model, optimizer, remapper = sharded_model(cfg, schema, _job_plan(cfg, schema, world_size), torch.device("cpu"))
    meta = load_logical(load, model, optimizer, remapper, _tables(cfg, schema))
    save_logical(save, model, optimizer, remapper, _tables(cfg, schema), {"epoch": 0, "step": meta["step"]})


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from rayemb.data.schema import DatasetSchema
    from tests._export import small_dataset

    root = tmp_path_factory.mktemp("fp16_tables")
    data = small_dataset(str(root / "data"))
    schema = DatasetSchema.load(data)
    out: Dict[str, Any] = {"root": root, "schema": schema}
    for dtype in ("fp16", "fp32"):
        cfg, checkpoint = _config(root, data, dtype), str(root / f"checkpoint_{dtype}")
        out[dtype] = {"cfg": cfg, "checkpoint": checkpoint,
                      "ranks": run_multiprocess(_train_rank, 2, cfg=cfg, schema=schema, checkpoint=checkpoint)}
    return out


def test_fp16_tables_train_and_their_checkpoint_says_fp16(job):
    from rayemb.checkpoint.export import unsharded_state

    for dtype, torch_dtype in (("fp16", "torch.float16"), ("fp32", "torch.float32")):
        ranks = job[dtype]["ranks"]
        # hot halves, cold halves, plain row-, column-, table-wise and data-parallel tables alike
        assert len(ranks[0]["dtypes"]) == 8 and set(ranks[0]["dtypes"].values()) == {torch_dtype}, ranks[0]["dtypes"]
    losses = np.mean([r["losses"] for r in job["fp16"]["ranks"]], axis=0)
    assert np.isfinite(losses).all() and losses[-4:].mean() < losses[:4].mean() - 0.02, losses
    state = unsharded_state(job["fp16"]["checkpoint"])
    assert {t["dtype"] for t in state["meta"]["tables"].values()} == {"fp16"} and len(state["meta"]["tables"]) == 6
    for name, t in state["tables"].items():
        assert t["weight"].dtype == torch.float16 and t["momentum1"].dtype == torch.float32, name
        assert bool((t["momentum1"] > 0).any()), name  # trained
    assert {t["dtype"] for t in unsharded_state(job["fp32"]["checkpoint"])["meta"]["tables"].values()} == {"fp32"}


def test_checkpoints_reload_across_dtypes_and_world_sizes(job, tmp_path):
    from rayemb.checkpoint.export import reshard_checkpoint, unsharded_state

    schema = job["schema"]
    c16, c32 = job["fp16"]["checkpoint"], job["fp32"]["checkpoint"]
    ref16, ref32 = unsharded_state(c16), unsharded_state(c32)
    into32, into16 = str(tmp_path / "fp16_into_fp32"), str(tmp_path / "fp32_into_fp16")
    run_multiprocess(_reload_rank, 3, cfg=job["fp32"]["cfg"], schema=schema, load=c16, save=into32)
    run_multiprocess(_reload_rank, 3, cfg=job["fp16"]["cfg"], schema=schema, load=c32, save=into16)
    for got, ref, dtype in ((unsharded_state(into32), ref16, torch.float32), (unsharded_state(into16), ref32,
                                                                               torch.float16)):
        assert got["meta"]["world_size"] == 3
        assert {t["dtype"] for t in got["meta"]["tables"].values()} == {"fp32" if dtype == torch.float32 else "fp16"}
        for name, t in got["tables"].items():
            assert t["weight"].dtype == dtype
            assert torch.equal(t["weight"], ref["tables"][name]["weight"].to(dtype)), name  # the cast of the saved rows
            assert torch.equal(t["momentum1"], ref["tables"][name]["momentum1"]), name
        assert_same_state(got["dense"], ref["dense"], "dense")
    # fp32 rows do not all survive the round trip through fp16: the fp16 job really holds fp16 rows
    assert any(not torch.equal(ref32["tables"][n]["weight"], ref32["tables"][n]["weight"].half().float())
               for n in ref32["tables"])

    r3 = str(tmp_path / "r3")
    meta = reshard_checkpoint(c16, 3, r3)
    assert meta["world_size"] == 3 and {t["dtype"] for t in meta["tables"].values()} == {"fp16"}
    resharded = unsharded_state(r3)
    assert_same_state(resharded["tables"], ref16["tables"], "tables")
    assert {t["weight"].dtype for t in resharded["tables"].values()} == {torch.float16}


def test_exported_fp16_model_scores_what_the_sharded_model_scores(job, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from rayemb.checkpoint.export import unsharded_state
    from rayemb.cli import main
    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel, inference_state, model_config, sigmoid

    monkeypatch.chdir(tmp_path)  # nothing MLflow writes may land in the repository
    cfg, schema = job["fp16"]["cfg"], job["schema"]
    valid = pq.read_table(parquet_files(cfg.data.path, "valid"))
    half = valid.num_rows // 2
    sharded = np.concatenate([r["logits"] for r in sorted(job["fp16"]["ranks"], key=lambda r: r["lo"])])
    assert sharded.shape == (2 * half,) and np.isfinite(sharded).all()

    state = inference_state(unsharded_state(job["fp16"]["checkpoint"]), schema, model_config(cfg))
    direct = InferenceModel.from_state(state, schema, model_config(cfg))
    np.testing.assert_allclose(direct.logits(valid.slice(0, 2 * half)), sharded, rtol=0, atol=1e-5)

    config_path = tmp_path / "job.yaml"
    config_path.write_text(cfg.to_yaml())
    out = tmp_path / "model"
    assert main(["export", "--checkpoint", job["fp16"]["checkpoint"], "--config", str(config_path), "--out", str(out),
                 "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--experiment", "fp16-tables"]) == 0
    probs = InferenceModel.load(str(out)).predict(valid.slice(0, 2 * half))
    np.testing.assert_allclose(probs, sigmoid(sharded), rtol=0, atol=1e-5)
    assert probs.std() > 1e-3  # trained: the rows get different scores
