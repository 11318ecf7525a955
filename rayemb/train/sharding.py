"""Sharding plans made with TorchRec's planner, outside the workers.

The plan is computed once (in a Ray task, so the driver never imports
torchrec/fbgemm) for a meta-device copy of the model and travels to every
worker in the train loop config; all ranks then shard with the same plan.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Tuple

from rayemb.config import JobConfig
from rayemb.data.schema import DatasetSchema


def build_model(cfg: JobConfig, schema: DatasetSchema, embedding_device: Any, dense_device: Any):
    """The DLRM of a job: an EmbeddingBagCollection over the schema's tables, MLPs from the config."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rayemb.model.dlrm import DLRM, table_configs

    ebc = EmbeddingBagCollection(tables=table_configs(schema, cfg.model.embedding_dim), device=embedding_device)
    return DLRM(
        ebc,
        feature_names=schema.sparse_names,
        dense_in_features=len(schema.dense),
        bottom_mlp=cfg.model.bottom_mlp,
        top_mlp=cfg.model.top_mlp,
        dense_device=dense_device,
    )


def sharders(compute_device: str) -> List[Any]:
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return [EmbeddingBagCollectionSharder()]


def make_plan(cfg: JobConfig, schema: DatasetSchema, world_size: int, compute_device: str) -> Tuple[Any, Dict[str, Any]]:
    """(TorchRec ``ShardingPlan``, JSON summary) for ``world_size`` ranks on ``compute_device``."""
    import torch
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    model = build_model(cfg, schema, torch.device("meta"), torch.device("meta"))
    topology = Topology(world_size=world_size, compute_device=compute_device, local_world_size=world_size)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=cfg.data.batch_size)
    plan = planner.plan(model, sharders(compute_device))
    return plan, plan_summary(plan, world_size)


def plan_summary(plan: Any, world_size: int) -> Dict[str, Any]:
    """A JSON-able view of a TorchRec ShardingPlan: per table sharding type, kernel, ranks."""
    tables: Dict[str, Any] = {}
    for module_path, module_plan in sorted(plan.plan.items()):
        for name, ps in sorted(module_plan.items()):
            tables[name] = {
                "module": module_path,
                "sharding_type": ps.sharding_type,
                "compute_kernel": ps.compute_kernel,
                "ranks": list(ps.ranks or []),
            }
    summary = {"schema_version": 1, "world_size": world_size, "tables": tables}
    summary["fingerprint"] = hashlib.sha1(json.dumps(summary, sort_keys=True).encode()).hexdigest()[:12]
    return summary
