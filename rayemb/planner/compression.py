"""Compressed and cached tables as the planner sees them: their shape, memory tiers, cache hit rate and extra cost.

Three ways to hold a table that does not fit a rank; pure, no torch:

* ``compression: qr`` — quotient-remainder embedding (Shi et al., "Compositional Embeddings Using
  Complementary Partitions for Memory-Efficient Recommendation Systems", KDD 2020; DLRM's
  ``qr_embedding_bag.py``): id i reads row ⌊i/m⌋ of a quotient table (⌈V/m⌉ rows) and row i mod m of a
  remainder table (m rows, default m = ⌈√V⌉), combined by ``mult`` or ``add`` (both D wide) or
  ``concat`` (each D/2 wide): (⌈V/m⌉ + m) rows, two lookups per id, pooled output D wide.
* ``compression: block`` — a V x E_b table (``block_dim``, default D/4) and one E_b x E projection,
  replicated. Pooling and projection commute (Σ x_i·P = (Σ x_i)·P), so the table's rows and pooled
  bags are E_b wide; each step adds a B x E_b x E matmul and the projection's gradient all-reduce.
* ``kernel: cached`` — the whole table and its optimizer state in host memory, a device cache of
  ``cache_load_factor`` · rows (FBGEMM's ``fused_uvm_caching`` on CUDA). Only where a host tier
  exists (CUDA: HBM is the device, DDR the host); on CPU clusters the table already lives in host
  memory, so a cache frees nothing there and is never chosen automatically.

The cache's hit rate comes from the frequency statistics: the hot set of the split (|F| most frequent
rows, share h of lookups; :mod:`rayemb.planner.split`) is one point of the table's frequency curve.
A Zipf curve (frequency of the r-th row ∝ r^-α) through that point gives α, and a cache of the
top ⌈λ·V⌉ rows hits :func:`zipf_coverage` (⌈λ·V⌉, V, α) of the lookups. Without statistics the
model assumes uniform ids (hit rate = λ, the pessimistic case).

Example::

    >>> t = TableSpec("C1", rows=1_048_576, dim=512)
    >>> StorageOption(compression="qr").resolved(t).buckets
    1024
    >>> sharded_spec(t, StorageOption(compression="block").resolved(t)).dim
    128
    >>> round(zipf_coverage(1024, 1_048_576, 1.0), 2)
    0.52
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from rayemb.embedding.compression_math import CompressionSpec, qr_buckets, qr_dims, qr_rows
from rayemb.errors import PlanError
from rayemb.planner.pins import TablePin
from rayemb.planner.types import INVALID_PIN, ClusterTopology, Cost, Placement, TableSpec

COMPRESSIONS = ("none", "qr", "block")
KERNELS = ("fused", "cached")
QR_COMBINES = ("mult", "add", "concat")
#: TorchRec's default cache load factor for UVM caching
DEFAULT_CACHE_LOAD_FACTOR: float = 0.2
#: load factors tried, largest (best hit rate) first, when the planner caches a table on its own
AUTO_LOAD_FACTORS: Tuple[float, ...] = (0.2, 0.1, 0.05, 0.02, 0.01)
#: block dims tried (as divisors of D), when the planner block-compresses a table on its own
AUTO_BLOCK_DIVISORS: Tuple[int, ...] = (4, 8, 16)
#: device bookkeeping of a cache (FBGEMM ``lxu_cache_state`` + LRU/LFU ``lxu_state``, int64 each), bytes per slot
CACHE_SLOT_BYTES = 16
#: device bookkeeping per table row (FBGEMM's ``cache_index_table_map``, int32), bytes per row
CACHE_ROW_MAP_BYTES = 4
#: host -> device link of a cached table, bytes/s (PCIe 4.0 x16, effective)
HOST_LINK_BYTES_PER_S: float = 25e9
#: seconds per multiply-add of the block projection, forward + backward (3 matmuls of B x E_b x E)
PROJECTION_MAC_S: float = 3e-10
#: largest Zipf exponent the fit considers
MAX_ZIPF_ALPHA = 8.0
_EXACT_TERMS = 4096


# ---- THE OPTION ---- #


@dataclass(frozen=True)
class StorageOption:
    """How one table is stored: compression ``none|qr|block`` and kernel ``fused|cached`` with their knobs.

    ``buckets`` (QR m) and ``block_dim`` (E_b) left ``None`` take their defaults in :meth:`resolved`.
    """

    compression: str = "none"
    kernel: str = "fused"
    buckets: Optional[int] = None
    combine: str = "mult"
    block_dim: Optional[int] = None
    cache_load_factor: float = DEFAULT_CACHE_LOAD_FACTOR

    @property
    def is_plain(self) -> bool:
        return self.compression == "none" and self.kernel == "fused"

    @classmethod
    def from_pin(cls, table: str, pin: Optional[TablePin]) -> Optional["StorageOption"]:
        """The pinned option (None when the pin says nothing of storage); raises ``invalid_pin``.

        ``compute_kernel: fused_uvm_caching`` (TorchRec's name) counts as ``kernel: cached``.
        """
        if pin is None:
            return None
        d = dict(pin.storage)
        if not d and pin.compute_kernel != "fused_uvm_caching":
            return None
        if pin.compute_kernel == "fused_uvm_caching":
            d.setdefault("kernel", "cached")

        def bad(what: str, fix: str) -> PlanError:
            return PlanError(f"Pin for table {table!r}: {what}. {fix}", INVALID_PIN)

        try:
            opt = cls(
                compression=str(d.get("compression", "none")), kernel=str(d.get("kernel", "fused")),
                buckets=None if d.get("buckets") is None else int(d["buckets"]), combine=str(d.get("combine", "mult")),
                block_dim=None if d.get("block_dim") is None else int(d["block_dim"]),
                cache_load_factor=float(d.get("cache_load_factor", DEFAULT_CACHE_LOAD_FACTOR)),
            )
        except (TypeError, ValueError) as e:
            raise bad(f"a storage value is not a number ({e})", "Write e.g. {compression: qr, buckets: 1024}.") from None
        for key, value, allowed in (("compression", opt.compression, COMPRESSIONS), ("kernel", opt.kernel, KERNELS),
                                    ("combine", opt.combine, QR_COMBINES)):
            if value not in allowed:
                raise bad(f"{key} {value!r} is unknown", f"Use one of {list(allowed)}.")
        if not 0 < opt.cache_load_factor <= 1:
            raise bad(f"cache_load_factor {opt.cache_load_factor} is not in (0, 1]", "Use e.g. 0.1 (10 % of rows cached).")
        if opt.kernel == "cached" and opt.compression != "none":
            raise bad("a cached kernel and compression together are not modelled", "Pin one of them.")
        if pin.hybrid is True or pin.sharding == Placement.HYBRID:
            raise bad("a compressed or cached table cannot be hybrid", "Drop hybrid or the storage keys.")
        return opt

    def resolved(self, table: TableSpec) -> "StorageOption":
        """Defaults filled in for ``table`` (QR m = ⌈√V⌉, E_b = D/4), checked against its shape."""
        opt = self
        if opt.compression == "qr":
            opt = replace(opt, buckets=qr_buckets(table.rows, opt.buckets))
            if not 1 <= opt.buckets <= table.rows or (opt.combine == "concat" and table.dim % 2):
                raise PlanError(
                    f"Table {table.name!r}: QR buckets={opt.buckets} (rows {table.rows}), combine={opt.combine} "
                    f"(dim {table.dim}); need 1 <= buckets <= rows and an even dim for concat. Fix the pin.",
                    INVALID_PIN)
        if opt.compression == "block":
            opt = replace(opt, block_dim=opt.block_dim or max(1, table.dim // 4))
            if not 1 <= opt.block_dim <= table.dim:
                raise PlanError(f"Table {table.name!r}: block_dim={opt.block_dim} must lie in [1, dim={table.dim}]. "
                                "Fix the pin (e.g. block_dim: dim/4).", INVALID_PIN)
        return opt

    def compression_spec(self) -> CompressionSpec:
        """The module-side spec (:class:`~rayemb.embedding.compression_math.CompressionSpec`) of a resolved option."""
        return CompressionSpec(self.compression, buckets=self.buckets if self.compression == "qr" else None,
                               combine=self.combine, block_dim=self.block_dim if self.compression == "block" else None)

    @property
    def label(self) -> str:
        if self.compression == "qr":
            return f"qr (m={self.buckets}, {self.combine})"
        if self.compression == "block":
            return f"block (E_b={self.block_dim})"
        if self.kernel == "cached":
            return f"cached (load factor {self.cache_load_factor:g})"
        return "plain"

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"compression": self.compression, "kernel": self.kernel}
        if self.compression == "qr":
            out.update(buckets=self.buckets, combine=self.combine)
        if self.compression == "block":
            out["block_dim"] = self.block_dim
        if self.kernel == "cached":
            out["cache_load_factor"] = self.cache_load_factor
        return out


def auto_options(table: TableSpec, topology: ClusterTopology) -> List[StorageOption]:
    """What the planner tries for a table that fits no plain placement, in order: cache, block, QR."""
    out = [StorageOption(kernel="cached", cache_load_factor=f) for f in AUTO_LOAD_FACTORS] if has_host_tier(topology) else []
    if table.bytes_per_element != 4:  # compressed tables are fp32 only (compression_math.refuse_low_precision)
        return out
    out += [StorageOption(compression="block", block_dim=table.dim // k) for k in AUTO_BLOCK_DIVISORS if table.dim // k >= 1]
    return out + [StorageOption(compression="qr")]


def allowed_placements(option: StorageOption, topology: ClusterTopology) -> List[Placement]:
    """Placements of a stored table: QR's two small tables DP or TW; block any; a cache needs a sharded table."""
    multi = [Placement.TABLE_ROW_WISE] if topology.num_nodes > 1 else []
    if option.compression == "qr":
        return [Placement.DATA_PARALLEL, Placement.TABLE_WISE]
    if option.compression == "block":
        return [Placement.DATA_PARALLEL, Placement.TABLE_WISE, Placement.ROW_WISE] + multi
    return [Placement.TABLE_WISE, Placement.ROW_WISE] + multi


# ---- SHAPE AND MEMORY ---- #


def sharded_spec(table: TableSpec, option: StorageOption) -> TableSpec:
    """The table whose rows are placed (weights as a plain table of this shape; no hot set)."""
    plain = replace(table, hot_rows=0, hot_share=0.0)
    if option.compression == "qr":
        # the quotient and the remainder table placed as one table of ⌈V/m⌉ + m rows (same width)
        return replace(plain, rows=sum(qr_rows(table.rows, option.buckets)), dim=qr_dims(table.dim, option.combine)[0])
    if option.compression == "block":
        return replace(plain, dim=option.block_dim)
    return plain


def output_dim(table: TableSpec, option: StorageOption) -> int:
    """Width of a pooled bag that crosses the wire: E_b for block (projected after), else D."""
    return option.block_dim if option.compression == "block" else table.dim


def storage_weight_bytes(table: TableSpec, option: StorageOption) -> int:
    """Weights only (no optimizer state): V·D·s plain, (⌈V/m⌉+m)·D_q·s QR, V·E_b·s + E_b·E·s block."""
    spec = sharded_spec(table, option)
    return spec.weight_bytes + projection_elements(table, option) * table.bytes_per_element


def projection_elements(table: TableSpec, option: StorageOption) -> int:
    return option.block_dim * table.dim if option.compression == "block" else 0


def cached_device_bytes(rows: int, row_weight_bytes: float, load_factor: float) -> int:
    """Device bytes of a cache over ``rows`` rows: ⌈λ·rows⌉ slots of weights + per-slot and per-row bookkeeping."""
    slots = math.ceil(load_factor * rows)
    return int(slots * (row_weight_bytes + CACHE_SLOT_BYTES) + rows * CACHE_ROW_MAP_BYTES)


def has_host_tier(topology: ClusterTopology) -> bool:
    """A second, larger memory tier behind the device: host DDR behind HBM on CUDA; none on CPU."""
    return topology.compute_device == "cuda" and topology.ddr_bytes > 0


def host_capacity_bytes(topology: ClusterTopology) -> int:
    """Host bytes per rank the planner may fill with cached tables (same reserve as the device)."""
    return int(topology.ddr_bytes * (1.0 - topology.reserved_fraction)) if has_host_tier(topology) else 0


# ---- HIT RATE ---- #


def zipf_harmonic(n: float, alpha: float) -> float:
    """H(n, α) = Σ_{r=1..n} r^-α: exact up to 4096 terms, then the midpoint integral of x^-α."""
    n = int(n)
    k = min(n, _EXACT_TERMS)
    head = float(np.sum(np.arange(1, k + 1, dtype=np.float64) ** -alpha))
    if n <= k:
        return head
    a, b = k + 0.5, n + 0.5
    tail = math.log(b / a) if abs(alpha - 1.0) < 1e-9 else (b ** (1 - alpha) - a ** (1 - alpha)) / (1 - alpha)
    return head + tail


def zipf_coverage(k: float, n: int, alpha: float) -> float:
    """Share of lookups hitting the ``k`` most frequent of ``n`` rows when frequency ∝ rank^-α."""
    k = max(0, min(int(math.ceil(k)), n))
    if k == 0:
        return 0.0
    if k == n:
        return 1.0
    return zipf_harmonic(k, alpha) / zipf_harmonic(n, alpha)


def zipf_exponent(hot_rows: int, hot_share: float, rows: int) -> float:
    """α whose Zipf curve puts ``hot_share`` of the lookups on the top ``hot_rows`` of ``rows`` (bisection)."""
    if hot_rows <= 0 or hot_rows >= rows or hot_share <= hot_rows / rows:
        return 0.0
    lo, hi = 0.0, MAX_ZIPF_ALPHA
    if zipf_coverage(hot_rows, rows, hi) <= hot_share:
        return hi
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if zipf_coverage(hot_rows, rows, mid) < hot_share else (lo, mid)
    return 0.5 * (lo + hi)


def cache_hit_rate(table: TableSpec, load_factor: float) -> float:
    """Predicted share of lookups a cache of the top ⌈λ·V⌉ rows serves (module docstring); λ = 1 gives 1.0."""
    alpha = zipf_exponent(table.hot_rows, table.hot_share, table.rows)
    return zipf_coverage(load_factor * table.rows, table.rows, alpha)


# ---- COST ---- #


@dataclass(frozen=True)
class StoredCost(Cost):
    """A :class:`Cost` of a compressed or cached table, with the host tier and the reason it was chosen.

    ``memory_bytes`` / ``max_shard_bytes`` are device bytes without the block projection;
    ``extra_bytes_per_rank`` is the projection every rank holds; ``replicated_bytes`` what every rank
    holds in all (data-parallel rows + projection; the replicated budget counts it);
    ``host_bytes_per_step`` the host <-> device bytes of cache misses (fetch + write-back), all ranks.
    """

    option: StorageOption = StorageOption()
    host_memory_bytes: int = 0
    max_host_shard_bytes: int = 0
    extra_bytes_per_rank: int = 0
    replicated_bytes: int = 0
    host_bytes_per_step: float = 0.0
    hit_rate: float = 1.0
    lookups_per_id: int = 1
    projection_macs_per_sample: int = 0
    reason: str = ""

    @property
    def device_per_rank(self) -> int:
        """Device bytes of the largest shard plus the replicated projection: what must fit one rank."""
        return self.max_shard_bytes + self.extra_bytes_per_rank

    def fits_in(self, capacity_bytes: int) -> bool:
        return self.device_per_rank <= capacity_bytes

    def fits_host(self, host_capacity: int) -> bool:
        return self.max_host_shard_bytes <= host_capacity

    @property
    def sort_key(self) -> Tuple[float, int]:
        return (self.bytes_per_step + self.host_bytes_per_step, self.max_shard_bytes)

    def to_json(self, world_size: int) -> Dict[str, Any]:
        """plan.json's per-table ``storage`` entry."""
        out = self.option.to_json()
        out.update(device_memory_bytes=self.memory_bytes + world_size * self.extra_bytes_per_rank,
                   max_device_bytes_per_rank=self.device_per_rank,
                   host_memory_bytes=self.host_memory_bytes, max_host_bytes_per_rank=self.max_host_shard_bytes,
                   host_bytes_per_step=self.host_bytes_per_step, reason=self.reason)
        if self.option.kernel == "cached":
            out["predicted_hit_rate"] = self.hit_rate
        return out


def storage_step_seconds(cost: StoredCost, table: TableSpec, local_batch: float, world_size: int, lookup_s: float,
                         dense_lookup_s: float, replicated_elem_s: float) -> float:
    """Compute seconds per step of one stored table on one rank (the step-time model's ``storage`` term).

    Lookups: ids · lookups per id (2 for QR) at the fused or dense per-id cost; replicated elements
    (data-parallel rows of the sharded spec, the block projection) at the replicated cost; the
    projection's B x E_b x E multiply-adds; the rank's share of cache-miss bytes over the host link.
    """
    dp = cost.placement == Placement.DATA_PARALLEL
    spec = sharded_spec(table, cost.option)
    seconds = local_batch * table.pooling_factor * cost.lookups_per_id * (dense_lookup_s if dp else lookup_s)
    seconds += ((spec.rows * spec.dim if dp else 0) + cost.projection_macs_per_sample) * replicated_elem_s
    seconds += local_batch * cost.projection_macs_per_sample * PROJECTION_MAC_S
    return seconds + cost.host_bytes_per_step / max(1, world_size) / HOST_LINK_BYTES_PER_S


__all__ = [
    "COMPRESSIONS", "KERNELS", "QR_COMBINES", "DEFAULT_CACHE_LOAD_FACTOR", "StorageOption", "StoredCost",
    "auto_options", "allowed_placements", "sharded_spec", "output_dim", "storage_weight_bytes",
    "cached_device_bytes", "has_host_tier", "host_capacity_bytes", "zipf_harmonic", "zipf_coverage",
    "zipf_exponent", "cache_hit_rate", "storage_step_seconds", "HOST_LINK_BYTES_PER_S", "PROJECTION_MAC_S",
]
