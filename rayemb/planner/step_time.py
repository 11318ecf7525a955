"""Step-time model: the time one training step takes under a set of placements (the chooser: :mod:`.chooser`).

Bytes are not time. On one node gloo moves megabytes in microseconds while
every extra sharded module costs launches, KJT splits and collective
round-trips; on a 50 mbit link the same bytes cost seconds. So the planner
prices a plan as (per rank, seconds per step)::

    T = dense + ddp + Σ groups (overhead + calls · α_collective) + Σ tables compute
          + Σ collectives bytes/rank · β + overlap

* ``dense``: the dense arch's forward, backward and optimizer on the local batch;
* ``ddp``: the one ``DistributedDataParallel`` wrapper every job has (dense arch,
  data-parallel tables and hybrid hot rows share its buckets:
  :class:`~rayemb.embedding.data_parallel.OneDataParallelWrapper`): its hooks and its
  all-reduce's round trip, once per step. The data-parallel and hybrid probes
  each held a wrapper of their own, so :func:`normalize_probes` takes it off their
  fixed costs; priced once, a plan with both kinds no longer pays it twice;
* groups: one per sharded module TorchRec builds (data-parallel tables, each
  pooled sharding type, hybrid hot halves, hybrid cold halves), each with a
  fixed per-step overhead and its collective calls (:data:`GROUP_CALLS`);
* compute per table: ``lookup`` per id looked up on a rank (fused kernels),
  ``dense_lookup`` per id of a replicated table, ``replicated_elem`` per
  element of a replicated table (dense gradient, all-reduce prep, optimizer),
  ``pool`` per cold id pooled locally by a hybrid table;
* bytes per collective family from :mod:`rayemb.planner.traffic`, divided
  over the ranks, at the measured seconds per byte β; α is the measured
  latency of one call;
* ``overlap`` (<= 0): DDP's gradient all-reduce (dense arch, replicated
  tables, hybrid hot rows) runs on its own thread while the sharded modules'
  all-to-alls run, so the two families' wire times overlap. The calibration
  runs both families alone and together on the live backend
  (:func:`rayemb.train.calibration.calibrate.add_overlap`) and keeps the
  share of the shorter one's time that running them together hid
  (``overlap_fraction``); the term is that share of the shorter family's
  predicted time. Without a measurement (the built-in constants, older
  calibrations) it is assumed: together they take the longest of each alone
  and of all their bytes at the faster family's β, and the prediction lists
  ``overlap`` in :attr:`StepTimePrediction.assumed`;
* ``storage`` for compressed and cached tables
  (:func:`rayemb.planner.compression.storage_step_seconds`): two lookups per id
  for QR, the block projection's matmul and replicated elements, cache misses
  over the host link; their bytes are priced at the all-to-all β.

The constants are a :class:`Calibration`: measured at job start on the live
backend by :mod:`rayemb.train.calibration.calibrate` (raw collectives across the job's
ranks, compute micro-benchmarks on a worker's CPU share), or
:data:`DEFAULT_CALIBRATION` (2-core CPU, gloo over loopback). Pure: no torch.

Example::

    >>> t = [TableSpec("C1", rows=50_000, dim=16, hot_rows=500, hot_share=0.9)]
    >>> pred = predict_step_time(t, {"C1": Placement.HYBRID}, ClusterTopology(1, 2), 1024, DEFAULT_CALIBRATION)
    >>> pred.total_s > 0
    True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from rayemb.batch_shape import BatchShape
from rayemb.planner.compression import StoredCost, storage_step_seconds
from rayemb.planner.cost import FP32_EXCHANGE, ExchangeBytes, column_shards
from rayemb.planner.traffic import predict_table_bytes
from rayemb.planner.types import ClusterTopology, Placement, TableSpec


#: DDP's gradient bucket size: a replicated group all-reduces in ceil(bytes / this) calls
DDP_BUCKET_BYTES = 25 * 2**20
#: probe kinds whose probes hold replicated parameters, so a DistributedDataParallel wrapper of their own
REPLICATED_KINDS = (Placement.DATA_PARALLEL.value, Placement.HYBRID.value)
#: collective calls per step (forward + backward) of one sharded module group, by collective family
GROUP_CALLS: Dict[str, Dict[str, int]] = {
    # KJT all-to-all (splits, lengths, values), pooled output forward, gradient backward
    "table_wise": {"all_to_all": 5},
    "column_wise": {"all_to_all": 5},
    "table_column_wise": {"all_to_all": 5},
    "row_wise": {"all_to_all": 3, "reduce_scatter": 1, "all_gather": 1},
    "table_row_wise": {"all_to_all": 5, "reduce_scatter": 1, "all_gather": 1},
    # hybrid cold halves: sequence embeddings, one row per id, forward and backward
    "cold": {"all_to_all": 5},
}


@dataclass(frozen=True)
class LinkCost:
    """α-β cost of one collective family: ``calls · latency_s + bytes_per_rank · seconds_per_byte``."""

    latency_s: float
    seconds_per_byte: float

    def time(self, bytes_per_rank: float, calls: int = 1) -> float:
        return calls * self.latency_s + bytes_per_rank * self.seconds_per_byte

    @property
    def bandwidth_mb_s(self) -> float:
        return 1e-6 / self.seconds_per_byte if self.seconds_per_byte > 0 else math.inf


@dataclass(frozen=True)
class Calibration:
    """The step-time model's constants (module docstring), and where they came from."""

    all_reduce: LinkCost
    all_to_all: LinkCost
    #: seconds per id looked up in a fused (model-parallel) table, forward + backward + optimizer
    lookup_s: float
    #: seconds per id looked up in a replicated table
    dense_lookup_s: float
    #: seconds per element of a replicated table per step (dense gradient + optimizer)
    replicated_elem_s: float
    #: seconds per cold id pooled locally by a hybrid table (forward + backward)
    pool_s: float
    #: fixed seconds per step of one sharded module group (launches, KJT splits, awaitables)
    group_overhead_s: float
    #: the dense arch (bottom/top MLP, interaction) forward + backward + optimizer on the local batch
    dense_step_s: float
    #: measured on real sharded modules: kind -> (fixed seconds per step of its module group(s), seconds per
    #: table at one id per bag); kinds: data_parallel, table_wise, row_wise, hybrid (see :func:`probe_kind`).
    #: When a kind is here it replaces ``group_overhead_s``, the calls' latency and the per-id lookup terms.
    groups: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    #: the probes' tables (rows, hot rows, hot share of lookups; one id per bag at the job's dim and local
    #: batch): their per-table cost already holds these tables' transfers and replicated rows, so a real
    #: table adds only what it moves and replicates beyond them
    probe_rows: int = 2_000
    probe_hot_rows: int = 200
    probe_hot_share: float = 0.55
    #: rows of the data-parallel probes' tables (small, as replicated tables are; older calibrations: probe_rows)
    probe_dp_rows: int = 2_000
    backend: str = "gloo"
    source: str = "default"
    world_size: int = 0
    num_nodes: int = 0
    #: seconds the calibration took
    seconds: float = 0.0
    #: bytes one rank sends in the dense arch's gradient all-reduce (its time is inside ``dense_step_s``)
    dense_sync_bytes: float = 0.0
    #: seconds per step of the job's one DistributedDataParallel wrapper (hooks, its all-reduce's round trip),
    #: measured by :func:`rayemb.train.calibration.probes.add_probes` (``ddp/wrapped`` - ``ddp/local``); 0: not measured (older calibrations, and
    #: then the probes' fixed costs still hold it)
    ddp_step_s: float = 0.0
    #: seconds between its measurement and this job, when kept from an earlier job (``source`` "cached"; else 0)
    age_s: float = 0.0
    #: share (0..1) of the shorter collective family's time hidden when the all-reduce and the all-to-all run
    #: together, measured on the live backend (:func:`rayemb.train.calibration.calibrate.add_overlap`); None: not
    #: measured (built-in constants, calibrations kept from before it was measured): assumed, see :func:`_overlap`
    overlap_fraction: Optional[float] = None
    #: measured over predicted step of earlier jobs on the same key (:func:`rayemb.train.calibration.store.
    #: with_learned_ratio`); every component of a prediction is scaled by it. The overall ratio: what is learned
    #: when the kept measurements cannot tell the families apart (``family_ratios`` empty)
    step_ratio: float = 1.0
    #: measured over predicted seconds per step-time family (:data:`FAMILIES`), fitted over the plans earlier
    #: jobs and plan probes on the same key measured (:func:`rayemb.train.calibration.store.fit_family_ratios`):
    #: each component is scaled by its family's (a family left out: 1.0); the overlap keeps its own measured share
    family_ratios: Dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: the links' α and bandwidth, the dense step, the fused lookup."""
        return (f"all-reduce {1e6 * self.all_reduce.latency_s:.0f} us + {self.all_reduce.bandwidth_mb_s:,.0f} MB/s, "
                f"all-to-all {1e6 * self.all_to_all.latency_s:.0f} us + {self.all_to_all.bandwidth_mb_s:,.0f} MB/s, "
                f"dense step {1e3 * self.dense_step_s:.1f} ms, lookup {1e9 * self.lookup_s:.0f} ns/id")

    def link(self, collective: str) -> LinkCost:
        return self.all_reduce if collective == "all_reduce" else self.all_to_all

    def to_dict(self) -> Dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> "Calibration":
        kw = dict(d)
        kw["all_reduce"] = LinkCost(**kw["all_reduce"])  # type: ignore[arg-type]
        kw["all_to_all"] = LinkCost(**kw["all_to_all"])  # type: ignore[arg-type]
        kw["groups"] = {k: (float(v[0]), float(v[1])) for k, v in dict(kw.get("groups") or {}).items()}
        kw["family_ratios"] = {k: float(v) for k, v in dict(kw.get("family_ratios") or {}).items()}
        return cls(**kw)  # type: ignore[arg-type]


