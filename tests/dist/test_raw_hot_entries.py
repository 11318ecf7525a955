"""The hot rows of a hybrid raw-id table, saved as entries, keep the table's top eviction priority when they are
reloaded as managed rows: also when no managed entry exists on any rank to take it from.

On 2 gloo ranks a job's sharded model (``rayemb.train.worker.build.sharded_model``) holds raw-id table ``U1`` hybrid,
with a TTL of one hour and LRU eviction, and no id in its managed rows yet (it never trained). Its checkpoint is
loaded into the same job planned with ``U1`` row-wise, so its hot ids become managed rows, and the model steps
once on other ids: the ids that were hot are still held, their last access the save's time and the table's pass
counter, not 1 (1970 to a TTL, and the oldest access there is to LRU).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict

import numpy as np
import pytest
import yaml

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BATCH = 32
DIM = 8


def _tables(cfg: Any, schema: Any) -> Dict[str, Any]:
    from rayemb.contract.tables import table_configs

    return {t.name: (t.num_embeddings, t.embedding_dim) for t in table_configs(schema, cfg.model.embedding_dim)}


def _save_untrained(rank: int, world_size: int, cfg: Any, schema: Any, job_plan: Any, checkpoint: str) -> Dict:
    import torch

    from rayemb.checkpoint.store import save_logical
    from rayemb.train.worker.build import sharded_model

    model, optimizer, remapper = sharded_model(cfg, schema, job_plan, torch.device("cpu"))
    before = time.time()
    save_logical(checkpoint, model, optimizer, remapper, _tables(cfg, schema), {"epoch": 0, "step": 0})
    return {"hot": remapper.hot_ids("U1").tolist(), "saved_after": int(before)}


def _load_and_step(rank: int, world_size: int, cfg: Any, schema: Any, job_plan: Any, checkpoint: str,
                   other_ids: np.ndarray) -> Dict:
    import pyarrow as pa
    import torch

    from rayemb.checkpoint.raw_state import export_raw_tables
    from rayemb.checkpoint.store import load_logical
    from rayemb.data.batching import BatchConverter
    from rayemb.train.worker.build import sharded_model

    model, optimizer, remapper = sharded_model(cfg, schema, job_plan, torch.device("cpu"))
    load_logical(checkpoint, model, optimizer, remapper, _tables(cfg, schema))
    loaded = export_raw_tables(model)["U1"]
    n = len(other_ids)
    table = pa.table({"label": np.zeros(n, np.float32), "I1": np.zeros(n, np.float32),
                      "I2": np.zeros(n, np.float32), "C1": pa.array(np.zeros(n, np.int64)),
                      "C2": pa.array([[]] * n, pa.list_(pa.int64())), "U1": pa.array(other_ids),
                      "S1": pa.array(["nobody"] * n)})
    batch = BatchConverter(schema, remap=remapper.remap)(table)
    model.train()
    model(batch.dense, batch.sparse)  # an admission pass of the managed-collision tables: the TTL is checked
    held = export_raw_tables(model)["U1"]
    return {"loaded": {k: v.tolist() for k, v in loaded.items()}, "held": held["ids"].tolist()}


def test_hot_entries_reloaded_as_managed_rows_are_neither_expired_nor_evicted_first(tmp_path):
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.stats import compute_stats
    from rayemb.planner.tables import split_rule
    from rayemb.planner.types import ClusterTopology
    from rayemb.train.sharding import make_job_plan
    from tests._raw_data import raw_id_dataset, raw_vocabularies

    data = raw_id_dataset(str(tmp_path / "data"))
    with open(os.path.join(data, "schema.yaml")) as f:
        doc = yaml.safe_load(f)
    u1 = next(s for s in doc["sparse"] if s["name"] == "U1")
    u1.update(eviction="lru", ttl_hours=1)
    with open(os.path.join(data, "schema.yaml"), "w") as f:
        yaml.safe_dump(doc, f)
    schema = DatasetSchema.load(data)
    stats = compute_stats(data, exact=True, in_process=True)
    topology = ClusterTopology(1, 2, compute_device="cpu")
    split = split_rule(topology, BATCH * 2, DIM).split(stats)

    def plan(u1_pin: str) -> Any:
        cfg = config_from_dict({
            "name": "hot", "data": {"path": data, "batch_size": BATCH},
            "model": {"embedding_dim": DIM, "bottom_mlp": [16, DIM], "top_mlp": [16, 1]},
            "planner": {"tables": {"U1": {"sharding": u1_pin}, "S1": {"sharding": "row_wise"}}},
            "tracking": {"output_dir": str(tmp_path / "runs")}})
        return cfg, make_job_plan(cfg, schema, stats, split, topology)

    cfg, hybrid = plan("hybrid")
    assert hybrid.placements["U1"].placement.value == "hybrid" and len(hybrid.hot_ids["U1"])
    checkpoint = str(tmp_path / "ckpt")
    saved = run_multiprocess(_save_untrained, 2, cfg=cfg, schema=schema, job_plan=hybrid, checkpoint=checkpoint)
    hot = np.array(saved[0]["hot"], dtype=np.int64)

    cfg_rw, row_wise = plan("row_wise")
    assert row_wise.placements["U1"].placement.value == "row_wise"
    other = np.setdiff1d(raw_vocabularies()["U1"], hot)[:8]
    loaded = run_multiprocess(_load_and_step, 2, cfg=cfg_rw, schema=schema, job_plan=row_wise,
                              checkpoint=checkpoint, other_ids=other)
    ids = np.concatenate([np.array(r["loaded"]["ids"], dtype=np.int64) for r in loaded])
    assert sorted(ids.tolist()) == sorted(hot.tolist())  # the hot rows, now managed entries
    last_s = np.concatenate([np.array(r["loaded"]["meta.last_access_s"]) for r in loaded])
    assert (last_s >= saved[0]["saved_after"]).all() and (last_s <= time.time()).all()
    last_iter = np.concatenate([np.array(r["loaded"]["meta.last_access_iter"]) for r in loaded])
    assert (last_iter == max([1] + [int(r["loaded"]["iter"]) for r in loaded])).all()  # its pass counter, at least 1
    held = set(np.concatenate([np.array(r["held"], dtype=np.int64) for r in loaded]).tolist())
    assert set(hot.tolist()) <= held, f"{len(set(hot.tolist()) - held)} of {len(hot)} hot ids expired"
