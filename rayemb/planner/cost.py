"""Estimator and chooser: each placement's bytes per step and memory per rank, and the per-table choice.

Notation: global batch B, dim D, stored element bytes s (4 fp32, 2 fp16 tables), world size W,
devices per node L, pooling factor P, hot rows |F|, hot share h, rows V.
Traffic per placement is :func:`rayemb.planner.traffic.predict_table_bytes`
(one formula for every placement, checked against measured collective bytes
by the hybrid benchmark); :func:`table_bytes` feeds it a :class:`TableSpec`
and the :class:`ExchangeBytes` of ``train.comm_precision``: the element size
on the wire of the exchanged rows (forward) and of their gradients and the
all-reduced ones (backward); ids and lengths stay integers.

Memory (weights + optimizer state): a row of width D holds D·s + o(D), o the
state of ``train.embedding_optimizer`` (:func:`~rayemb.planner.optimizer_state.optimizer_state_bytes`:
4 bytes for row-wise Adagrad, 4·D Adagrad, 0 SGD, 8·D Adam, 4·D + 4 row-wise
Adam), the same for sharded rows (FBGEMM's fused optimizer) and replicated ones
(rayemb's, same state shapes): data-parallel holds V·(D·s+o(D)) on every rank;
pooled model-parallel holds V·(D·s+o(D)) in total, split by rows (RW over W
ranks, TWRW over L) or columns (CW, k shards, each with its own row-wise
state); hybrid holds |F|·(D·s+o(D)) on every rank plus the cold rows row-wise.

The choice (:class:`BytesCostModel`): among the placements a table's pin
allows, pick the fewest bytes per step whose largest shard fits a rank, with
replicated bytes (data-parallel tables, hybrid hot sets) capped at
``replicated_fraction`` of each rank's capacity, granted to the tables that
save the most traffic per replicated byte first. Pooled model-parallel tables
are table-wise when they are smaller than an equal per-rank share of all
model-parallel rows (so whole tables can be balanced); larger ones are
table-row-wise on multi-node clusters when their per-rank piece stays under
``TWRW_MAX_CAPACITY_SHARE`` of a rank (the reduce-scatter stays inside a node:
2·(L-1)·B·D·s instead of 2·(W-1)·B·D·s — TorchRec's choice for large tables
at scale), else row-wise over all ranks.

Compress or cache (:mod:`rayemb.planner.compression`): a table that fits no
plain placement is tried cached (where a host tier exists), block-compressed,
then QR-compressed; the first option with a placement that fits the device
(and the host) wins, with its cheapest such placement (:func:`storage_cost`),
and the :class:`~rayemb.planner.compression.StoredCost` says why. A pinned
option is the only one tried.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from rayemb.errors import PlanError
from rayemb.planner.compression import (
    StorageOption,
    StoredCost,
    allowed_placements,
    auto_options,
    cache_hit_rate,
    cached_device_bytes,
    has_host_tier,
    host_capacity_bytes,
    output_dim,
    projection_elements,
    sharded_spec,
)
from rayemb.planner.optimizer_state import STATE_VALUE_BYTES, optimizer_state_bytes
from rayemb.planner.pins import TablePin
from rayemb.planner.types import (
    INSUFFICIENT_STORAGE,
    INVALID_PIN,
    STORAGE_REMEDIES,
    ClusterTopology,
    Cost,
    Placement,
    PlacementChooser,
    TableSpec,
)
from rayemb.planner.traffic import OUTPUT_ELEM_BYTES, predict_table_bytes

logger = logging.getLogger(__name__)

#: bytes of one fp32 optimizer state value; how many a row keeps is its optimizer's (:func:`optimizer_state_bytes`)
OPTIMIZER_STATE_BYTES = STATE_VALUE_BYTES
#: per element of a block-compressed table's projection: a dense parameter, stepped by ``train.dense_optimizer``
#: (Adagrad by default: one fp32 per element), not by the embedding optimizer
PROJECTION_STATE_BYTES = STATE_VALUE_BYTES
#: width of one column-wise shard (TorchRec's ``min_partition`` default is 32 columns)
COLUMN_SHARD_DIM = 32
#: share of a rank's capacity that replicated rows (data-parallel tables, hybrid hot sets) may take
DEFAULT_REPLICATED_FRACTION = 0.25
#: a large table is sharded table-row-wise (inside one node) when its per-rank piece is at most this share
#: of a rank's capacity; otherwise row-wise over all ranks
TWRW_MAX_CAPACITY_SHARE = 0.25


def column_shards(dim: int, world_size: int) -> int:
    """k = number of column-wise shards: dim split into COLUMN_SHARD_DIM-wide pieces, at most one per rank."""
    return max(1, min(world_size, dim // COLUMN_SHARD_DIM))


@dataclass(frozen=True)
class ExchangeBytes:
    """Bytes per element on the wire, per direction: ``train.comm_precision`` (rayemb.embedding.qcomm) as the
    planner counts it. ``forward``: the looked-up rows the all-to-alls and reduce-scatters move; ``backward``:
    their gradients, and the all-reduced gradients of replicated rows (4: the all-reduce is the rows' own dtype).

    >>> ExchangeBytes.of({"forward": "bf16", "backward": "fp32"})
    ExchangeBytes(forward=2, backward=4)
    """

    forward: int = OUTPUT_ELEM_BYTES
    backward: int = OUTPUT_ELEM_BYTES

    #: bytes per element of each ``train.comm_precision`` value
    SIZES = {"fp32": 4, "bf16": 2, "fp16": 2}

    @classmethod
    def of(cls, comm_precision: Optional[Mapping[str, str]]) -> "ExchangeBytes":
        """From ``train.comm_precision`` (None, or a direction left out: fp32)."""
        p = comm_precision or {}
        return cls(cls.SIZES[p.get("forward", "fp32")], cls.SIZES[p.get("backward", "fp32")])

    @property
    def rows(self) -> float:
        """The element size to give :func:`~rayemb.planner.traffic.predict_table_bytes`: every exchanged row
        crosses once forward and its gradient once backward, so the mean of the two counts their sum."""
        return (self.forward + self.backward) / 2

    def all_reduce(self, table: TableSpec) -> int:
        """Element size of a replicated table's all-reduced gradients: 16-bit when the backward is."""
        return table.bytes_per_element if self.backward == OUTPUT_ELEM_BYTES else self.backward


#: fp32 both ways (the default ``train.comm_precision``)
FP32_EXCHANGE = ExchangeBytes()


def table_bytes(
    table: TableSpec, placement: Placement, world_size: int, devices_per_node: int, global_batch: int,
    exchange: ExchangeBytes = FP32_EXCHANGE,
) -> float:
    """Predicted bytes per step (summed over ranks, fwd + bwd) of ``table`` under ``placement``, at ``exchange``."""
    if world_size == 1:
        return 0.0
    by_collective = predict_table_bytes(
        placement, batch_size=global_batch, dim=table.dim, world_size=world_size, pooling=table.pooling_factor,
        num_rows=table.rows, hot_share=table.hot_share, num_hot=table.hot_rows, elem_bytes=exchange.rows,
        grad_elem_bytes=exchange.all_reduce(table), column_shards=column_shards(table.dim, world_size),
        devices_per_node=devices_per_node,
    )
    return float(sum(by_collective.values()))


def stored_row_bytes(table: TableSpec, dim: Optional[int] = None) -> int:
    """Bytes one row of ``table`` (or of a ``dim``-wide piece of it: a column shard, a compressed part) holds
    on a rank: weights + its embedding optimizer's state, sharded or replicated alike."""
    d = table.dim if dim is None else int(dim)
    return d * table.bytes_per_element + optimizer_state_bytes(table.embedding_optimizer, d)


def table_memory(table: TableSpec, placement: Placement, world_size: int, devices_per_node: int) -> Cost:
    """Memory of ``table`` under ``placement`` (bytes per step left 0; see :func:`table_cost`)."""
    mp_row = dp_row = stored_row_bytes(table)
    w = world_size
    if placement == Placement.DATA_PARALLEL:
        total, biggest = w * table.rows * dp_row, table.rows * dp_row
    elif placement == Placement.TABLE_WISE:
        total = biggest = table.rows * mp_row
    elif placement == Placement.ROW_WISE:
        total, biggest = table.rows * mp_row, math.ceil(table.rows / w) * mp_row
    elif placement == Placement.TABLE_ROW_WISE:
        l = max(1, min(devices_per_node, w))
        total, biggest = table.rows * mp_row, math.ceil(table.rows / l) * mp_row
    elif placement in (Placement.COLUMN_WISE, Placement.TABLE_COLUMN_WISE):
        k = column_shards(table.dim, w)
        total = table.rows * (table.row_bytes + optimizer_state_bytes(table.embedding_optimizer, table.dim, k))
        biggest = table.rows * stored_row_bytes(table, math.ceil(table.dim / k))
    else:  # HYBRID
        hot = table.hot_rows * dp_row
        total = w * hot + table.cold_rows * mp_row
        biggest = hot + math.ceil(table.cold_rows / w) * mp_row
    return Cost(placement, 0.0, int(total), int(biggest))


def table_cost(
    table: TableSpec, placement: Placement, world_size: int, devices_per_node: int, global_batch: int,
    exchange: ExchangeBytes = FP32_EXCHANGE,
) -> Cost:
    """Bytes per step and memory of one placement of one table (pure)."""
    mem = table_memory(table, placement, world_size, devices_per_node)
    return Cost(placement, table_bytes(table, placement, world_size, devices_per_node, global_batch, exchange),
                mem.memory_bytes, mem.max_shard_bytes)


def _shards(rows: int, placement: Placement, w: int, l: int, dim: int) -> Tuple[int, int, int]:
    """(rows of the largest shard, rows summed over shards, width of the largest shard) of a sharded table."""
    if placement == Placement.ROW_WISE:
        return math.ceil(rows / w), rows, dim
    if placement == Placement.TABLE_ROW_WISE:
        return math.ceil(rows / max(1, min(l, w))), rows, dim
    if placement in (Placement.COLUMN_WISE, Placement.TABLE_COLUMN_WISE):
        k = column_shards(dim, w)
        return rows, rows * k, math.ceil(dim / k)
    return rows, rows, dim


def storage_cost(
    table: TableSpec, option: StorageOption, placement: Placement, topology: ClusterTopology, global_batch: int,
    reason: str = "", exchange: ExchangeBytes = FP32_EXCHANGE,
) -> StoredCost:
    """Memory (device and host) and bytes per step of ``table`` stored as ``option`` under ``placement``.

    The rows placed are :func:`~rayemb.planner.compression.sharded_spec`'s (QR: ⌈V/m⌉+m rows; block:
    E_b wide), priced by :func:`table_memory`; pooled bags cross the wire at
    :func:`~rayemb.planner.compression.output_dim`; block adds its replicated E_b x E projection
    (weights + dense Adagrad on every rank, gradient all-reduced: 2·(W-1)·E_b·E·s). A cached table
    keeps every shard (weights + optimizer state) in host memory and ⌈λ·rows⌉ of its rows on the
    device (:func:`~rayemb.planner.compression.cached_device_bytes`); each miss moves a row in and an
    evicted row out: 2·(1-hit)·B·P·D·s host bytes per step. Without a host tier (CPU) the host
    table is device memory too.
    """
    w, l = topology.world_size, topology.devices_per_node
    opt = option.resolved(table)
    spec = sharded_spec(table, opt)
    mem = table_memory(spec, placement, w, l)
    wire = spec if placement == Placement.DATA_PARALLEL else replace(spec, dim=output_dim(table, opt))
    proj = projection_elements(table, opt)
    net = table_bytes(wire, placement, w, l, global_batch, exchange) + (
        2.0 * (w - 1) * proj * exchange.all_reduce(table))
    extra = proj * (table.bytes_per_element + PROJECTION_STATE_BYTES)
    device_total, device_max = mem.memory_bytes, mem.max_shard_bytes
    host_total, host_max, hit, host_bytes = 0, 0, 1.0, 0.0
    if opt.kernel == "cached":
        biggest_rows, all_rows, width = _shards(spec.rows, placement, w, l, spec.dim)
        # FBGEMM keeps optimizer state out of the cache (host memory): the device slots hold weights only
        row_weights = (mem.max_shard_bytes
                       - biggest_rows * optimizer_state_bytes(spec.embedding_optimizer, width)) / biggest_rows
        cache_max = cached_device_bytes(biggest_rows, row_weights, opt.cache_load_factor)
        cache_total = cached_device_bytes(all_rows, table.weight_bytes / all_rows, opt.cache_load_factor)
        host_total, host_max = (mem.memory_bytes, mem.max_shard_bytes) if has_host_tier(topology) else (0, 0)
        device_total = cache_total + (0 if host_total else mem.memory_bytes)
        device_max = cache_max + (0 if host_max else mem.max_shard_bytes)
        hit = cache_hit_rate(table, opt.cache_load_factor)
        host_bytes = 2.0 * (1.0 - hit) * global_batch * table.pooling_factor * table.row_bytes
    replicated = mem.max_shard_bytes if placement == Placement.DATA_PARALLEL else 0
    return StoredCost(
        placement, net, int(device_total), int(device_max), option=opt, host_memory_bytes=int(host_total),
        max_host_shard_bytes=int(host_max), extra_bytes_per_rank=int(extra), replicated_bytes=int(replicated),
        host_bytes_per_step=host_bytes, hit_rate=hit, lookups_per_id=2 if opt.compression == "qr" else 1,
        projection_macs_per_sample=proj, reason=reason,
    )


def replicated_bytes_per_rank(cost: Cost, table: TableSpec) -> int:
    """Bytes that every rank holds for this placement (data-parallel tables, hybrid hot sets)."""
    if isinstance(cost, StoredCost):
        return cost.replicated_bytes
    dp_row = stored_row_bytes(table)
    if cost.placement == Placement.DATA_PARALLEL:
        return table.rows * dp_row
    if cost.placement == Placement.HYBRID:
        return table.hot_rows * dp_row
    return 0


class BytesCostModel(PlacementChooser):
    """Chooses per table among data-parallel, pooled model-parallel and hybrid: the fewest predicted bytes that fit.

    >>> t = [TableSpec("small", rows=100, dim=16), TableSpec("big", rows=10**7, dim=16)]
    >>> choice = BytesCostModel().choose(t, ClusterTopology(1, 8), global_batch=65536, pins={})
    >>> choice["small"].placement.value, choice["big"].placement.value
    ('data_parallel', 'row_wise')
    """

    def __init__(self, replicated_fraction: float = DEFAULT_REPLICATED_FRACTION,
                 exchange: ExchangeBytes = FP32_EXCHANGE) -> None:
        self.replicated_fraction = replicated_fraction
        #: the element sizes on the wire the bytes are counted at (``train.comm_precision``)
        self.exchange = exchange

    def candidates(
        self, table: TableSpec, topology: ClusterTopology, global_batch: int, fair_share_bytes: float,
        pin: Optional[TablePin],
    ) -> List[Cost]:
        """Costs of the placements this table may take, cheapest traffic first."""
        w, l = topology.world_size, topology.devices_per_node
        if pin is not None and pin.sharding is not None:
            options = [pin.sharding]
        else:
            tw_or_rw = Placement.TABLE_WISE
            mp_bytes = table.rows * stored_row_bytes(table)
            if w > 1 and mp_bytes > fair_share_bytes:
                tw_or_rw = Placement.ROW_WISE
                if topology.num_nodes > 1 and mp_bytes / l <= TWRW_MAX_CAPACITY_SHARE * topology.capacity_bytes:
                    tw_or_rw = Placement.TABLE_ROW_WISE
            options = [Placement.DATA_PARALLEL, tw_or_rw]
            if tw_or_rw != Placement.ROW_WISE:
                options.append(Placement.ROW_WISE)  # fallback when the table does not fit one rank / node
            if 0 < table.hot_rows < table.rows:
                options.append(Placement.HYBRID)
            if pin is not None:
                if pin.hybrid is True and table.rows > 0 and table.hot_rows >= table.rows:
                    # every row is hot: "hybrid" is all rows replicated and no cold half, i.e. data-parallel
                    options = [Placement.DATA_PARALLEL]
                else:
                    options = [p for p in options if pin.allows(p)]
        costs = [table_cost(table, p, w, l, global_batch, self.exchange) for p in options]
        return sorted(costs, key=lambda c: (c.bytes_per_step, c.max_shard_bytes))

    def stored_candidates(
        self, table: TableSpec, topology: ClusterTopology, global_batch: int, option: StorageOption,
        pin: Optional[TablePin], reason: str = "",
    ) -> List[StoredCost]:
        """Costs of ``option``'s placements (those the pin allows) that fit device and host, cheapest first."""
        allowed = allowed_placements(option, topology)
        if pin is not None and pin.sharding is not None and pin.sharding not in allowed:
            raise PlanError(
                f"Pin for table {table.name!r}: {option.compression if option.compression != 'none' else 'a cached'} "
                f"table cannot be {pin.sharding.value}; use one of {[p.value for p in allowed]} or drop the "
                "sharding key.", INVALID_PIN)
        costs = [storage_cost(table, option, p, topology, global_batch, reason, self.exchange) for p in allowed
                 if pin is None or pin.allows(p)]
        host_cap = host_capacity_bytes(topology)
        fits = [c for c in costs if c.fits_in(topology.capacity_bytes) and c.fits_host(host_cap)]
        return sorted(fits, key=lambda c: c.sort_key)

    def compress_or_cache(
        self, table: TableSpec, topology: ClusterTopology, global_batch: int, pin: Optional[TablePin],
        smallest_plain: Cost,
    ) -> List[StoredCost]:
        """The first of cache, block, QR (:func:`~rayemb.planner.compression.auto_options`) that fits, with why.

        Raises ``insufficient_storage`` (naming what was tried) when none fits.
        """
        cap = topology.capacity_bytes
        why = (f"{table.name}: {_gib(smallest_plain.max_shard_bytes)} per rank even {smallest_plain.placement.value} "
               f"> {_gib(cap)} table capacity")
        # what did not fit, by kind (the last, i.e. smallest, attempt of each kind)
        tried = {} if has_host_tier(topology) else {"cached": "cached: no host tier on a cpu cluster"}
        for option in auto_options(table, topology):
            cs = self.stored_candidates(table, topology, global_batch, option, pin)
            if cs:
                best = cs[0]
                needs = f"{best.option.label} {best.placement.value} needs {_gib(best.device_per_rank)}"
                if best.option.kernel == "cached":
                    needs += (f" device + {_gib(best.max_host_shard_bytes)} host per rank, predicted hit rate "
                              f"{best.hit_rate:.2f}")
                else:
                    needs += " per rank"
                skipped = f" (tried first: {'; '.join(tried.values())})" if tried else ""
                return [replace(c, reason=f"{why}; {needs}{skipped}") for c in cs]
            kind = option.compression if option.compression != "none" else "cached"
            least = min((storage_cost(table, option, p, topology, global_batch, exchange=self.exchange)
                         for p in allowed_placements(option, topology)), key=lambda c: c.device_per_rank)
            tried[kind] = f"{least.option.label} needs {_gib(least.device_per_rank)} device" + (
                f", {_gib(least.max_host_shard_bytes)} host" if option.kernel == "cached" else "")
        raise PlanError(
            f"Table {table.name!r} ({table.rows} rows x dim {table.dim}) does not fit: {why}, and neither caching "
            f"nor compression fits ({'; '.join(tried.values())}). Possible solutions: "
            "plan for more devices (--world-size / more GPUs per node) or use a smaller embedding dim "
            "(model.embedding_dim).", INSUFFICIENT_STORAGE)

    def choose(
        self,
        tables: Sequence[TableSpec],
        topology: ClusterTopology,
        global_batch: int,
        pins: Mapping[str, TablePin],
    ) -> Dict[str, Cost]:
        cap = topology.capacity_bytes
        w = topology.world_size
        total_mp = sum(t.rows * stored_row_bytes(t) for t in tables)
        fair_share = total_mp / w
        budget = self.replicated_fraction * cap
        choice: Dict[str, Cost] = {}
        cands: Dict[str, List[Cost]] = {}
        for t in tables:
            pin = pins.get(t.name)
            pinned = StorageOption.from_pin(t.name, pin)
            if pinned is not None and pinned.is_plain:  # compression: none: never compressed or cached
                cs = [c for c in self.candidates(t, topology, global_batch, fair_share, pin) if c.fits_in(cap)]
                if not cs:
                    raise _storage_error(t, topology, global_batch, pin, "is pinned to compression: none")
            elif pinned is not None:
                label = pinned.resolved(t).label
                cs = self.stored_candidates(t, topology, global_batch, pinned, pin, f"pinned {label}")
                if not cs:
                    raise _storage_error(t, topology, global_batch, pin, f"is pinned to {label}")
            else:
                plain = self.candidates(t, topology, global_batch, fair_share, pin)
                cs = [c for c in plain if c.fits_in(cap)]
                if not cs and pin is not None and pin.sharding is not None:
                    raise _storage_error(t, topology, global_batch, pin, f"is pinned to {pin.sharding.value}")
                if not cs:
                    smallest = min(plain, key=lambda c: c.max_shard_bytes)
                    cs = self.compress_or_cache(t, topology, global_batch, pin, smallest)
            cands[t.name] = cs
        # replicated placements compete for the per-rank budget: best saving per replicated byte first
        by_name = {t.name: t for t in tables}

        def best_unreplicated(name: str) -> Optional[Cost]:
            rest = [c for c in cands[name] if replicated_bytes_per_rank(c, by_name[name]) == 0]
            return rest[0] if rest else None

        wants = []
        for name, cs in cands.items():
            first = cs[0]
            rep = replicated_bytes_per_rank(first, by_name[name])
            if rep == 0:
                choice[name] = first
                continue
            alt = best_unreplicated(name)
            saving = (alt.bytes_per_step - first.bytes_per_step) if alt else float("inf")
            wants.append((-(saving / max(rep, 1)), name))
        used = 0
        for _, name in sorted(wants):
            t = by_name[name]
            forced = best_unreplicated(name) is None  # pinned to data-parallel/hybrid: the budget yields to the pin
            for c in cands[name]:
                rep = replicated_bytes_per_rank(c, t)
                if rep == 0 or forced or used + rep <= budget:
                    choice[name] = c
                    used += rep
                    break
        logger.debug("cost model chose %s", {n: c.placement.value for n, c in choice.items()})
        return {t.name: choice[t.name] for t in tables}


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _storage_error(
    table: TableSpec, topology: ClusterTopology, global_batch: int, pin: TablePin, what: str,
) -> PlanError:
    """insufficient_storage for a pinned table, with a pin that fits under the same sharding when there is one."""
    w, l, cap = topology.world_size, topology.devices_per_node, topology.capacity_bytes
    stored = StorageOption.from_pin(table.name, pin)
    placements = [pin.sharding] if pin.sharding else allowed_placements(stored, topology) if stored else [
        Placement.ROW_WISE]
    c = min((storage_cost(table, stored, p, topology, global_batch) if stored else table_cost(table, p, w, l, global_batch)
             for p in placements), key=lambda x: x.max_shard_bytes)
    advice = "Unpin it (the planner then shards, caches or compresses it as needed)"
    for option in ([] if stored else auto_options(table, topology)):
        if pin.sharding is None or pin.sharding in allowed_placements(option, topology):
            fit = BytesCostModel().stored_candidates(table, topology, global_batch, option, pin)
            if fit:
                keys = {**({"sharding": pin.sharding.value} if pin.sharding else {}), **fit[0].option.to_json()}
                keys = {k: v for k, v in keys.items() if not (k, v) in (("compression", "none"), ("kernel", "fused"))}
                flow = ", ".join(f"{k}: {v}" for k, v in keys.items())
                advice += (f", or keep the pin and pin `{table.name}: {{{flow}}}` (needs "
                           f"{_gib(fit[0].device_per_rank)} per rank)")
                break
    host = f" and {_gib(c.max_host_shard_bytes)} host" if isinstance(c, StoredCost) and c.max_host_shard_bytes else ""
    return PlanError(
        f"Table {table.name!r} ({table.rows} rows x dim {table.dim}) {what}, whose largest shard needs "
        f"{_gib(c.max_shard_bytes)} device{host} per rank but a rank holds {_gib(cap)} (host: "
        f"{_gib(host_capacity_bytes(topology)) if has_host_tier(topology) else 'none, a cpu cluster'}). {advice}. "
        f"Other solutions: {STORAGE_REMEDIES}.", INSUFFICIENT_STORAGE)


__all__ = [
    "BytesCostModel", "ExchangeBytes", "FP32_EXCHANGE", "storage_cost", "table_bytes", "table_memory", "table_cost", "column_shards",
    "replicated_bytes_per_rank", "OPTIMIZER_STATE_BYTES", "COLUMN_SHARD_DIM", "DEFAULT_REPLICATED_FRACTION",
    "PROJECTION_STATE_BYTES", "optimizer_state_bytes", "stored_row_bytes",
]
