"""From statistics to a TorchRec ``ShardingPlan`` for the job's model, outside the workers.

The driver computes the frequent-category split (pure numpy) and then, in a
Ray task (so the driver itself never needs torchrec/fbgemm kernels), runs
rayemb's planner: the cost model picks data-parallel, pooled model-parallel or
hybrid per table and TorchRec's planner places the shards. The result travels
to every worker in the train loop config, so all ranks shard alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping

import numpy as np

from rayemb.config import JobConfig
from rayemb.data.schema import DatasetSchema
from rayemb.planner.types import TablePin, parse_pins

#: where the embedding module sits in the DLRM (prefix of its sharding plan keys)
EMBEDDING_MODULE = "embedding"


@dataclass
class JobPlan:
    """What the workers need to build and shard the model alike on every rank."""

    sharding_plan: Any  # torchrec ShardingPlan keyed by module path in the DLRM
    placements: Dict[str, Any]  # table -> rayemb.planner.types.TablePlan
    hot_ids: Dict[str, np.ndarray]  # hybrid table -> its replicated (hot) ids
    summary: Dict[str, Any]  # plan.json


def build_model(
    cfg: JobConfig, schema: DatasetSchema, placements: Mapping[str, Any], hot_ids: Mapping[str, np.ndarray],
    embedding_device: Any, dense_device: Any,
):
    """The job's DLRM over rayemb's hybrid embedding (tables not placed hybrid stay an ordinary EBC)."""
    from rayemb.embedding.hybrid import hybrid_from_placements
    from rayemb.model.dlrm import DLRM, table_configs

    embedding, _ = hybrid_from_placements(
        table_configs(schema, cfg.model.embedding_dim), placements, hot_ids, device=embedding_device
    )
    return DLRM(
        embedding,
        feature_names=schema.sparse_names,
        dense_in_features=len(schema.dense),
        bottom_mlp=cfg.model.bottom_mlp,
        top_mlp=cfg.model.top_mlp,
        dense_device=dense_device,
    )


def pins_of(cfg: JobConfig, table_names: List[str]) -> Dict[str, TablePin]:
    """The config's per-table pins, parsed and checked (:class:`PlanError` ``invalid_pin``) — the one parse.

    ``planner.hybrid: false`` forbids hybrid on every table not pinned otherwise.
    :func:`rayemb.planner.plan` takes the result as it is.
    """
    pins = cfg.planner.pins()
    if not cfg.planner.hybrid:
        for name in table_names:
            pins.setdefault(name, {}).setdefault("hybrid", False)
    return parse_pins(pins, table_names)


def make_job_plan(cfg: JobConfig, schema: DatasetSchema, stats: Any, split: Any, topology: Any,
                  calibration: Any = None) -> JobPlan:
    """Plans the job's tables on ``topology`` with the split's hot sets (runs where torchrec imports).

    ``planner.objective: step_time`` chooses placements by predicted step time with ``calibration``
    (a :class:`~rayemb.planner.step_time.Calibration`; None: the built-in defaults); ``bytes`` by bytes
    per step. Either way plan.json records the predicted step time and the constants used.
    """
    from torchrec.distributed.types import ShardingPlan

    from rayemb.planner import plan, tables_from_schema
    from rayemb.planner.step_time import DEFAULT_CALIBRATION, StepTimeCostModel, predict_step_time

    global_batch = cfg.data.batch_size * topology.world_size
    specs = tables_from_schema(schema, cfg.model.embedding_dim, topology, global_batch, stats, split=split)
    calibration = calibration or DEFAULT_CALIBRATION
    chooser = StepTimeCostModel(calibration) if cfg.planner.objective == "step_time" else None
    # Training needs a TorchRec plan of the real module, so the torchrec engine; "fast" is for what-if plans.
    result = plan(specs, topology, global_batch, pins=pins_of(cfg, schema.sparse_names), engine="torchrec",
                  chooser=chooser)
    hot_ids = {name: split.hot_ids(name) for name, tp in result.tables.items() if tp.placement.value == "hybrid"}
    sharding_plan = ShardingPlan(
        plan={f"{EMBEDDING_MODULE}.{path}": module_plan for path, module_plan in result.sharding_plan.plan.items()}
    )
    summary = result.to_json()
    predicted = predict_step_time(specs, {n: tp.placement for n, tp in result.tables.items()}, topology,
                                  global_batch, calibration)
    summary["objective"] = cfg.planner.objective
    summary["predicted_step_time_s"] = predicted.total_s
    summary["predicted_step_time_components_s"] = predicted.components
    summary["calibration"] = calibration.to_dict()
    return JobPlan(sharding_plan=sharding_plan, placements=dict(result.tables), hot_ids=hot_ids, summary=summary)
