"""The planner's inputs: :class:`TableSpec` s from a dataset schema and statistics, and the default split rule.

:func:`tables_from_schema` turns ``schema.yaml`` (+ ``stats.json`` and its split) into
table specs with pooling factors and hot sets; :func:`split_rule` is the
frequent-category rule (HugeCTR's, :mod:`rayemb.planner.split`) sized for a
topology; :func:`criteo_1tb_tables` gives benchmark tables. Pure: no torch.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple, Union

from rayemb.constants import CRITEO_1TB_CARDINALITIES
from rayemb.planner.cost import DEFAULT_REPLICATED_FRACTION
from rayemb.planner.optimizer_state import DEFAULT_EMBEDDING_OPTIMIZER, optimizer_state_bytes
from rayemb.planner.split import HugeCTRSplitRule
from rayemb.planner.step_time import hot_threshold
from rayemb.planner.types import ClusterTopology, TableSpec


def split_rule(topology: ClusterTopology, global_batch: int, embedding_dim: Union[int, Mapping[str, int]],
               bytes_per_element: int = 4, calibration: Any = None,
               embedding_optimizer: str = DEFAULT_EMBEDDING_OPTIMIZER):
    """The frequent-category rule for ``topology``: HugeCTR's, with its bandwidths and a replicated-row budget.

    Across nodes with a measured ``calibration`` (:class:`rayemb.planner.step_time.Calibration`), an id is hot
    from the step-time model's break-even (:func:`~rayemb.planner.step_time.hot_threshold`) instead of
    HugeCTR's bandwidth formula. That formula makes an id hot from N²/(N-1) occurrences per global batch at
    equal bandwidths (4 on 2 nodes), while by the bytes rayemb's hybrid really moves a hot row costs about
    what one cold occurrence does; and gloo's all-to-all moves half the all-reduce's bytes/s on a shaped
    link, which halves the break-even again (docs/planner.md). On one node HugeCTR's duplication rule stays:
    there the exchange is nearly free and the model's compute terms decide. ``bytes_per_element``: the tables'
    stored element size (``model.embedding_dtype``), which sizes the hot rows against the replicated-row budget,
    with the optimizer state of ``embedding_optimizer`` (``train.embedding_optimizer``) each replicated row keeps.
    ``embedding_dim``: one for all tables, or table -> its dim (every table of the statistics split), which then
    prices each table's hot rows, optimizer state and break-even with its own width: a wide table's row costs
    more to replicate against the same per-occurrence id bytes and lookup, so its ids need more occurrences.
    """
    bw = topology.inter_node_bw if topology.num_nodes > 1 else topology.intra_node_bw
    calibrated = (calibration is not None and getattr(calibration, "source", None) == "measured"
                  and topology.num_nodes > 1)
    return HugeCTRSplitRule(
        topology.world_size, global_batch, num_nodes=topology.num_nodes,
        bw_all_to_all=bw, bw_all_reduce=bw,
        memory_budget_bytes=int(DEFAULT_REPLICATED_FRACTION * topology.capacity_bytes),
        embedding_dim=embedding_dim, bytes_per_element=bytes_per_element,
        optimizer_bytes_per_row=_per_table(embedding_dim, lambda d: optimizer_state_bytes(embedding_optimizer, d)),
        # the break-even prices bytes on the wire, fp32 lookup outputs whatever the tables' dtype
        threshold=_per_table(embedding_dim, lambda d: hot_threshold(calibration, topology.world_size, d))
        if calibrated else None,
    )


def _per_table(dims: Union[int, Mapping[str, int]], fn: Any) -> Any:
    return {t: fn(int(d)) for t, d in dims.items()} if isinstance(dims, Mapping) else fn(int(dims))


def tables_from_schema(schema: Any, embedding_dim: int, *, stats: Any = None, split: Any = None,
                       bytes_per_element: int = 4,
                       embedding_optimizer: str = DEFAULT_EMBEDDING_OPTIMIZER) -> List[TableSpec]:
    """TableSpecs of a dataset schema, one per pooled table (a table two features read is one spec, its dim the
    table's own ``embedding_dim`` else ``embedding_dim``); with ``stats`` (a DatasetStats, per feature or per
    table: :meth:`~rayemb.data.schema.DatasetSchema.table_stats`) pooling factors, a shared table's the sum of its
    features' (each row looks it up once per feature), and hot sets from ``split`` (the
    :class:`rayemb.planner.split.FrequentSplit` of those statistics, required with them).
    ``embedding_optimizer`` (``train.embedding_optimizer``) sizes every row's optimizer state.

    The split is the caller's: it depends on the world size, the global batch and (across nodes) the
    calibration the job plans with, which a schema and statistics do not know.
    """
    hot: Dict[str, Tuple[int, float]] = {}
    pooling: Dict[str, float] = {}
    if stats is not None:
        if split is None:
            raise TypeError("tables_from_schema(stats=...) needs split=, the frequent-category split of those "
                            "statistics for the world planned (split_rule(topology, global_batch, dim).split(stats); "
                            "rayemb.train.world_plan.plan_world makes a job's)")
        for name, ts in split.tables.items():
            hot[name] = (ts.num_hot, float(ts.hot_share))
        table_stats = schema.table_stats(stats) if hasattr(schema, "table_stats") else stats
        for name, st in table_stats.tables.items():
            pooling[name] = float(st.pooling_mean)
    tables = schema.tables if hasattr(schema, "tables") else schema.sparse
    dims = schema.table_dims(embedding_dim) if hasattr(schema, "table_dims") else {}
    out = []
    for f in tables:
        h_rows, h_share = hot.get(f.name, (0, 0.0))
        out.append(TableSpec(
            name=f.name, rows=int(f.num_embeddings), dim=dims.get(f.name, embedding_dim),
            bytes_per_element=bytes_per_element, embedding_optimizer=embedding_optimizer,
            pooling_factor=pooling.get(f.name, 1.0), hot_rows=min(int(h_rows), int(f.num_embeddings)),
            hot_share=h_share,
        ))
    return out


def criteo_1tb_tables(num_tables: int, dim: int = 128) -> List[TableSpec]:
    """``num_tables`` tables with Criteo-1TB cardinalities repeated (``C1``, ``C2``, ..., then ``C27`` = C1's)."""
    card = CRITEO_1TB_CARDINALITIES
    return [TableSpec(f"C{i + 1}", rows=int(card[i % len(card)]), dim=dim) for i in range(num_tables)]


__all__ = ["split_rule", "tables_from_schema", "criteo_1tb_tables"]
