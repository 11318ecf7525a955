"""The planner's vocabulary: every value type and stage ABC, in one file.

Read top to bottom: a :class:`ClusterTopology` (what hardware) and
:class:`TableSpec` s (what tables, with their statistics) go in; a
:class:`PlacementChooser` (the cost model, :mod:`rayemb.planner.cost`) picks a
:class:`Placement` per table; a :class:`RankAssigner` places shards on ranks;
a :class:`PlanResult` comes out, with :meth:`PlanResult.to_json` giving
``plan.json``. Nothing here imports torch or torchrec, so ``plan.json`` can be
read on a CPU-only head (:func:`rayemb.planner.report.load_plan_json`).

Units: bytes, bytes per second, rows; ``GiB = 1024**3`` bytes.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from rayemb.errors import PlanError
from rayemb.planner.optimizer_state import DEFAULT_EMBEDDING_OPTIMIZER, check_embedding_optimizer_name
from rayemb.placements import HYBRID_COLD_PLACEMENTS, Placement

if TYPE_CHECKING:
    from rayemb.planner.pins import TablePin

GiB: int = 1024**3
GB_S: float = 1e9  # bytes per second in one GB/s

PLAN_SCHEMA_VERSION = 2  # 2: predicted_step_time_s is the model's alone, the plan probe's is probed_step_time_s

#: PlanError categories (tests assert these, not the wording)
INSUFFICIENT_STORAGE = "insufficient_storage"
INVALID_PIN = "invalid_pin"
INVALID_TOPOLOGY = "invalid_topology"
INVALID_PLAN_FILE = "invalid_plan_file"

#: what to try when tables do not fit (listed in every insufficient_storage error; pins: rayemb.planner.compression)
STORAGE_REMEDIES = (
    "1) plan for more devices (--world-size / more GPUs per node), 2) use a smaller embedding dim "
    "(model.embedding_dim), 3) compress the table (pin planner.tables.<T>: {compression: qr} or "
    "{compression: block, block_dim: <dim/4>}), 4) on CUDA keep it in host memory with a device cache of hot rows "
    "(FBGEMM UVM caching: pin {kernel: cached, cache_load_factor: 0.1})"
)


# ---- TOPOLOGY ---- #

#: defaults with units (overridable per call / in config)
DEFAULT_HBM_BYTES: int = 80 * GiB  # A100/H100 80 GB
DEFAULT_DDR_BYTES: int = 128 * GiB  # host memory per rank when unknown
DEFAULT_INTRA_NODE_BW: float = 300 * GB_S  # NVLink-class, bytes/s per rank
DEFAULT_INTER_NODE_BW: float = 25 * GB_S  # 200 Gb/s NIC per rank, bytes/s
DEFAULT_CPU_INTRA_NODE_BW: float = 10 * GB_S  # shared-memory gloo, bytes/s
DEFAULT_CPU_INTER_NODE_BW: float = 1.25 * GB_S  # 10 Gb/s ethernet, bytes/s
#: share of device memory the planner leaves for activations, dense params, buffers
DEFAULT_RESERVED_FRACTION: float = 0.15


@dataclass(frozen=True)
class ClusterTopology:
    """A cluster as the planner sees it: ``num_nodes`` x ``devices_per_node`` ranks.

    ``compute_device`` is ``"cuda"`` (tables live in HBM, ``hbm_bytes`` per
    device) or ``"cpu"`` (tables live in host memory, ``ddr_bytes`` per rank).
    Bandwidths are per rank in bytes/s. ``reserved_fraction`` of the table
    memory is kept free for everything that is not an embedding table.

    >>> t = ClusterTopology(num_nodes=2, devices_per_node=8, hbm_bytes=80 * GiB)
    >>> t.world_size, t.capacity_bytes == int(80 * GiB * 0.85)
    (16, True)
    """

    num_nodes: int
    devices_per_node: int
    compute_device: str = "cuda"
    hbm_bytes: int = DEFAULT_HBM_BYTES
    ddr_bytes: int = DEFAULT_DDR_BYTES
    intra_node_bw: float = DEFAULT_INTRA_NODE_BW
    inter_node_bw: float = DEFAULT_INTER_NODE_BW
    reserved_fraction: float = DEFAULT_RESERVED_FRACTION

    def __post_init__(self) -> None:
        problems = []
        if self.num_nodes < 1 or self.devices_per_node < 1:
            problems.append(f"{self.num_nodes} nodes x {self.devices_per_node} devices per node")
        if self.compute_device not in ("cuda", "cpu"):
            problems.append(f"compute_device {self.compute_device!r} (use 'cuda' or 'cpu')")
        if self.hbm_bytes < 0 or self.ddr_bytes <= 0:
            problems.append(f"memory hbm={self.hbm_bytes} ddr={self.ddr_bytes} bytes")
        if self.compute_device == "cuda" and self.hbm_bytes <= 0:
            problems.append("no HBM on a cuda topology")
        if self.intra_node_bw <= 0 or self.inter_node_bw <= 0:
            problems.append(f"bandwidths intra={self.intra_node_bw} inter={self.inter_node_bw} bytes/s")
        if not 0 <= self.reserved_fraction < 1:
            problems.append(f"reserved_fraction {self.reserved_fraction}")
        if problems:
            raise PlanError(
                f"Invalid cluster topology: {'; '.join(problems)}. Describe at least one node with one "
                "device, positive memory (e.g. --hbm-gib 80) and positive bandwidths.", INVALID_TOPOLOGY)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices_per_node

    @property
    def device_bytes(self) -> int:
        """Memory of the storage tier tables live in: HBM on cuda, host memory on cpu."""
        return self.hbm_bytes if self.compute_device == "cuda" else self.ddr_bytes

    @property
    def capacity_bytes(self) -> int:
        """Bytes per rank the planner may fill with embedding tables."""
        return int(self.device_bytes * (1.0 - self.reserved_fraction))

    def node_of(self, rank: int) -> int:
        return rank // self.devices_per_node

    def with_overrides(self, **kwargs: Any) -> "ClusterTopology":
        return replace(self, **{k: v for k, v in kwargs.items() if v is not None})

    def to_dict(self) -> Dict[str, Any]:
        return {
            "num_nodes": self.num_nodes, "devices_per_node": self.devices_per_node,
            "world_size": self.world_size, "compute_device": self.compute_device,
            "hbm_bytes": self.hbm_bytes, "ddr_bytes": self.ddr_bytes,
            "intra_node_bw_bytes_per_s": self.intra_node_bw, "inter_node_bw_bytes_per_s": self.inter_node_bw,
            "reserved_fraction": self.reserved_fraction,
        }


# ---- TABLES ---- #


@dataclass(frozen=True)
class TableSpec:
    """One embedding table with what the statistics pass learned about it.

    ``pooling_factor`` is the mean ids per bag P; ``hot_rows`` = |F| the rows
    the frequent-category split replicates and ``hot_share`` = h the share of
    lookups that hit them (0 without stats). ``bytes_per_element`` s is the
    weight element size (4 for fp32). ``embedding_optimizer`` is the job's
    ``train.embedding_optimizer``, which sizes each row's optimizer state
    (:mod:`rayemb.planner.optimizer_state`).

    >>> t = TableSpec("C1", rows=1000, dim=16)
    >>> t.weight_bytes
    64000
    """

    name: str
    rows: int
    dim: int
    bytes_per_element: int = 4
    pooling_factor: float = 1.0
    hot_rows: int = 0
    hot_share: float = 0.0
    embedding_optimizer: str = DEFAULT_EMBEDDING_OPTIMIZER

    def __post_init__(self) -> None:
        check_embedding_optimizer_name(self.embedding_optimizer, f"Table {self.name!r}")
        if self.rows < 1 or self.dim < 1 or self.bytes_per_element < 1:
            raise PlanError(
                f"Table {self.name!r} has rows={self.rows}, dim={self.dim}, bytes_per_element="
                f"{self.bytes_per_element}; all must be positive. Fix num_embeddings in schema.yaml or "
                "model.embedding_dim.", INVALID_PIN)
        if not 0 <= self.hot_rows <= self.rows or not 0.0 <= self.hot_share <= 1.0 or self.pooling_factor < 0:
            raise PlanError(
                f"Table {self.name!r} has hot_rows={self.hot_rows} (rows={self.rows}), hot_share="
                f"{self.hot_share}, pooling_factor={self.pooling_factor}; need 0<=hot_rows<=rows, "
                "0<=hot_share<=1, pooling_factor>=0. Recompute stats.json with `rayemb stats`.", INVALID_PIN)

    @property
    def row_bytes(self) -> int:
        return self.dim * self.bytes_per_element

    @property
    def weight_bytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def cold_rows(self) -> int:
        return self.rows - self.hot_rows


# ---- PLACEMENTS ---- #
# Placement and HYBRID_COLD_PLACEMENTS (imported above) live in rayemb.placements: the embedding modules name them
# too. A user's pins on placements (TablePin, parse_pins) are rayemb.planner.pins.


# ---- COST ---- #


@dataclass(frozen=True)
class Cost:
    """Predicted price of one placement of one table: traffic per step and memory.

    ``bytes_per_step`` sums bytes sent off-rank over all ranks, forward +
    backward (the convention :mod:`rayemb.embedding.comm` measures);
    ``memory_bytes`` is the table's total footprint over all ranks (weights +
    optimizer state, replicas counted on every rank); ``max_shard_bytes`` the
    largest single-rank piece (what must fit one device).
    """

    placement: Placement
    bytes_per_step: float
    memory_bytes: int
    max_shard_bytes: int

    def fits_in(self, capacity_bytes: int) -> bool:
        return self.max_shard_bytes <= capacity_bytes


# ---- PLAN ---- #


@dataclass(frozen=True)
class TablePlan:
    """Where one table went: placement, sharding type (a hybrid's: its cold half's), ranks, ``storage`` if compressed."""

    name: str
    placement: Placement
    sharding_type: str
    ranks: Tuple[int, ...]
    hot_rows: int
    predicted_bytes_per_step: float
    memory_bytes: int
    compute_kernel: str
    storage: Optional[Dict[str, Any]] = None

    def to_json(self) -> Dict[str, Any]:
        return {
            "placement": self.placement.value, "sharding_type": self.sharding_type, "ranks": list(self.ranks),
            "hot_rows": self.hot_rows, "predicted_bytes_per_step": self.predicted_bytes_per_step,
            "memory_bytes": self.memory_bytes, "compute_kernel": self.compute_kernel,
            **({"storage": dict(self.storage)} if self.storage else {}),
        }


@dataclass(frozen=True)
class RankUsage:
    """Table memory placed on one rank against what it may hold."""

    rank: int
    memory_bytes: int
    capacity_bytes: int

    @property
    def utilization(self) -> float:
        return self.memory_bytes / self.capacity_bytes if self.capacity_bytes else float("inf")

    def fits(self) -> bool:
        return self.memory_bytes <= self.capacity_bytes

    def __add__(self, extra_bytes: int) -> "RankUsage":
        return replace(self, memory_bytes=self.memory_bytes + int(extra_bytes))

    def to_json(self) -> Dict[str, int]:
        return {"rank": self.rank, "memory_bytes": self.memory_bytes, "capacity_bytes": self.capacity_bytes}


@dataclass(frozen=True)
class PlanResult:
    """A complete plan. ``to_json()`` is ``plan.json`` (docs/planner.md documents it).

    ``sharding_plan`` holds TorchRec's ``ShardingPlan`` when the planner ran
    TorchRec's engine (``None`` after :func:`load_plan_json`, or on the fast
    path until :func:`rayemb.planner.torchrec_plan.to_sharding_plan` builds it).
    """

    world_size: int
    global_batch: int
    tables: Dict[str, TablePlan]
    ranks: Tuple[RankUsage, ...]
    topology: Optional[ClusterTopology] = None
    engine: str = "fast"
    sharding_plan: Any = field(default=None, compare=False, repr=False)

    @property
    def predicted_bytes_per_step(self) -> float:
        return float(sum(t.predicted_bytes_per_step for t in self.tables.values()))

    @property
    def max_memory_bytes(self) -> int:
        return max(r.memory_bytes for r in self.ranks)

    @property
    def memory_imbalance(self) -> float:
        """max / mean per-rank table memory (1.0 is perfectly balanced)."""
        mean = sum(r.memory_bytes for r in self.ranks) / len(self.ranks)
        return self.max_memory_bytes / mean if mean else 1.0

    def all_fit(self) -> bool:
        return all(r.fits() for r in self.ranks)

    def placement_counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for t in self.tables.values():
            out[t.placement.value] = out.get(t.placement.value, 0) + 1
        return out

    def to_json(self) -> Dict[str, Any]:
        return {
            "schema_version": PLAN_SCHEMA_VERSION,
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "engine": self.engine,
            "predicted_bytes_per_step": self.predicted_bytes_per_step,
            "topology": self.topology.to_dict() if self.topology else None,
            "tables": {name: t.to_json() for name, t in self.tables.items()},
            "ranks": [r.to_json() for r in self.ranks],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], source: str = "plan.json") -> "PlanResult":
        try:
            if int(d["schema_version"]) != PLAN_SCHEMA_VERSION:
                raise ValueError(f"schema_version {d['schema_version']}, this rayemb reads {PLAN_SCHEMA_VERSION} only")
            topo = d.get("topology")
            topology = ClusterTopology(
                num_nodes=int(topo["num_nodes"]), devices_per_node=int(topo["devices_per_node"]),
                compute_device=str(topo["compute_device"]), hbm_bytes=int(topo["hbm_bytes"]),
                ddr_bytes=int(topo["ddr_bytes"]), intra_node_bw=float(topo["intra_node_bw_bytes_per_s"]),
                inter_node_bw=float(topo["inter_node_bw_bytes_per_s"]),
                reserved_fraction=float(topo["reserved_fraction"]),
            ) if topo else None
            tables = {
                name: TablePlan(
                    name=name, placement=Placement(t["placement"]), sharding_type=str(t["sharding_type"]),
                    ranks=tuple(int(r) for r in t["ranks"]), hot_rows=int(t["hot_rows"]),
                    predicted_bytes_per_step=float(t["predicted_bytes_per_step"]),
                    memory_bytes=int(t.get("memory_bytes", 0)), compute_kernel=str(t.get("compute_kernel", "")),
                    storage=dict(t["storage"]) if t.get("storage") else None,
                )
                for name, t in d["tables"].items()
            }
            ranks = tuple(RankUsage(int(r["rank"]), int(r["memory_bytes"]), int(r["capacity_bytes"])) for r in d["ranks"])
            return cls(world_size=int(d["world_size"]), global_batch=int(d.get("global_batch", 0)), tables=tables,
                       ranks=ranks, topology=topology, engine=str(d.get("engine", "fast")))
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(
                f"{source} is not a valid rayemb plan ({type(e).__name__}: {e}). Regenerate it with "
                "`rayemb plan --config JOB.yaml --out plan.json`.", INVALID_PLAN_FILE) from None


# ---- STAGES ---- #


class PlacementChooser(abc.ABC):
    """Picks one placement per table (the cost model is the default, :class:`rayemb.planner.cost.BytesCostModel`)."""

    @abc.abstractmethod
    def choose(
        self, tables: Sequence[TableSpec], topology: ClusterTopology, global_batch: int, pins: Mapping[str, TablePin]
    ) -> Dict[str, Cost]:
        """Returns ``{table name: chosen Cost}``; raises PlanError when a pin cannot be met."""


class RankAssigner(abc.ABC):
    """Places each table's shards on ranks given the chosen placements."""

    @abc.abstractmethod
    def assign(
        self, tables: Sequence[TableSpec], choices: Mapping[str, Cost], topology: ClusterTopology
    ) -> Tuple[Dict[str, Tuple[int, ...]], List[int]]:
        """Returns ``({table: ranks}, per-rank memory bytes)``."""


__all__ = [
    "GiB", "GB_S", "PLAN_SCHEMA_VERSION", "INSUFFICIENT_STORAGE", "INVALID_PIN", "INVALID_TOPOLOGY",
    "INVALID_PLAN_FILE", "STORAGE_REMEDIES", "ClusterTopology", "TableSpec", "Placement", "HYBRID_COLD_PLACEMENTS",
    "Cost", "TablePlan", "RankUsage", "PlanResult",
    "PlacementChooser", "RankAssigner",
]