#: 2 CPU cores, 2 gloo ranks on one node, 0.5 CPU each (measured by rayemb.train.calibration.calibrate on the dev machine)
DEFAULT_CALIBRATION = Calibration(
    all_reduce=LinkCost(latency_s=2.0e-4, seconds_per_byte=1.0e-9),
    all_to_all=LinkCost(latency_s=2.0e-4, seconds_per_byte=1.0e-9),
    lookup_s=6.0e-8, dense_lookup_s=6.0e-8, replicated_elem_s=1.0e-9, pool_s=5.0e-8,
    group_overhead_s=1.0e-3, dense_step_s=6.0e-3,
)


#: a calibration's sources whose figures were measured on the job's cluster (now, or kept from an earlier job)
MEASURED_SOURCES = ("measured", "cached")
#: the source of a calibration whose links were measured on the job's ranks and whose compute figures are the
#: built-in constants' (a job with every table pinned: nothing to choose, so only the links are measured)
LINK_MEASURED = "link-measured"


def prediction_kind(calibration: Optional[Calibration]) -> str:
    """plan.json's ``prediction``: ``calibrated`` when the step-time model priced the plan with figures measured
    on the job's cluster; ``link-measured`` when with its links measured on the job's ranks and the compute
    figures (dense step, lookups, module overheads) built in; ``uncalibrated`` when with the built-in constants
    alone (:data:`DEFAULT_CALIBRATION`: a 1 GB/s link), whose figure says nothing about this cluster's step."""
    source = getattr(calibration, "source", "default")
    if source == LINK_MEASURED:
        return LINK_MEASURED
    return "calibrated" if source in MEASURED_SOURCES else "uncalibrated"


