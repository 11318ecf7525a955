"""A job's own sharded model with raw-id and encoded tables: it trains, its checkpoint moves between worlds, and
its export scores what it scores.

On 2 gloo ranks the job's model code (``rayemb.train.worker.build.sharded_model`` with the plan
``rayemb.train.sharding.make_job_plan`` makes from the dataset's statistics) trains a DLRM over two encoded
tables and two raw-id tables (int64 ids of any 64-bit value, placed hybrid: its heavy hitters in replicated
rows, the rest managed row-wise; string ids, pinned row-wise) and writes a checkpoint with rayemb's store.
The 3-rank job's split has another hot set, so ids move between hot rows and managed slots on the way. Every raw id of both vocabularies (and ids never seen) is then looked up on 3 ranks, from
that checkpoint and from ``rayemb checkpoint reshard --world-size 3`` of it, and on 2 ranks again from the
3-rank job's own checkpoint: each id pools to the same vector to 1e-6 everywhere, unseen ones to zero. The
exported inference model (``rayemb.serve``) scores the validation rows, raw ids as the parquet holds them
(int64 and strings), as the sharded model does to 1e-5, also after a save and load of the export, and so does
the MLflow pyfunc model `rayemb export` logs, loaded in a new process.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import numpy as np
import pytest
import yaml

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 12
BATCH = 32
DIM = 8
#: ids no split of the dataset holds
UNSEEN = {"U1": np.array([5, -(2 ** 63), 2 ** 63 - 1], dtype=np.int64),
          "S1": np.array(["nobody", "", "ü"], dtype=object)}


def _plan(cfg: Any, schema: Any, world: int) -> Any:
    """The job's plan for ``world`` ranks, from the dataset's statistics (counted exactly, in this process)."""
    from rayemb.data.stats import compute_stats
    from rayemb.planner.tables import split_rule
    from rayemb.planner.types import ClusterTopology
    from rayemb.train.sharding import make_job_plan

    stats = compute_stats(cfg.data.path, exact=True, in_process=True)
    topology = ClusterTopology(1, world, compute_device="cpu")
    split = split_rule(topology, BATCH * world, DIM).split(stats)
    return make_job_plan(cfg, schema, stats, split, topology)


def _probe_ids() -> Dict[str, np.ndarray]:
    from tests._raw_data import raw_vocabularies

    vocab = raw_vocabularies()
    return {name: np.concatenate([vocab[name], UNSEEN[name]]) for name in UNSEEN}


def _pooled(model: Any, schema: Any, remapper: Any, rank: int, world: int) -> Dict[str, np.ndarray]:
    """This rank's share of the pooled vectors of every probe id, one id per bag (every rank looks up as many)."""
    import pyarrow as pa
    import torch

    from rayemb.data.batching import BatchConverter

    probe = _probe_ids()
    per = -(-max(len(v) for v in probe.values()) // world)
    cols: Dict[str, Any] = {}
    for name, ids in probe.items():
        mine = np.resize(UNSEEN[name], per * world)
        mine[:len(ids)] = ids
        cols[name] = pa.array(mine[rank * per:(rank + 1) * per].tolist())
    table = pa.table({"label": np.zeros(per, np.float32), "I1": np.zeros(per, np.float32),
                      "I2": np.zeros(per, np.float32), "C1": pa.nulls(per, pa.int64()),
                      "C2": pa.array([[]] * per, pa.list_(pa.int64())), **cols})
    batch = BatchConverter(schema, remap=remapper.remap)(table)
    model.eval()
    with torch.no_grad():
        pooled = model.module.embedding(batch.sparse).to_dict()
    model.train()
    return {name: pooled[name].numpy().copy() for name in probe}


def _tables(cfg: Any, schema: Any) -> Dict[str, Any]:
    from rayemb.contract.tables import table_configs

    return {t.name: (t.num_embeddings, t.embedding_dim) for t in table_configs(schema, cfg.model.embedding_dim)}


def _train_rank(rank: int, world_size: int, cfg: Any, schema: Any, job_plan: Any, checkpoint: str) -> Dict[str, Any]:
    from rayemb.embedding.raw_tables import eviction_counts
    from tests._export import train_save_score

    model, out = train_save_score(rank, world_size, cfg, schema, job_plan, checkpoint, STEPS, BATCH)
    return {**out, "evictions": eviction_counts(model, across_ranks=True),
            "pooled": _pooled(model, schema, model.module.embedding.remapper, rank, world_size)}


def _load_rank(rank: int, world_size: int, cfg: Any, schema: Any, job_plan: Any, loads: List[str],
               save_to: Optional[str]) -> Dict[str, Any]:
    """Loads each checkpoint of ``loads`` in turn into the job's sharded model and probes every raw id."""
    import torch

    from rayemb.checkpoint.store import load_logical, save_logical
    from rayemb.train.worker.build import sharded_model

    torch.manual_seed(1)  # other initial rows than the trained job's: every probed row comes from a load
    model, optimizer, remapper = sharded_model(cfg, schema, job_plan, torch.device("cpu"))
    probes = []
    for checkpoint in loads:
        load_logical(checkpoint, model, optimizer, remapper, _tables(cfg, schema))
        probes.append(_pooled(model, schema, remapper, rank, world_size))
    if save_to:
        save_logical(save_to, model, optimizer, remapper, _tables(cfg, schema), {"epoch": 0, "step": STEPS})
    return {"probes": probes}


def _gather(parts: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    probe = _probe_ids()
    return {name: np.concatenate([p[name] for p in parts])[:len(probe[name])] for name in probe}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from rayemb.cli import main
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from tests._raw_data import raw_id_dataset

    root = tmp_path_factory.mktemp("raw_job")
    data = raw_id_dataset(str(root / "data"))
    config = {
        "name": "raw-job", "data": {"path": data, "batch_size": BATCH},
        "model": {"embedding_dim": DIM, "bottom_mlp": [16, DIM], "top_mlp": [16, 1]},
        "train": {"dense_lr": 0.1, "embedding_lr": 0.1},
        # a hybrid encoded table beside the raw ones (U1 hybrid by default, S1 pinned row-wise): one pooled module
        "planner": {"tables": {"C1": {"sharding": "hybrid"}, "S1": {"sharding": "row_wise"}}},
        "tracking": {"output_dir": str(root / "runs"), "experiment": "raw-job"},
    }
    cfg = config_from_dict(config)
    with open(root / "job.yaml", "w") as f:  # for `rayemb export --config`
        yaml.safe_dump(config, f)
    schema = DatasetSchema.load(data)
    plans = {w: _plan(cfg, schema, w) for w in (2, 3)}
    ckpt, resharded, on3 = (str(root / n) for n in ("ckpt2", "resharded3", "ckpt3"))
    trained = run_multiprocess(_train_rank, 2, cfg=cfg, schema=schema, job_plan=plans[2], checkpoint=ckpt)
    assert main(["checkpoint", "reshard", "--checkpoint", ckpt, "--world-size", "3", "--out", resharded]) == 0
    three = run_multiprocess(_load_rank, 3, cfg=cfg, schema=schema, job_plan=plans[3], loads=[ckpt, resharded],
                             save_to=on3)
    back = run_multiprocess(_load_rank, 2, cfg=cfg, schema=schema, job_plan=plans[2], loads=[on3], save_to=None)
    return {"root": root, "cfg": cfg, "config": str(root / "job.yaml"), "schema": schema, "plans": plans,
            "checkpoint": ckpt, "resharded": resharded,
            "on3": on3, "trained": trained, "three": three, "back": back}


def test_the_plan_places_raw_tables_row_wise_or_hybrid_with_their_managed_rows_in_their_own_module(job):
    hot = {}
    for world, plan in job["plans"].items():
        raw_plan = plan.sharding_plan.plan["embedding.raw"]
        assert sorted(raw_plan) == ["S1", "U1"]
        assert {ps.sharding_type for ps in raw_plan.values()} == {"row_wise"}
        assert {ps.compute_kernel for ps in raw_plan.values()} == {"fused"}
        assert all(len(ps.sharding_spec.shards) == world for ps in raw_plan.values())
        assert not {"S1", "U1"} & set(plan.sharding_plan.plan.get("embedding.plain", {}))
        assert plan.placements["S1"].placement.value == "row_wise" and "S1" not in plan.hot_ids
        assert sum(s.shard_sizes[0] for s in raw_plan["S1"].sharding_spec.shards) == 128
        # U1: its heavy hitters (raw values) in replicated rows, the rest of its capacity managed row-wise
        hot[world] = plan.hot_ids["U1"]
        assert plan.placements["U1"].placement.value == "hybrid" and 0 < len(hot[world]) < 100
        assert len(hot[world]) % world == 0 and (np.abs(hot[world]) > 10 ** 6).any()  # raw values, not rows
        assert sum(s.shard_sizes[0] for s in raw_plan["U1"].sharding_spec.shards) == 1024 - len(hot[world])
        assert plan.sharding_plan.plan["embedding.hot"]["U1__hot"].sharding_type == "data_parallel"
        assert not [t for k, v in plan.sharding_plan.plan.items() if k.startswith("embedding.cold") for t in v
                    if t.startswith("U1")]
        assert plan.summary["raw_tables"] == ["U1", "S1"]
        assert plan.placements["C1"].placement.value == "hybrid" and 0 < len(plan.hot_ids["C1"]) < 100
    assert set(hot[2]) != set(hot[3])  # ids change sides between the two worlds


def test_the_job_model_trains_raw_and_encoded_tables_and_checkpoints_them(job):
    from rayemb.checkpoint.raw_files import raw_tables_of
    from rayemb.checkpoint.reader import verify

    trained = job["trained"]
    losses = np.mean([r["losses"] for r in trained], axis=0)
    assert np.isfinite(losses).all() and losses[-4:].mean() < losses[:4].mean(), losses
    meta = verify(job["checkpoint"])
    assert meta["tables"]["U1"] == {"num_embeddings": 1024, "dim": DIM, "dtype": "fp32", "ids": "raw",
                                    "eviction": "lfu", "held": meta["tables"]["U1"]["held"]}
    assert meta["tables"]["S1"]["ids"] == "raw" and meta["tables"]["C1"] == {"num_embeddings": 200, "dim": DIM,
                                                                            "dtype": "fp32"}
    assert {"raw_ids.00000.npz", "raw_ids.00001.npz"} <= set(meta["files"])
    state = raw_tables_of(job["checkpoint"], meta)
    for name in ("U1", "S1"):
        assert len(state[name]["ids"]) == meta["tables"][name]["held"] > 0
        assert (state[name]["momentum1"] > 0).all()
    # the hot rows are entries of rank 0's part, with their optimizer state, ranked first by the LFU policy
    hot = job["plans"][2].hot_ids["U1"]
    from rayemb.checkpoint.raw_files import read_part

    parts = [read_part(os.path.join(job["checkpoint"], f"raw_ids.0000{r}.npz"))["U1"] for r in (0, 1)]
    assert np.isin(hot, parts[0]["ids"]).all() and not np.isin(hot, parts[1]["ids"]).any()
    on0 = np.isin(parts[0]["ids"], hot)
    assert (parts[0]["momentum1"][on0] > 0).all()
    assert parts[0]["meta.counts"][on0].min() >= max(p["meta.counts"][~np.isin(p["ids"], hot)].max() for p in parts)
    assert trained[0]["evictions"] == {"S1": 0, "U1": 0}  # room for every id
    # the raw tables' slots and rows are in the raw parts only: no DCP entry of theirs
    from rayemb.checkpoint.reader import state_shapes

    keys = state_shapes(job["checkpoint"])
    assert not [k for k in keys if "U1" in k or "S1" in k or "_managed_collision" in k], keys
    assert "tables.C1.weight" in keys and "tables.C2.weight" in keys
    assert sorted(n for n in os.listdir(job["resharded"]) if n.startswith("raw_ids.")) == [
        "raw_ids.00000.npz", "raw_ids.00001.npz", "raw_ids.00002.npz"]
    # `rayemb checkpoint export`: the raw tables' ids and rows as plain tensors, the same from the reshard
    import torch

    from rayemb.checkpoint.export import export_checkpoint

    for source, name in ((job["checkpoint"], "a.pt"), (job["resharded"], "b.pt")):
        export_checkpoint(source, str(job["root"] / name))
    a, b = (torch.load(job["root"] / n, weights_only=True)["raw_tables"] for n in ("a.pt", "b.pt"))
    assert sorted(a) == ["S1", "U1"] and np.array_equal(a["U1"]["ids"].numpy(), state["U1"]["ids"])
    for table in a:
        for key in a[table]:
            assert torch.equal(a[table][key], b[table][key]), (table, key)


def test_every_raw_id_scores_the_same_on_3_ranks_resharded_and_back_on_2(job):
    from rayemb.checkpoint.raw_files import raw_tables_of
    from rayemb.checkpoint.reader import read_meta
    from rayemb.embedding.raw_ids import raw_ids_to_int64

    probe = _probe_ids()
    before = _gather([r["pooled"] for r in job["trained"]])
    state = raw_tables_of(job["checkpoint"], read_meta(job["checkpoint"]))
    for name in probe:
        held = np.isin(raw_ids_to_int64(probe[name]), state[name]["ids"])
        assert held.sum() == len(state[name]["ids"]) and not held[np.isin(probe[name], UNSEEN[name])].any()
        assert (np.abs(before[name][held]).sum(axis=1) > 0).all()  # a held id has its row
        np.testing.assert_array_equal(before[name][~held], 0.0)  # any other id: the zero default row
    three = job["three"]
    for i, what in enumerate(("the 2-rank checkpoint", "its 3-rank reshard")):
        got = _gather([r["probes"][i] for r in three])
        for name in probe:
            np.testing.assert_allclose(got[name], before[name], rtol=0, atol=1e-6, err_msg=f"{name}, {what}")
    back = _gather([r["probes"][0] for r in job["back"]])
    for name in probe:
        np.testing.assert_allclose(back[name], before[name], rtol=0, atol=1e-6, err_msg=f"{name}, back on 2")
    meta3 = json.loads(open(os.path.join(job["on3"], "meta.json")).read())
    assert meta3["world_size"] == 3 and len([n for n in meta3["files"] if n.startswith("raw_ids.")]) == 3


def test_the_exported_model_scores_raw_ids_as_the_sharded_model(job, tmp_path):
    import pyarrow.parquet as pq

    from rayemb.checkpoint.export import unsharded_state
    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import InferenceModel, inference_state, model_config, sigmoid

    cfg, schema = job["cfg"], job["schema"]
    valid = pq.read_table(parquet_files(cfg.data.path, "valid"))
    half = valid.num_rows // 2
    sharded = np.concatenate([r["logits"] for r in sorted(job["trained"], key=lambda r: r["lo"])])
    state = inference_state(unsharded_state(job["checkpoint"]), schema, model_config(cfg))
    model = InferenceModel.from_state(state, schema, model_config(cfg), info={})
    rows = valid.slice(0, 2 * half)
    assert rows.column("S1").type == "string" and rows.column("U1").type == "int64"
    np.testing.assert_allclose(model.logits(rows), sharded, rtol=0, atol=1e-5)
    # an export's files hold the ids each raw table held; loaded back it scores alike, without TorchScript
    model.save(str(tmp_path / "model"))
    loaded = InferenceModel.load(str(tmp_path / "model"))
    np.testing.assert_allclose(loaded.predict(rows.to_pandas()), sigmoid(sharded), rtol=0, atol=1e-5)
    assert loaded.info["torchscript"] is None and "raw ids" in loaded.info["torchscript_skipped"]
    held = unsharded_state(job["checkpoint"])["raw_tables"]
    assert {t: len(v) for t, v in loaded.raw_rows.ids.items()} == {t: int(v["ids"].numel()) for t, v in held.items()}
    # ids never seen read the zero row and are not inserted: scoring them changes nothing
    probe = rows.slice(0, 3).to_pandas()
    probe["U1"], probe["S1"] = UNSEEN["U1"], UNSEEN["S1"]
    first = loaded.predict(probe)
    assert np.array_equal(first, loaded.predict(probe))
    assert {t: len(v) for t, v in loaded.raw_rows.ids.items()} == {t: int(v["ids"].numel()) for t, v in held.items()}


def test_the_logged_pyfunc_model_scores_raw_ids_as_the_sharded_model(job, tmp_path):
    """`rayemb export --tracking-uri` logs the MLflow pyfunc model; loaded in a new process, as a serving host
    loads it, it scores the validation rows' raw ids (int64 and strings, as the parquet holds them) as the sharded
    model did, and ids never seen score as missing ones."""
    from mlflow import MlflowClient

    from rayemb.cli import main
    from rayemb.data.schema import parquet_files
    from rayemb.serve.model import sigmoid
    from tests._pyfunc import fresh_pyfunc

    valid = parquet_files(job["cfg"].data.path, "valid")
    sharded = np.concatenate([r["logits"] for r in sorted(job["trained"], key=lambda r: r["lo"])])
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["export", "--checkpoint", job["checkpoint"], "--config", job["config"], "--out",
                 str(tmp_path / "model"), "--tracking-uri", uri, "--experiment", "raw-export"]) == 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("raw-export").experiment_id])
    import pyarrow.parquet as pq

    few = pq.read_table(valid).slice(0, 8).to_pydict()  # small frames: a request travels on the command line
    unseen = {**few, "U1": [int(v) for v in np.resize(UNSEEN["U1"], 8)], "S1": list(np.resize(UNSEEN["S1"], 8))}
    missing = {**few, "U1": [None] * 8, "S1": [None] * 8}
    got = fresh_pyfunc(uri, f"runs:/{run.info.run_id}/model", valid,
                       [{"frame": None}, {"frame": unseen}, {"frame": missing}], cwd=str(tmp_path))
    np.testing.assert_allclose(got[0]["prediction"][:len(sharded)], sigmoid(sharded), rtol=0, atol=1e-5)
    np.testing.assert_allclose(got[1]["prediction"], got[2]["prediction"], rtol=0, atol=1e-7)
    assert np.ptp(got[1]["prediction"]) > 0  # the rows' other features still score
