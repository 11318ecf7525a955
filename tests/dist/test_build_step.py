"""The plan probe steps the loop's own step: built once (rayemb.train.worker.build.build_step) for both.

On 2 gloo ranks a two-tower retrieval job (``item`` the item feature, ``train.precision: bf16``) is set up
twice on the same plan: as the loop sets it up (``build_step`` with the statistics pass's tables, as
``train_loop_per_worker`` passes them) and as the plan probe does (``rayemb.train.calibration.plan_probe.probe_step``).
Both losses must be the logQ-corrected in-batch softmax with the correction of the item table's
statistics (equal to ``item_log_q`` of that table: a probe without the statistics would time a softmax
without it), and both steps must run in the job's precision, with the same item feature and prefetch.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import pytest

from rayemb.multiprocess import run_multiprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

USERS, ITEMS, DIM = 64, 40, 8


def _job_plan(cfg: Any, schema: Any, world_size: int) -> Any:
    """TorchRec's plan of the job's model on ``world_size`` CPU ranks."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.train.sharding import JobPlan, build_model

    meta_model, _, _ = build_model(cfg, schema, {}, {}, torch.device("meta"), torch.device("meta"))
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu")).collective_plan(
        meta_model, cpu_capable_sharders(), dist.GroupMember.WORLD)
    return JobPlan(sharding_plan=plan, placements={}, hot_ids={}, summary={})


def _seen(built: Any) -> Dict[str, Any]:
    log_q = getattr(built.loss_fn, "_log_q", None)
    return {"loss": type(built.loss_fn).__name__, "log_q": None if log_q is None else np.asarray(log_q),
            "item": built.item_feature, "precision": built.train_step().precision,
            "prefetch": built.prefetch is not None}


def _built_rank(rank: int, world_size: int, cfg: Any, schema: Any, tables: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    from rayemb.contract.factory import model_spec
    from rayemb.train.worker.build import build_step
    from rayemb.train.calibration.plan_probe import probe_step

    cpu = torch.device("cpu")
    spec = model_spec(cfg.model)
    plan = _job_plan(cfg, schema, world_size)
    loop = build_step(cfg, schema, plan, cpu, model_spec=spec, table_stats=tables, log=rank == 0)
    probe = probe_step(cfg, schema, plan, cpu, spec, tables)
    return {"loop": _seen(loop), "probe": _seen(probe)}


def test_the_probes_step_has_the_loops_loss_statistics_and_precision():
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.stats_types import TableStats
    from rayemb.train.worker.retrieval import item_log_q

    schema = DatasetSchema.from_dict({"label": "label", "dense": ["d"], "sparse": [
        {"name": "user", "num_embeddings": USERS}, {"name": "item", "num_embeddings": ITEMS}]})
    cfg = config_from_dict({
        "name": "build-step", "data": {"path": "unused", "batch_size": 8},
        "model": {"name": "two_tower", "embedding_dim": DIM,
                  "args": {"item_feature": "item", "tower_mlp": [16, DIM]}},
        "train": {"precision": "bf16"},
    })
    # a skewed item table: its logQ correction is far from uniform, so a missing one shows
    counts = [[i, int(1000 / (i + 1))] for i in range(ITEMS // 2)]
    item = TableStats(num_embeddings=ITEMS, rows=5000, values=5000, distinct=ITEMS, heavy_hitters=counts)
    expected = item_log_q(item, ITEMS)
    ranks = run_multiprocess(_built_rank, 2, cfg=cfg, schema=schema, tables={"item": item})
    for r in ranks:
        loop, probe = r["loop"], r["probe"]
        assert loop["loss"] == probe["loss"] == "InBatchSoftmax"
        assert loop["log_q"] is not None and probe["log_q"] is not None
        np.testing.assert_array_equal(loop["log_q"], expected)
        np.testing.assert_array_equal(probe["log_q"], loop["log_q"])
        assert loop["item"] == probe["item"] == "item"
        assert loop["precision"] == probe["precision"] == "bf16"
        assert loop["prefetch"] == probe["prefetch"]
