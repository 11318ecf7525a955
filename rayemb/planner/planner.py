"""``plan()``: tables + topology + global batch (+ pins) -> :class:`~rayemb.planner.types.PlanResult`.

Two stages (DESIGN §4, STYLE §12 — pure: no process group, no GPU, no Ray):

1. **Choose** a placement per table with the cost model
   (:class:`~rayemb.planner.cost.BytesCostModel`): data-parallel, pooled
   model-parallel or hybrid, honouring pins.
2. **Place** shards on ranks, by one of two engines:

   * ``"torchrec"``: TorchRec's ``EmbeddingShardingPlanner`` on a meta-device
     module built from the specs (a ``HybridEmbeddingBagCollection`` when some
     tables are hybrid), steered by ``ParameterConstraints`` from stage 1 and
     our :class:`~rayemb.planner.proposers.MemoryBinnedDPProposer`; the
     resulting ``ShardingPlan`` is kept on ``PlanResult.sharding_plan``.
   * ``"fast"``: our own assignment — replicated rows on every rank, row-wise
     tables evenly on all ranks, table-row-wise on the least-loaded node,
     table-wise / column-wise shards grouped onto ranks heaviest-first
     (:func:`~rayemb.planner.proposers.balanced_groups`). O(tables x log W)
     plus O(W) per row-wise table: plans 500 tables on 1024 ranks in well
     under a second, where TorchRec's enumerator builds 1024 shards per option
     per table. :func:`to_sharding_plan` turns it into a TorchRec plan.

   ``"auto"`` picks ``torchrec`` while ``world_size x tables <= 2048``.

This module imports torchrec lazily: :func:`load_plan_json` works on a head
node without torchrec.

Example::

    >>> topo = described_topology(world_size=16, gpus_per_node=8, hbm_gib=80)
    >>> result = plan([TableSpec("C1", rows=10**6, dim=64)], topo, global_batch=65536, engine="fast")
    >>> result.tables["C1"].placement.value, result.all_fit()
    ('table_row_wise', True)
    >>> json.dump(result.to_json(), open("plan.json", "w"))
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from rayemb.errors import PlanError
from rayemb.planner.cost import (
    OPTIMIZER_STATE_BYTES,
    BytesCostModel,
    column_shards,
    table_bytes,
    table_memory,
)
from rayemb.planner.types import (
    INSUFFICIENT_STORAGE,
    INVALID_PIN,
    STORAGE_REMEDIES,
    ClusterTopology,
    Cost,
    GiB,
    Placement,
    PlacementChooser,
    PlanResult,
    RankAssigner,
    RankUsage,
    TablePin,
    TablePlan,
    TableSpec,
    parse_pins,
)

logger = logging.getLogger(__name__)

#: world_size x tables up to which ``engine="auto"`` runs TorchRec's planner
TORCHREC_ENGINE_MAX_CELLS = 2048
ENGINES = ("auto", "torchrec", "fast")


# ---- FAST ENGINE ---- #


class GreedyRankAssigner(RankAssigner):
    """Replicated rows everywhere, row-wise evenly, whole shards heaviest-first onto the lightest rank."""

    def assign(
        self, tables: Sequence[TableSpec], choices: Mapping[str, Cost], topology: ClusterTopology
    ) -> Tuple[Dict[str, Tuple[int, ...]], List[int]]:
        from rayemb.planner.proposers import balanced_groups

        w, l = topology.world_size, topology.devices_per_node
        load = [0.0] * w
        ranks: Dict[str, Tuple[int, ...]] = {}
        whole: List[Tuple[str, float]] = []  # (table, bytes) of table-wise pieces
        cw: List[Tuple[str, int, float]] = []  # (table, k shards, bytes per shard)
        twrw: List[Tuple[str, float]] = []
        all_ranks = tuple(range(w))
        by_name = {t.name: t for t in tables}
        for t in tables:
            c = choices[t.name]
            p = c.placement
            if p in (Placement.DATA_PARALLEL, Placement.ROW_WISE, Placement.HYBRID):
                per_rank = c.memory_bytes / w
                for r in range(w):
                    load[r] += per_rank
                ranks[t.name] = all_ranks
            elif p == Placement.TABLE_WISE:
                whole.append((t.name, float(c.memory_bytes)))
            elif p == Placement.TABLE_ROW_WISE:
                twrw.append((t.name, float(c.memory_bytes)))
            else:
                k = column_shards(t.dim, w if p == Placement.COLUMN_WISE else l)
                cw.append((t.name, k, c.memory_bytes / k))
        if twrw:
            node_load = [sum(load[n * l:(n + 1) * l]) for n in range(topology.num_nodes)]
            for (name, nbytes), node in zip(twrw, balanced_groups([b for _, b in twrw], topology.num_nodes, node_load)):
                for r in range(node * l, (node + 1) * l):
                    load[r] += nbytes / l
                ranks[name] = tuple(range(node * l, (node + 1) * l))
        # column shards of one table go to distinct ranks: place them largest table first
        for name, k, per in sorted(cw, key=lambda x: -x[1] * x[2]):
            pool = range(w) if choices[name].placement == Placement.COLUMN_WISE else None
            if pool is None:  # TWCW: the least-loaded node
                node = min(range(topology.num_nodes), key=lambda n: sum(load[n * l:(n + 1) * l]))
                pool = range(node * l, (node + 1) * l)
            picked = sorted(pool, key=lambda r: load[r])[:k]
            for r in picked:
                load[r] += per
            ranks[name] = tuple(sorted(picked))
        for (name, nbytes), r in zip(whole, balanced_groups([b for _, b in whole], w, load)):
            load[r] += nbytes
            ranks[name] = (r,)
        del by_name
        return ranks, [int(math.ceil(x)) for x in load]


# ---- TORCHREC ENGINE ---- #


def _sharding_types_for(placement: Placement, pin: Optional[TablePin], topology: ClusterTopology) -> List[str]:
    if placement == Placement.DATA_PARALLEL or (pin is not None and pin.sharding is not None):
        return [placement.value]
    # the cost model's split-or-not decision stands (a table it splits for balance is never whole);
    # among the remaining pooled types the proposer chooses by TorchRec's perf estimate
    options = [placement.value, Placement.ROW_WISE.value, Placement.COLUMN_WISE.value]
    if placement == Placement.TABLE_WISE:
        options.append(Placement.TABLE_WISE.value)
    if topology.num_nodes > 1:
        options.append(Placement.TABLE_ROW_WISE.value)
    return list(dict.fromkeys(options))


def _torchrec_plan(
    tables: Sequence[TableSpec],
    choices: Mapping[str, Cost],
    pins: Mapping[str, TablePin],
    topology: ClusterTopology,
    global_batch: int,
    proposer: Any,
) -> Tuple[Any, Dict[str, Tuple[str, Tuple[int, ...], str]], List[int]]:
    """Runs TorchRec's planner; returns (ShardingPlan, {table: (sharding_type, ranks, kernel)}, per-rank bytes)."""
    import numpy as np
    import torch
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import ParameterConstraints, PlannerError
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from rayemb.embedding.hybrid import COLD_SUFFIX, HOT_SUFFIX, HybridEmbeddingBagCollection
    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.planner.proposers import MemoryBinnedDPProposer
    from rayemb.planner.topology import to_torchrec_topology

    configs = [
        EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name])
        for t in tables
    ]
    hot_ids = {
        t.name: np.arange(t.hot_rows, dtype=np.int64) for t in tables if choices[t.name].placement == Placement.HYBRID
    }
    module = HybridEmbeddingBagCollection(configs, hot_ids=hot_ids, device=torch.device("meta"))
    constraints: Dict[str, ParameterConstraints] = {}
    for t in tables:
        pin = pins.get(t.name)
        kernels = [pin.compute_kernel] if pin is not None and pin.compute_kernel else None
        pf = [max(t.pooling_factor, 1e-3)]
        p = choices[t.name].placement
        if p == Placement.HYBRID:
            if t.hot_rows:
                constraints[t.name + HOT_SUFFIX] = ParameterConstraints(
                    sharding_types=["data_parallel"], compute_kernels=["dense"], pooling_factors=[t.hot_share * t.pooling_factor or 1e-3])
            if t.cold_rows:
                constraints[t.name + COLD_SUFFIX] = ParameterConstraints(
                    sharding_types=["row_wise"], compute_kernels=kernels or ["fused"],
                    pooling_factors=[max((1 - t.hot_share) * t.pooling_factor, 1e-3)])
        else:
            constraints[t.name] = ParameterConstraints(
                sharding_types=_sharding_types_for(p, pin, topology),
                compute_kernels=["dense"] if p == Placement.DATA_PARALLEL else kernels,
                pooling_factors=pf,
            )
    tr_topology = to_torchrec_topology(topology)
    planner = EmbeddingShardingPlanner(
        topology=tr_topology,
        batch_size=max(1, global_batch // topology.world_size),
        constraints=constraints,
        proposer=proposer if proposer is not None else MemoryBinnedDPProposer(),
        storage_reservation=FixedPercentageStorageReservation(topology.reserved_fraction),
    )
    try:
        sharding_plan = planner.plan(module, cpu_capable_sharders())
    except PlannerError as e:
        raise PlanError(
            f"TorchRec's planner found no placement of {len(tables)} tables on {topology.world_size} ranks of "
            f"{topology.device_bytes / GiB:.1f} GiB ({type(e).__name__}: {str(e).splitlines()[0]}). Possible "
            f"solutions: {STORAGE_REMEDIES}.", INSUFFICIENT_STORAGE,
        ) from None

    by_table: Dict[str, Tuple[str, Tuple[int, ...], str]] = {}
    load = [0] * topology.world_size
    spec = {t.name: t for t in tables}
    for path, module_plan in sharding_plan.plan.items():
        for sub, ps in module_plan.items():
            name = sub.removesuffix(HOT_SUFFIX).removesuffix(COLD_SUFFIX)
            t = spec[name]
            if ps.sharding_type == "data_parallel":
                rows = t.hot_rows if sub.endswith(HOT_SUFFIX) else t.rows
                for r in range(topology.world_size):
                    load[r] += rows * t.dim * (t.bytes_per_element + OPTIMIZER_STATE_BYTES)
                shard_ranks = tuple(range(topology.world_size))
            else:
                for sh in ps.sharding_spec.shards:
                    rr, cc = sh.shard_sizes
                    load[sh.placement.rank()] += rr * (cc * t.bytes_per_element + OPTIMIZER_STATE_BYTES)
                shard_ranks = tuple(sorted({sh.placement.rank() for sh in ps.sharding_spec.shards}))
            if sub.endswith(HOT_SUFFIX) and name in by_table:
                continue  # the cold half decides a hybrid table's sharding type and ranks
            if sub.endswith(HOT_SUFFIX):
                by_table[name] = ("data_parallel", shard_ranks, ps.compute_kernel)
            else:
                by_table[name] = (ps.sharding_type, shard_ranks, ps.compute_kernel)
    return sharding_plan, by_table, load


# ---- PLAN ---- #


def plan(
    tables: Sequence[TableSpec],
    topology: ClusterTopology,
    global_batch: int,
    pins: Optional[Mapping[str, Any]] = None,
    proposer: Any = None,
    engine: str = "auto",
    chooser: Optional[PlacementChooser] = None,
    assigner: Optional[RankAssigner] = None,
) -> PlanResult:
    """Plans ``tables`` on ``topology`` for ``global_batch`` samples per step.

    ``pins``: ``{table: {"sharding": "row_wise", "hybrid": False, "compute_kernel": "fused"}}``
    (or :class:`TablePin` values). ``proposer``: a TorchRec ``Proposer`` (or a
    list) for the ``torchrec`` engine (default :class:`MemoryBinnedDPProposer`).
    Raises :class:`PlanError` (``insufficient_storage``, ``invalid_pin``).
    """
    if engine not in ENGINES:
        raise PlanError(f"Unknown planner engine {engine!r}; use one of {ENGINES}.", INVALID_PIN)
    if not tables:
        raise PlanError("No tables to plan; the dataset schema declares no sparse features.", INVALID_PIN)
    if global_batch < topology.world_size:
        raise PlanError(
            f"Global batch {global_batch} is smaller than the world size {topology.world_size}; every rank needs "
            "at least one sample per step. Raise data.batch_size.", INVALID_PIN,
        )
    pin_map = parse_pins(pins, [t.name for t in tables])
    choices = (chooser or BytesCostModel()).choose(tables, topology, global_batch, pin_map)
    if engine == "auto":
        engine = "torchrec" if topology.world_size * len(tables) <= TORCHREC_ENGINE_MAX_CELLS else "fast"
    w, l = topology.world_size, topology.devices_per_node
    sharding_plan = None
    if engine == "torchrec":
        sharding_plan, placed, load = _torchrec_plan(tables, choices, pin_map, topology, global_batch, proposer)
    else:
        ranks, load = (assigner or GreedyRankAssigner()).assign(tables, choices, topology)
        placed = {}
        for t in tables:
            p = choices[t.name].placement
            kernel = "dense" if p == Placement.DATA_PARALLEL else ((pin_map.get(t.name) or TablePin()).compute_kernel or "fused")
            placed[t.name] = (Placement.ROW_WISE.value if p == Placement.HYBRID else p.value, ranks[t.name], kernel)

    out: Dict[str, TablePlan] = {}
    for t in tables:
        chosen = choices[t.name].placement
        sharding_type, ranks_t, kernel = placed[t.name]
        placement = chosen if chosen in (Placement.HYBRID, Placement.DATA_PARALLEL) else Placement(sharding_type)
        out[t.name] = TablePlan(
            name=t.name, placement=placement, sharding_type=sharding_type, ranks=tuple(ranks_t),
            hot_rows=t.hot_rows if placement == Placement.HYBRID else 0,
            predicted_bytes_per_step=table_bytes(t, placement, w, l, global_batch),
            memory_bytes=table_memory(t, placement, w, l).memory_bytes, compute_kernel=str(kernel),
        )
    usage = tuple(RankUsage(r, int(load[r]), topology.capacity_bytes) for r in range(w))
    result = PlanResult(world_size=w, global_batch=global_batch, tables=out, ranks=usage, topology=topology,
                        engine=engine, sharding_plan=sharding_plan)
    over = [u for u in usage if not u.fits()]
    if over:
        worst = max(over, key=lambda u: u.memory_bytes)
        raise PlanError(
            f"The plan does not fit: {len(over)} of {w} ranks exceed their table capacity (rank {worst.rank} needs "
            f"{worst.memory_bytes / GiB:.2f} GiB of {worst.capacity_bytes / GiB:.2f} GiB). Possible solutions: "
            f"{STORAGE_REMEDIES}.", INSUFFICIENT_STORAGE,
        )
    logger.info("planned %d tables on %d ranks (%s engine): %s, %.3g bytes/step, max/mean memory %.3f",
                len(tables), w, engine, result.placement_counts(), result.predicted_bytes_per_step,
                result.memory_imbalance)
    return result


def to_sharding_plan(result: PlanResult, module: Any, local_world_size: Optional[int] = None) -> Any:
    """TorchRec ``EmbeddingModuleShardingPlan`` for ``module`` (an ``EmbeddingBagCollection``) from ``result``.

    Exact ranks of the fast engine become TorchRec parameter shardings
    (``table_wise(rank)``, ``row_wise()``, ``column_wise(ranks)``,
    ``table_row_wise(host_index)``, ``data_parallel()``). Hybrid tables are
    planned by the ``torchrec`` engine (``result.sharding_plan``).
    """
    from torchrec.distributed import sharding_plan as sp

    from rayemb.embedding.sharders import CpuCapableEmbeddingBagCollectionSharder

    topo = result.topology
    l = local_world_size or (topo.devices_per_node if topo else result.world_size)
    per_param = {}
    for name, t in result.tables.items():
        p = t.placement
        if p == Placement.DATA_PARALLEL:
            per_param[name] = sp.data_parallel()
        elif p == Placement.TABLE_WISE:
            per_param[name] = sp.table_wise(rank=t.ranks[0], compute_kernel=t.compute_kernel)
        elif p == Placement.ROW_WISE:
            per_param[name] = sp.row_wise(compute_kernel=t.compute_kernel)
        elif p in (Placement.COLUMN_WISE, Placement.TABLE_COLUMN_WISE):
            per_param[name] = sp.column_wise(ranks=list(t.ranks), compute_kernel=t.compute_kernel)
        elif p == Placement.TABLE_ROW_WISE:
            per_param[name] = sp.table_row_wise(host_index=t.ranks[0] // l)
        else:
            raise PlanError(
                f"Table {name!r} is hybrid; build its TorchRec plan with engine='torchrec' (PlanResult.sharding_plan) "
                "or rayemb.embedding.hybrid.hybrid_constraints.", INVALID_PIN,
            )
    device = topo.compute_device if topo else "cpu"
    return sp.construct_module_sharding_plan(
        module, per_param, sharder=CpuCapableEmbeddingBagCollectionSharder(), local_size=l,
        world_size=result.world_size, device_type=device,
    )


# ---- INPUTS ---- #


def split_rule(topology: ClusterTopology, global_batch: int, embedding_dim: int, bytes_per_element: int = 4):
    """The default frequent-category rule for ``topology``: HugeCTR's, with its bandwidths and a replicated-row budget."""
    from rayemb.planner.cost import DEFAULT_REPLICATED_FRACTION
    from rayemb.planner.split import HugeCTRSplitRule

    bw = topology.inter_node_bw if topology.num_nodes > 1 else topology.intra_node_bw
    return HugeCTRSplitRule(
        topology.world_size, global_batch, num_nodes=topology.num_nodes,
        bw_all_to_all=bw, bw_all_reduce=bw,
        memory_budget_bytes=int(DEFAULT_REPLICATED_FRACTION * topology.capacity_bytes),
        embedding_dim=embedding_dim, bytes_per_element=bytes_per_element,
        optimizer_bytes_per_row=embedding_dim * OPTIMIZER_STATE_BYTES,
    )


def tables_from_schema(
    schema: Any,
    embedding_dim: int,
    topology: ClusterTopology,
    global_batch: int,
    stats: Optional[Mapping[str, Any]] = None,
    bytes_per_element: int = 4,
    split: Any = None,
) -> List[TableSpec]:
    """TableSpecs of a dataset schema; with ``stats`` (stats.json) pooling factors and hot sets from the split.

    The hot set comes from ``split`` (a :class:`rayemb.planner.split.FrequentSplit`)
    when given, else from :func:`split_rule` applied to ``stats``.
    """
    hot: Dict[str, Tuple[int, float]] = {}
    pooling: Dict[str, float] = {}
    if stats is not None:
        if split is None:
            split = split_rule(topology, global_batch, embedding_dim, bytes_per_element).split(stats)
        for name, ts in split.tables.items():
            hot[name] = (ts.num_hot, float(ts.hot_share))
        for name, st in stats.get("tables", {}).items():
            pf = st.get("pooling_factor", {})
            pooling[name] = float(pf.get("mean", 1.0)) if isinstance(pf, Mapping) else float(pf)
    out = []
    for f in schema.sparse:
        h_rows, h_share = hot.get(f.name, (0, 0.0))
        out.append(TableSpec(
            name=f.name, rows=int(f.num_embeddings), dim=embedding_dim, bytes_per_element=bytes_per_element,
            pooling_factor=pooling.get(f.name, 1.0), hot_rows=min(int(h_rows), int(f.num_embeddings)),
            hot_share=h_share,
        ))
    return out


def criteo_1tb_tables(num_tables: int, dim: int = 128) -> List[TableSpec]:
    """``num_tables`` tables with Criteo-1TB cardinalities repeated (``C1``, ``C2``, ..., then ``C27`` = C1's)."""
    from rayemb.constants import CRITEO_1TB_CARDINALITIES

    card = CRITEO_1TB_CARDINALITIES
    return [TableSpec(f"C{i + 1}", rows=int(card[i % len(card)]), dim=dim) for i in range(num_tables)]


# ---- OUTPUTS ---- #


def load_plan_json(path: str) -> PlanResult:
    """Reads ``plan.json`` (no torchrec import: works on a CPU-only head)."""
    try:
        with open(path) as f:
            d = json.load(f)
    except FileNotFoundError:
        raise PlanError(f"Plan file {path!r} does not exist. Create it with `rayemb plan --config JOB.yaml --out "
                        f"{path}`.", "invalid_plan_file") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"Plan file {path!r} is not valid JSON ({e}). Regenerate it with `rayemb plan`.",
                        "invalid_plan_file") from None
    return PlanResult.from_json(d, source=path)


def save_plan_json(result: PlanResult, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result.to_json(), f, indent=1)
    return path


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def summary_table(result: PlanResult, max_rows: int = 40) -> str:
    """Per-table and per-rank text tables (the ranks summarised when there are many)."""
    lines = [f"plan: {len(result.tables)} tables on {result.world_size} ranks, engine={result.engine}, "
             f"predicted {_human(result.predicted_bytes_per_step)}/step, max/mean memory {result.memory_imbalance:.3f}",
             "", f"{'table':<10} {'placement':<18} {'sharding':<18} {'ranks':>8} {'hot_rows':>9} {'memory':>11} {'bytes/step':>11}"]
    items = list(result.tables.values())
    for t in items[:max_rows]:
        rk = f"{len(t.ranks)} rk" if len(t.ranks) > 1 else f"r{t.ranks[0]}" if t.ranks else "-"
        lines.append(f"{t.name:<10} {t.placement.value:<18} {t.sharding_type:<18} {rk:>8} {t.hot_rows:>9} "
                     f"{_human(t.memory_bytes):>11} {_human(t.predicted_bytes_per_step):>11}")
    if len(items) > max_rows:
        lines.append(f"... {len(items) - max_rows} more tables (see plan.json)")
    lines += ["", f"{'rank':>6} {'memory':>11} {'capacity':>11} {'used':>7}"]
    ranks = list(result.ranks)
    shown = ranks if len(ranks) <= 16 else sorted(ranks, key=lambda r: -r.memory_bytes)[:8]
    for r in shown:
        lines.append(f"{r.rank:>6} {_human(r.memory_bytes):>11} {_human(r.capacity_bytes):>11} {r.utilization:>6.1%}")
    if len(ranks) > 16:
        lines.append(f"(8 fullest of {len(ranks)} ranks shown; least used {min(r.utilization for r in ranks):.1%})")
    return "\n".join(lines)


def plot_plan(result: PlanResult, path: str) -> str:
    """PNG: per-rank table memory against capacity, and predicted bytes per step by table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    mem = [r.memory_bytes / GiB for r in result.ranks]
    ax1.bar(range(len(mem)), mem, width=1.0, color="tab:blue")
    ax1.axhline(result.ranks[0].capacity_bytes / GiB, color="tab:red", linestyle="--", label="capacity")
    ax1.set_xlabel("rank")
    ax1.set_ylabel("table memory (GiB)")
    ax1.set_title("memory per rank")
    ax1.legend()
    top = sorted(result.tables.values(), key=lambda t: -t.predicted_bytes_per_step)[:30]
    ax2.barh([f"{t.name} ({t.placement.value})" for t in top][::-1],
             [t.predicted_bytes_per_step / 2**20 for t in top][::-1], color="tab:orange")
    ax2.set_xlabel("predicted MiB per step (all ranks, fwd+bwd)")
    ax2.set_title(f"traffic: {result.predicted_bytes_per_step / 2**20:.1f} MiB/step total")
    ax2.tick_params(axis="y", labelsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---- CLI ---- #


def add_plan_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``rayemb plan`` (the lead wires the subcommand in rayemb/cli.py)."""
    parser.add_argument("--config", required=True, help="job YAML (data.path, model.embedding_dim, data.batch_size)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, e.g. --set model.embedding_dim=64")
    parser.add_argument("--stats", help="stats.json from `rayemb stats` (pooling factors, hot sets)")
    parser.add_argument("--world-size", type=int, help="plan for a described cluster of N ranks (what-if)")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="devices per node (default 8, cpu: 1)")
    parser.add_argument("--hbm-gib", type=float, help="GPU memory per device in GiB (default 80)")
    parser.add_argument("--ddr-gib", type=float, help="host memory per rank in GiB (default 128)")
    parser.add_argument("--cpu", action="store_true", help="described cluster without GPUs (tables in host memory)")
    parser.add_argument("--pins", help="YAML/JSON file {TABLE: {sharding: row_wise, hybrid: false, compute_kernel: fused}}")
    parser.add_argument("--engine", choices=ENGINES, default="auto", help="placement engine (default auto)")
    parser.add_argument("--out", required=True, help="plan.json to write (a PNG is written next to it)")
    return parser