#: the step-time families a learned ratio scales apart: the ranks' own work (dense step, lookups, replicated rows,
#: pooling, module overheads, storage) and each collective family's wire time (bytes and calls; the DDP wrapper's
#: round trip is the all-reduce's)
FAMILIES = ("compute", "all_to_all", "all_reduce")
#: the family of each single-family component; ``transfer`` and ``latency`` are split by collective, and
#: ``overlap`` is no family's (a share of the shorter family's time, measured as such)
COMPONENT_FAMILY = {"dense": "compute", "ddp": "all_reduce", "lookup": "compute", "replicated": "compute",
                    "pool": "compute", "overhead": "compute", "storage": "compute"}


@dataclass
class StepTimePrediction:
    """Predicted seconds per step, in total and by component; ``assumed``: the components priced by an assumption
    where the calibration holds no measurement of them (``overlap``: no ``overlap_fraction``); ``families``: the
    model's own seconds by :data:`FAMILIES` and ``overlap``, before any learned ratio (what the ratios are fitted
    against: :func:`rayemb.train.calibration.store.fit_family_ratios`)."""

    total_s: float
    components: Dict[str, float] = field(default_factory=dict)
    per_table_s: Dict[str, float] = field(default_factory=dict)
    assumed: List[str] = field(default_factory=list)
    families: Dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, object]:
        return {"total_s": self.total_s, "components": dict(self.components), "per_table_s": dict(self.per_table_s),
                "assumed": list(self.assumed), "families": dict(self.families)}


