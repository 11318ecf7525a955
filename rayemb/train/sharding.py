"""From statistics to a TorchRec ``ShardingPlan`` for the job's model, outside the workers.

The driver computes the frequent-category split (pure numpy) and then runs
rayemb's planner: the cost model picks data-parallel, pooled model-parallel or
hybrid per table and TorchRec's planner places the shards. The result travels
to every worker in the train loop config, so all ranks shard alike.

Raw-id tables (``ids: raw``, docs/raw_ids.md) are pinned row-wise, or hybrid with a row-wise
cold half when the split gives them hot ids (:func:`raw_pin`): the planner sizes them by their
capacity like any such table, and the module plan of their managed-collision EBC (the cold
half of a hybrid one) is :func:`rayemb.embedding.raw_tables.row_wise_plan`, under
:data:`RAW_MODULE`; a hybrid one's hot rows are planned data-parallel as any hot half.

Sequence features (``model.sequence_tower`` other than none) live in the DLRM's
``sequence`` EmbeddingCollection, which rayemb's pooled planner does not model:
:func:`sequence_plan` places it with TorchRec's ``EmbeddingShardingPlanner`` on
a meta copy (table-wise, row-wise or column-wise with equal-width shards), and
its module plan joins the job's ShardingPlan under the key ``sequence``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from rayemb.batch_shape import BatchShape
from rayemb.config import JobConfig
from rayemb.data.schema import DatasetSchema
from rayemb.embedding.kernels import check_embedding_optimizer
from rayemb.errors import PlanError
from rayemb.planner.pins import TablePin, parse_pins
from rayemb.planner.types import INVALID_PIN

#: where the embedding module sits in the DLRM (prefix of its sharding plan keys)
EMBEDDING_MODULE = "embedding"
#: where the sequence EmbeddingCollection sits in the DLRM (its sharding plan key)
SEQUENCE_MODULE = "sequence"
#: where the raw-id tables' managed-collision EBC sits in the pooled module (its sharding plan key)
RAW_MODULE = f"{EMBEDDING_MODULE}.raw"
#: the placement of a raw-id table's managed rows (all of them, or a hybrid one's cold half): TorchRec's
#: managed-collision modules shard row-wise only
RAW_PLACEMENT = "row_wise"
#: the sharding types a sequence table may take (TorchRec's EmbeddingCollection sharder on CPU and GPU)
SEQUENCE_SHARDING_TYPES = ("table_wise", "row_wise", "column_wise")


@dataclass
class JobPlan:
    """What the workers need to build and shard the model alike on every rank."""

    sharding_plan: Any  # torchrec ShardingPlan keyed by module path in the DLRM
    placements: Dict[str, Any]  # table -> rayemb.planner.types.TablePlan
    hot_ids: Dict[str, np.ndarray]  # hybrid table -> its replicated (hot) ids
    summary: Dict[str, Any]  # plan.json


def build_embeddings(cfg: JobConfig, schema: DatasetSchema, placements: Mapping[str, Any],
                     hot_ids: Mapping[str, np.ndarray], embedding_device: Any, dense_device: Any) -> Any:
    """The job's :class:`~rayemb.contract.model.Embeddings`: rayemb's hybrid embedding over the pooled tables
    (tables not placed hybrid stay an ordinary EBC) and the sequence collection, if the job uses one."""
    from rayemb.embedding.placements import hybrid_from_placements
    from rayemb.contract.model import Embeddings
    from rayemb.contract.tables import sequence_features, sequence_module, table_configs

    tables = table_configs(schema, cfg.model.embedding_dim, cfg.model.embedding_dtype)
    raw = [f for f in schema.sparse if f.name in schema.raw_names]
    pooled, _ = hybrid_from_placements(tables, placements, hot_ids, device=embedding_device, raw=raw)
    return Embeddings(pooled=pooled, features=tuple(schema.pooled_features), dim=cfg.model.embedding_dim,
                      dims=schema.feature_dims(cfg.model.embedding_dim),
                      sequence=sequence_module(cfg.model, schema, device=embedding_device),
                      sequence_features=tuple(sequence_features(cfg.model, schema)), device=dense_device)


def build_model(
    cfg: JobConfig, schema: DatasetSchema, placements: Mapping[str, Any], hot_ids: Mapping[str, np.ndarray],
    embedding_device: Any, dense_device: Any, model: Any = None,
) -> Tuple[Any, Any, Dict[str, str]]:
    """(the job's model, its :class:`~rayemb.contract.model.Embeddings`, where the model holds them).

    ``model``: a :class:`~rayemb.contract.factory.ModelSpec` (None: the config's ``model`` section's)."""
    from rayemb.contract.factory import model_spec

    spec = model if model is not None else model_spec(cfg.model)
    embeddings = build_embeddings(cfg, schema, placements, hot_ids, embedding_device, dense_device)
    built, paths = spec.build(embeddings, schema)
    return built, embeddings, paths


def plan_for_model(sharding_plan: Any, paths: Mapping[str, str]) -> Any:
    """The job's ShardingPlan keyed by where this model holds the embedding modules.

    Plans are made before any model exists, keyed as the DLRM holds them (:data:`EMBEDDING_MODULE`,
    :data:`SEQUENCE_MODULE`); a model of its own may hold them under other attribute names.
    """
    from torchrec.distributed.types import ShardingPlan

    pooled, sequence = paths["pooled"], paths.get("sequence", SEQUENCE_MODULE)
    out = {}
    for key, module_plan in sharding_plan.plan.items():
        if key == SEQUENCE_MODULE:
            out[sequence] = module_plan
        else:
            out[pooled + key[len(EMBEDDING_MODULE):]] = module_plan  # "embedding.<child>" -> "<pooled>.<child>"
    return ShardingPlan(plan=out)


def sequence_plan(cfg: JobConfig, schema: DatasetSchema, topology: Any, global_batch: int) -> Any:
    """TorchRec's module plan of the DLRM's ``sequence`` EmbeddingCollection, or None without sequence features.

    TorchRec's planner on a meta copy, constrained to :data:`SEQUENCE_SHARDING_TYPES`
    with the rayemb sharders. Column-wise shards of one collection all get one
    width (one dim per collection, one ``min_partition``): TorchRec 1.8 cannot
    mix shard widths of sequence tables on a rank (tests/dist/test_sequence_equivalence.py).
    """
    from torch import nn
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints, PlannerError

    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.errors import PlanError
    from rayemb.contract.tables import sequence_features, sequence_module
    from rayemb.planner.torchrec_plan import to_torchrec_topology

    features = sequence_features(cfg.model, schema)
    if not features:
        return None
    holder = nn.Module()
    holder.add_module(SEQUENCE_MODULE, sequence_module(cfg.model, schema, device=_meta()))
    dim = cfg.model.embedding_dim
    constraints = {
        f.name: ParameterConstraints(sharding_types=list(SEQUENCE_SHARDING_TYPES), min_partition=_cw_width(dim),
                                     pooling_factors=[float(f.max_length)])
        for f in features
    }
    planner = EmbeddingShardingPlanner(topology=to_torchrec_topology(topology),
                                       batch_size=BatchShape.of_global(global_batch, topology.world_size).local,
                                       constraints=constraints)
    try:
        plan = planner.plan(holder, cpu_capable_sharders())
    except PlannerError as e:
        raise PlanError(f"TorchRec's planner found no placement of the sequence tables {[f.name for f in features]} "
                        f"on {topology.world_size} ranks ({type(e).__name__}: {str(e).splitlines()[0]}). Lower "
                        "max_length or model.embedding_dim, or add ranks.", "insufficient_storage") from None
    module_plan = plan.plan[SEQUENCE_MODULE]
    widths = {int(sh.shard_sizes[1]) for ps in module_plan.values() if ps.sharding_type == "column_wise"
              for sh in ps.sharding_spec.shards}
    if len(widths) > 1:  # cannot happen with one dim and one min_partition; TorchRec would fail at the first step
        raise PlanError(f"The sequence tables' column-wise shards have widths {sorted(widths)}; TorchRec 1.8 needs "
                        "one width per rank. Report this plan; pin another model.embedding_dim meanwhile.",
                        "insufficient_storage")
    return module_plan


def raw_plan(cfg: JobConfig, schema: DatasetSchema, planned: Dict[str, Any], topology: Any,
             hot_ids: Optional[Mapping[str, np.ndarray]] = None) -> Dict[str, Any]:
    """The module plan of the raw-id tables (:data:`RAW_MODULE`), taken out of the plain and cold children's plans.

    The planner placed them as row-wise tables of their capacity in its planning module's plain EBC, or as
    hybrid ones whose cold half is row-wise; the job holds those rows in the managed-collision EBC (a hybrid
    table's: its capacity less its ``hot_ids``), which :func:`~rayemb.embedding.raw_tables.row_wise_plan`
    plans row-wise over the same ranks. Mutates ``planned`` (the plain and cold children lose the raw tables).
    """
    from rayemb.embedding.raw_tables import raw_id_collection, row_wise_plan
    from rayemb.embedding.remap import COLD_SUFFIX
    from rayemb.contract.tables import table_configs
    from rayemb.planner.types import INSUFFICIENT_STORAGE

    plain, cold = f"{EMBEDDING_MODULE}.plain", f"{EMBEDDING_MODULE}.cold."
    for key in [k for k in planned if k == plain or k.startswith(cold)]:
        for name in schema.raw_names:
            planned[key].pop(name, None)
            planned[key].pop(name + COLD_SUFFIX, None)
        if not planned[key]:
            del planned[key]
    raw = [f for f in schema.sparse if f.name in schema.raw_names]
    module = raw_id_collection(table_configs(schema, cfg.model.embedding_dim, cfg.model.embedding_dtype), raw,
                               device=_meta(), hot_rows={n: len(v) for n, v in (hot_ids or {}).items()
                                                         if n in schema.raw_names})
    try:
        return {RAW_MODULE: row_wise_plan(module, topology.world_size, topology.compute_device,
                                          topology.devices_per_node)}
    except ValueError as e:  # a shard too small to keep its default row and an id
        raise PlanError(str(e), INSUFFICIENT_STORAGE) from None


def _meta() -> Any:
    import torch

    return torch.device("meta")


def _cw_width(dim: int) -> int:
    """Column-shard width for ``dim``: half of it when that is a multiple of 4 (TorchRec's rule), else all of it."""
    return dim // 2 if dim % 8 == 0 else dim


def sequence_summary(module_plan: Any) -> Dict[str, Any]:
    """plan.json's ``sequence`` entry: per table its sharding type, ranks and shard widths."""
    out: Dict[str, Any] = {}
    for name, ps in module_plan.items():
        shards = ps.sharding_spec.shards if ps.sharding_spec is not None else []
        out[name] = {"sharding_type": ps.sharding_type, "compute_kernel": ps.compute_kernel,
                     "ranks": sorted({sh.placement.rank() for sh in shards}),
                     "shard_widths": sorted({int(sh.shard_sizes[1]) for sh in shards})}
    return out


def raw_pin(table: str, pin: Optional[Mapping[str, Any]], hybrid: bool = True) -> Dict[str, Any]:
    """The pin of raw-id table ``table``: hybrid with a row-wise cold half (when ``hybrid``, the default
    ``planner.hybrid``, and the user's ``pin`` does not say otherwise) or row-wise; the user's kernel (else
    ``fused``).

    :class:`PlanError` (``invalid_pin``) naming what is allowed when the user's ``pin`` asks for another
    placement or a compressed storage: a raw table's rows are the slots of TorchRec's managed-collision
    module, which shards row-wise only and keeps whole fp32 rows; its hot ids, if any, are replicated rows.
    """
    pin = dict(pin or {})
    allowed = {("sharding", RAW_PLACEMENT), ("sharding", "hybrid"), ("hybrid", True), ("hybrid", False)}
    asked = {k: v for k, v in pin.items() if k != "compute_kernel" and (k, v) not in allowed}
    if asked:
        wanted = ", ".join(f"{k}: {v}" for k, v in sorted(asked.items(), key=lambda kv: kv[0]))
        raise PlanError(f"Table {table!r} holds raw ids (ids: raw) and is pinned {{{wanted}}}; a raw-id table is "
                        f"placed {RAW_PLACEMENT} or hybrid with a {RAW_PLACEMENT} cold half (TorchRec's "
                        "managed-collision tables shard row-wise, whole fp32 rows). Allowed pins: {sharding: "
                        f"{RAW_PLACEMENT}}}, {{sharding: hybrid}}, {{hybrid: true|false}}, each with "
                        "compute_kernel: ..., or no pin.", INVALID_PIN)
    parsed = TablePin.from_dict(table, pin)  # a pin contradicting itself fails here, as any table's
    wants = parsed.hybrid if parsed.hybrid is not None else (
        parsed.sharding.value == "hybrid" if parsed.sharding is not None else hybrid)
    return {"sharding": "hybrid" if wants else RAW_PLACEMENT, "hybrid": bool(wants),
            "compute_kernel": pin.get("compute_kernel") or "fused"}


def pins_of(cfg: JobConfig, table_names: List[str], raw: Sequence[str] = (),
            split: Any = None) -> Dict[str, TablePin]:
    """The config's per-table pins, parsed and checked (:class:`PlanError` ``invalid_pin``) — the one parse.

    ``planner.hybrid: false`` forbids hybrid on every table not pinned otherwise; the ``raw`` tables (raw
    ids) are pinned by :func:`raw_pin`, row-wise where the ``split`` (when given) has no hot id for them.
    :func:`rayemb.planner.plan` takes the result as it is.
    """
    pins = cfg.planner.pins()
    for name in raw:
        pins[name] = raw_pin(name, pins.get(name), cfg.planner.hybrid)
        if split is not None and pins[name]["sharding"] == "hybrid" and not len(split.hot_ids(name)):
            pins[name].update(sharding=RAW_PLACEMENT, hybrid=False)  # nothing to replicate: all of it is managed
    if not cfg.planner.hybrid:
        for name in table_names:
            if name not in raw:
                pins.setdefault(name, {}).setdefault("hybrid", False)
    return parse_pins(pins, table_names)


def placement_choice(cfg: JobConfig, table_names: List[str], world_size: int, raw: Sequence[str] = ()
                     ) -> Optional[str]:
    """Why the job has no placement to choose (None: it has one): one rank, where every placement keeps every row
    on that rank; or every table pinned to a placement other than hybrid (a hybrid pin's hot set still depends
    on the calibration across nodes). The calibration and the plan probe measure only to choose."""
    if world_size == 1:
        return "one rank"
    pins = pins_of(cfg, table_names, raw)
    if all(pins.get(t) is not None and pins[t].sharding is not None and pins[t].sharding.value != "hybrid"
           for t in table_names):
        return "every table pinned"
    return None


def make_job_plan(cfg: JobConfig, schema: DatasetSchema, stats: Any, split: Any, topology: Any,
                  calibration: Any = None) -> JobPlan:
    """Plans the job's tables on ``topology`` with the split's hot sets (runs where torchrec imports).

    ``planner.objective: step_time`` chooses placements by predicted step time with ``calibration``
    (a :class:`~rayemb.planner.step_time.Calibration`; None: the built-in defaults); ``bytes`` by bytes
    per step. Either way plan.json records the step-time model's ``predicted_step_time_s`` and the constants
    used; no timing of this plan enters it (the plan probe adds its own figure as ``probed_step_time_s``).
    """
    from torchrec.distributed.types import ShardingPlan

    from rayemb.planner import plan, tables_from_schema
    from rayemb.planner.chooser import StepTimeCostModel
    from rayemb.planner.cost import BytesCostModel, ExchangeBytes
    from rayemb.planner.step_time import DEFAULT_CALIBRATION, predict_step_time

    global_batch = BatchShape(cfg.data.batch_size, topology.world_size).global_size
    specs = tables_from_schema(schema, cfg.model.embedding_dim, stats=stats, split=split,
                               bytes_per_element=cfg.model.embedding_bytes_per_element,
                               embedding_optimizer=cfg.train.embedding_optimizer)
    calibration = calibration or DEFAULT_CALIBRATION
    # ties to one module group on one node only: measured there (docs/planner.md, "Ties")
    tie_margin = cfg.planner.tie_margin if topology.num_nodes == 1 else 0.0
    exchange = ExchangeBytes.of(cfg.train.comm_precision)  # the bytes a 16-bit exchange really sends
    chooser = StepTimeCostModel(calibration, BytesCostModel(exchange=exchange), tie_margin=tie_margin) \
        if cfg.planner.objective == "step_time" else None
    # Training needs a TorchRec plan of the real module, so the torchrec engine; "fast" is for what-if plans.
    result = plan(specs, topology, global_batch, pins=pins_of(cfg, schema.table_names, schema.raw_names, split),
                  engine="torchrec", chooser=chooser, exchange=exchange)
    hot_ids = {name: split.hot_ids(name) for name, tp in result.tables.items() if tp.placement.value == "hybrid"}
    sharding_plan = ShardingPlan(
        plan={f"{EMBEDDING_MODULE}.{path}": module_plan for path, module_plan in result.sharding_plan.plan.items()}
    )
    summary = result.to_json()
    if schema.raw_names:
        sharding_plan.plan.update(raw_plan(cfg, schema, sharding_plan.plan, topology, hot_ids))
        summary["raw_tables"] = list(schema.raw_names)
    seq_plan = sequence_plan(cfg, schema, topology, global_batch)
    if seq_plan is not None:
        sharding_plan.plan[SEQUENCE_MODULE] = seq_plan
        summary["sequence"] = {"tower": cfg.model.sequence_tower, "tables": sequence_summary(seq_plan)}
    predicted = predict_step_time(specs, {n: tp.placement for n, tp in result.tables.items()}, topology,
                                  global_batch, calibration, exchange=exchange)
    summary["objective"] = cfg.planner.objective
    summary["predicted_step_time_s"] = predicted.total_s
    summary["predicted_step_time_components_s"] = predicted.components
    summary["predicted_step_time_families_s"] = predicted.families  # before learned ratios: what they are fitted to
    summary["calibration"] = calibration.to_dict()
    # before any worker starts: an optimizer without a kernel for a planned placement fails here, not in every rank
    check_embedding_optimizer(cfg.train.embedding_optimizer, sharding_plan, "cuda" if cfg.scaling.use_gpu else "cpu")
    return JobPlan(sharding_plan=sharding_plan, placements=dict(result.tables), hot_ids=hot_ids, summary=summary)