def plan_main(args: argparse.Namespace) -> int:
    """``rayemb plan``: writes plan.json + plan.png, prints the tables. User errors raise RayembError subclasses."""
    import yaml

    from rayemb.config import load_config, resolve_path
    from rayemb.data.schema import DatasetSchema
    from rayemb.planner.topology import described_topology, topology_from_ray

    cfg = load_config(args.config, args.overrides)
    schema = DatasetSchema.load(resolve_path(cfg.data.path))
    if args.world_size:
        topo = described_topology(
            args.world_size, args.gpus_per_node or (1 if args.cpu else 8), hbm_gib=args.hbm_gib,
            ddr_gib=args.ddr_gib, compute_device="cpu" if args.cpu else "cuda",
        )
        global_batch = cfg.data.batch_size * args.world_size
    else:
        from rayemb._ray import init_ray

        init_ray()
        topo = topology_from_ray(num_workers=cfg.scaling.num_workers)
        if args.hbm_gib:
            topo = topo.with_overrides(hbm_bytes=int(args.hbm_gib * GiB))
        global_batch = cfg.data.batch_size * topo.world_size
    stats = None
    if args.stats:
        from rayemb.data.stats import load_stats_json

        stats = load_stats_json(args.stats)
    pins = None
    if args.pins:
        with open(args.pins) as f:
            pins = yaml.safe_load(f) or {}
    tables = tables_from_schema(schema, cfg.model.embedding_dim, topo, global_batch, stats)
    result = plan(tables, topo, global_batch, pins=pins, engine=args.engine)
    save_plan_json(result, args.out)
    png = plot_plan(result, os.path.splitext(args.out)[0] + ".png")
    print(summary_table(result))
    print(f"\nwrote {args.out} and {png}")
    return 0


__all__ = [
    "plan", "to_sharding_plan", "tables_from_schema", "criteo_1tb_tables", "load_plan_json", "save_plan_json",
    "summary_table", "plot_plan", "add_plan_arguments", "plan_main", "GreedyRankAssigner", "ENGINES",
]