def probe_kind(placement: Placement, groups: Optional[Mapping[str, object]] = None) -> str:
    """The probed module kind whose costs stand for ``placement``.

    Column-wise has a probe of its own: TorchRec's column-wise path (shard
    permutes, the output's column stitching) steps much slower than table-wise
    on gloo for the same tables. A calibration without that probe
    (``groups`` given and lacking it; older plan.json files) uses table-wise's.
    """
    if placement in (Placement.DATA_PARALLEL, Placement.HYBRID, Placement.ROW_WISE, Placement.COLUMN_WISE):
        kind = placement.value
    elif placement == Placement.TABLE_ROW_WISE:
        kind = Placement.ROW_WISE.value
    else:
        kind = Placement.TABLE_WISE.value  # table_wise, table_column_wise
    if kind == Placement.COLUMN_WISE.value and groups is not None and kind not in groups:
        return Placement.TABLE_WISE.value
    return kind


def _group_of(placement: Placement) -> List[str]:
    if placement == Placement.DATA_PARALLEL:
        return ["replicated"]
    if placement == Placement.HYBRID:
        return ["hot", "cold"]
    return [placement.value]


def _bytes(t: TableSpec, p: Placement, global_batch: int, w: int, l: int,
           exchange: ExchangeBytes = FP32_EXCHANGE) -> Dict[str, float]:
    return predict_table_bytes(
        p, batch_size=global_batch, dim=t.dim, world_size=w, pooling=t.pooling_factor, num_rows=t.rows,
        hot_share=t.hot_share, num_hot=t.hot_rows, elem_bytes=exchange.rows, grad_elem_bytes=exchange.all_reduce(t),
        column_shards=column_shards(t.dim, w), devices_per_node=l,
    )


def normalize_probes(groups: Mapping[str, Tuple[float, float]], links: Mapping[str, LinkCost],
                     replicated_elem_s: float, local_batch: int, dim: int, world: int, probe_rows: int,
                     probe_hot_rows: int, probe_hot_share: float,
                     probe_dp_rows: Optional[int] = None, ddp_s: float = 0.0) -> Dict[str, Tuple[float, float]]:
    """Probe costs per table minus what the probe's own table moved and replicated, clamped at zero.

    A probe's cost per table was measured on the live links, so it holds that table's transfers
    (pooled rows, ids, cold rows at bytes/β) and, for replicated kinds, its rows' all-reduce. Those
    scale with the real table (batch, pooling, hot share, rows), so :func:`predict_step_time` adds
    them for every table in full; what stays here is the per-table compute and launch cost.
    ``probe_dp_rows``: the data-parallel probes' rows (default ``probe_rows``). ``ddp_s``: the seconds one
    DistributedDataParallel wrapper costs a step; taken off the fixed cost of the kinds whose probe held one
    (:data:`REPLICATED_KINDS`), as :func:`predict_step_time` prices the job's one wrapper once.
    """
    out: Dict[str, Tuple[float, float]] = {}
    global_batch = BatchShape(local_batch, world).global_size
    for kind, (fixed, per_table) in groups.items():
        p = Placement(kind)
        hybrid = p == Placement.HYBRID
        rows = probe_dp_rows or probe_rows if p == Placement.DATA_PARALLEL else probe_rows
        probe = TableSpec("probe", rows=rows, dim=dim, pooling_factor=1.0,
                          hot_rows=probe_hot_rows if hybrid else 0, hot_share=probe_hot_share if hybrid else 0.0)
        moved = 0.0
        if world > 1:
            for collective, total in _bytes(probe, p, global_batch, world, world).items():
                if collective != "all_reduce":
                    moved += links[collective if collective in links else "all_to_all"].time(total / world, calls=0)
        rep_rows = probe_hot_rows if hybrid else rows if p == Placement.DATA_PARALLEL else 0
        moved += rep_rows * dim * replicated_elem_s
        if kind in REPLICATED_KINDS:
            fixed = max(fixed - ddp_s, 0.0)
        out[kind] = (fixed, max(per_table - moved, 0.0))
    return out


def predict_step_time(
    tables: Sequence[TableSpec], placements: Mapping[str, Placement], topology: ClusterTopology, global_batch: int,
    calibration: Calibration, storage: Optional[Mapping[str, StoredCost]] = None,
    exchange: ExchangeBytes = FP32_EXCHANGE,
) -> StepTimePrediction:
    """Predicted seconds per step of ``tables`` placed as ``placements`` (module docstring).

    ``storage``: the compressed / cached tables' chosen costs (their placement is theirs, not ``placements``').
    ``exchange``: the element sizes on the wire (``train.comm_precision``) the transfers are timed at.
    """
    cal, w, l = calibration, topology.world_size, topology.devices_per_node
    local_batch = BatchShape.of_global(global_batch, w).local
    comp = {"dense": cal.dense_step_s, "ddp": cal.ddp_step_s if w > 1 else 0.0, "lookup": 0.0, "replicated": 0.0,
            "pool": 0.0, "overhead": 0.0, "latency": 0.0, "transfer": 0.0}
    per_table: Dict[str, float] = {}
    # transfer, latency and each table's seconds by family: a learned ratio scales the collective families apart
    wire = {c: {"all_to_all": 0.0, "all_reduce": 0.0} for c in ("transfer", "latency")}
    table_wire: Dict[str, Dict[str, float]] = {}
    groups: Dict[str, float] = {}  # group -> bytes per rank (replicated groups: for bucket counting)
    sent = {"all_reduce": calibration.dense_sync_bytes, "all_to_all": 0.0}  # bytes per rank, by link family
    for t in tables:
        st = (storage or {}).get(t.name)
        if st is not None and not st.option.is_plain:
            seconds = storage_step_seconds(st, t, local_batch, w, cal.lookup_s, cal.dense_lookup_s,
                                           cal.replicated_elem_s)
            transfer = cal.all_to_all.time(st.bytes_per_step / w, calls=0) if w > 1 else 0.0
            comp["storage"] = comp.get("storage", 0.0) + seconds
            comp["transfer"] += transfer
            wire["transfer"]["all_to_all"] += transfer
            table_wire[t.name] = {"compute": seconds, "all_to_all": transfer}
            sent["all_to_all"] += st.bytes_per_step / w if w > 1 else 0.0
            per_table[t.name] = seconds + transfer
            kind = probe_kind(st.placement, cal.groups)
            for g in ["probed:" + kind] if kind in cal.groups else _group_of(st.placement):
                groups.setdefault(g, 0.0)
            continue
        p = placements[t.name]
        ids_local = local_batch * t.pooling_factor  # ids one rank's batch looks up
        hot = t.hot_share if p == Placement.HYBRID else 0.0
        kind = probe_kind(p, cal.groups)
        probed = kind in cal.groups
        # the micro-benchmarked kernels: seconds per id looked up (replicated, fused, or a hybrid's mix) and per
        # cold id pooled locally; replicated rows (a data-parallel table's, a hybrid's hot set)
        per_id = (cal.dense_lookup_s if p == Placement.DATA_PARALLEL else
                  hot * cal.dense_lookup_s + (1.0 - hot) * cal.lookup_s if p == Placement.HYBRID else cal.lookup_s)
        pool_per_id = (1.0 - hot) * cal.pool_s if p == Placement.HYBRID else 0.0
        rep_rows = t.hot_rows if p == Placement.HYBRID else t.rows if p == Placement.DATA_PARALLEL else 0
        rep = rep_rows * t.dim * cal.replicated_elem_s
        if probed:  # measured on real modules at one id per bag; more ids cost fused lookups
            # never below what the kernels alone cost for one id per bag: a slope under that is noise
            lookup = (max(cal.groups[kind][1], local_batch * (per_id + pool_per_id))
                      + max(t.pooling_factor - 1.0, 0.0) * local_batch * cal.lookup_s)
            pool = 0.0
        else:
            lookup, pool = ids_local * per_id, ids_local * pool_per_id
        transfer = 0.0
        by_family = {"compute": lookup + rep + pool, "all_to_all": 0.0, "all_reduce": 0.0}
        if w > 1:
            by_collective = _bytes(t, p, global_batch, w, l, exchange)
            for collective, total_bytes in by_collective.items():
                family = "all_reduce" if collective == "all_reduce" else "all_to_all"
                sent[family] += total_bytes / w
                if collective == "all_reduce" and probed:
                    continue  # probed: replicated_elem_s already holds the all-reduce on the live links
                seconds = cal.link(collective).time(total_bytes / w, calls=0)
                transfer += seconds
                by_family[family] += seconds
                wire["transfer"][family] += seconds
                if collective == "all_reduce":
                    key = "hot" if p == Placement.HYBRID else "replicated"
                    groups[key] = groups.get(key, 0.0) + total_bytes / w
        if kind in cal.groups:
            groups.setdefault("probed:" + kind, 0.0)
        else:
            for g in _group_of(p):
                if g == "hot" and not t.hot_rows or g == "cold" and t.hot_rows >= t.rows:
                    continue
                groups.setdefault(g, 0.0)
        comp["lookup"] += lookup
        comp["replicated"] += rep
        comp["pool"] += pool
        comp["transfer"] += transfer
        table_wire[t.name] = by_family
        per_table[t.name] = lookup + rep + pool + transfer
    for g, rep_bytes in groups.items():
        if g.startswith("probed:"):  # the probe's fixed cost includes its collectives' round trips
            comp["overhead"] += cal.groups[g.split(":", 1)[1]][0]
            continue
        comp["overhead"] += cal.group_overhead_s
        if w == 1:
            continue
        if g in ("replicated", "hot"):
            seconds = cal.all_reduce.time(0.0, calls=max(1, math.ceil(rep_bytes / DDP_BUCKET_BYTES)))
            comp["latency"] += seconds
            wire["latency"]["all_reduce"] += seconds
        else:
            for collective, calls in GROUP_CALLS[g].items():
                seconds = cal.link(collective).time(0.0, calls=calls)
                comp["latency"] += seconds
                wire["latency"]["all_reduce" if collective == "all_reduce" else "all_to_all"] += seconds
    comp["overlap"] = _overlap(sent, cal) if w > 1 else 0.0
    assumed = ["overlap"] if w > 1 and cal.overlap_fraction is None else []
    families = {f: 0.0 for f in FAMILIES}
    for k, v in comp.items():
        if k in wire:
            for f, seconds in wire[k].items():
                families[f] += seconds
        elif k != "overlap":
            families[COMPONENT_FAMILY[k]] += v
    families["overlap"] = comp["overlap"]
    scale = {f: cal.step_ratio * cal.family_ratios.get(f, 1.0) for f in FAMILIES}
    if any(r != 1.0 for r in scale.values()) or cal.step_ratio != 1.0:
        comp = {k: (sum(scale[f] * x for f, x in wire[k].items()) if k in wire else
                    v * cal.step_ratio if k == "overlap" else v * scale[COMPONENT_FAMILY[k]])
                for k, v in comp.items()}
        per_table = {k: sum(scale[f] * x for f, x in table_wire[k].items()) for k in per_table}
    return StepTimePrediction(sum(comp.values()), comp, per_table, assumed, families)


def hot_threshold(cal: Calibration, world_size: int, dim: int, elem_bytes: int = 4, id_bytes: int = 8) -> float:
    """Occurrences per global batch from which one row of a hybrid table is predicted cheaper replicated (hot).

    The break-even of :func:`predict_step_time`'s hybrid terms, per rank and step. A hot row costs its
    replicated update with its gradient's all-reduce, ``D·replicated_elem_s`` (probed with the all-reduce on
    the live links; never below that all-reduce's own ``2q·D·s`` bytes at its β). Each occurrence of a cold
    id in the global batch costs a rank 1/W of its all-to-all bytes ``q·(id + 2·D·s)`` at the all-to-all's
    β and of a fused lookup and local pool in place of a replicated lookup (q = (W-1)/W). inf on one rank.
    """
    w = world_size
    if w <= 1:
        return math.inf
    q = (w - 1) / w
    hot_row = dim * max(cal.replicated_elem_s, 2.0 * q * elem_bytes * cal.all_reduce.seconds_per_byte)
    cold = (q * (id_bytes + 2.0 * dim * elem_bytes) * cal.all_to_all.seconds_per_byte
            + max(cal.lookup_s + cal.pool_s - cal.dense_lookup_s, 0.0)) / w
    return hot_row / cold if cold > 0 else math.inf


def _overlap(sent: Mapping[str, float], cal: Calibration) -> float:
    """Seconds saved (<= 0) because the all-reduce and all-to-all families share the wire (module docstring):
    the measured ``overlap_fraction`` of the shorter family's time, or, not measured, what the link's best β
    leaves of it."""
    t_ar = cal.all_reduce.time(sent["all_reduce"], calls=0)
    t_a2a = cal.all_to_all.time(sent["all_to_all"], calls=0)
    if cal.overlap_fraction is not None:
        return -min(max(float(cal.overlap_fraction), 0.0), 1.0) * min(t_ar, t_a2a)
    betas = [b for b in (cal.all_reduce.seconds_per_byte, cal.all_to_all.seconds_per_byte) if b > 0]
    floor = (sent["all_reduce"] + sent["all_to_all"]) * min(betas) if betas else 0.0
    return min(0.0, max(t_ar, t_a2a, floor) - (t_ar + t_a2a))


__all__ = ["Calibration", "LinkCost", "FAMILIES", "COMPONENT_FAMILY", "DEFAULT_CALIBRATION", "MEASURED_SOURCES", "LINK_MEASURED", "prediction_kind", "StepTimePrediction", "predict_step_time",
           "GROUP_CALLS", "DDP_BUCKET_BYTES", "REPLICATED_KINDS", "probe_kind", "normalize_probes"]
