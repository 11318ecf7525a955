"""Shapes and bytes of compressed embedding tables, torch-free so the planner can import them.

A logical table of V rows and dim D is stored, per :class:`CompressionSpec`, as

* ``none``: one V × D table;
* ``qr`` (quotient-remainder; Shi et al. 2020, "Compositional Embeddings Using
  Complementary Partitions for Memory-Efficient Recommendation Systems",
  KDD'20): with m buckets (default ⌈√V⌉), a quotient table of ⌈V/m⌉ rows and a
  remainder table of m rows; id i is ``combine(Q[i // m], R[i % m])``,
  ``mult``/``add`` with both tables D wide, ``concat`` with D/2 each;
* ``block`` (one block of Ginart et al. 2021, "Mixed Dimension Embeddings",
  DLRM's ``PrEmbeddingBag``): a V × E_b table and a shared E_b × D projection,
  id i is ``T[i] @ P``; the projection is dense and replicated like the MLPs.

Reference size (the one ``jobs/bench/compression.py`` checks): V = 1,048,576, D = 512, fp32: plain 2048 MiB, block
with E_b = 128 512 MiB (+ 256 KiB projection), QR 4 MiB.
:func:`compressed_bytes` counts the embedding tables (what the placement
shards), :func:`projection_bytes` the replicated projection; optimizer state
is the planner's to add (:mod:`rayemb.planner.cost`).

Example::

    >>> spec = CompressionSpec("qr")
    >>> qr_rows(1_048_576)
    (1024, 1024)
    >>> compressed_bytes(1_048_576, 512, spec) / 2**20
    4.0
    >>> [(t.suffix, t.rows, t.dim) for t in physical_tables(1_048_576, 512, CompressionSpec("block", block_dim=128))]
    [('__block', 1048576, 128)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from rayemb.errors import ConfigError

#: values of a table's ``compression`` option
COMPRESSION_KINDS = ("none", "qr", "block")
#: how QR combines the quotient and the remainder row
QR_COMBINES = ("mult", "add", "concat")
#: physical table name = logical name + suffix
QR_QUOTIENT_SUFFIX = "__q"
QR_REMAINDER_SUFFIX = "__r"
BLOCK_SUFFIX = "__block"
#: fp32
DEFAULT_ELEMENT_BYTES = 4


@dataclass(frozen=True)
class CompressionSpec:
    """How one logical table is stored (config ``compression: none|qr|block`` and its options).

    Args:
        kind: ``none``, ``qr`` or ``block``.
        buckets: QR only: remainder table rows m (None: ⌈√V⌉).
        combine: QR only: ``mult`` (elementwise product), ``add`` or ``concat`` (D/2 each).
        block_dim: block only (required): the table's dim E_b, 1 ≤ E_b ≤ D.
    """

    kind: str = "none"
    buckets: Optional[int] = None
    combine: str = "mult"
    block_dim: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind not in COMPRESSION_KINDS:
            raise ConfigError(f"compression {self.kind!r} is not known; use one of {COMPRESSION_KINDS}.",
                              category="invalid_option")
        if self.combine not in QR_COMBINES:
            raise ConfigError(f"QR combine {self.combine!r} is not known; use one of {QR_COMBINES}.",
                              category="invalid_option")
        if self.kind != "qr" and self.buckets is not None:
            raise ConfigError(f"buckets={self.buckets} is a QR option but compression is {self.kind!r}; "
                              "drop it or set compression: qr.", category="invalid_option")
        if self.kind != "block" and self.block_dim is not None:
            raise ConfigError(f"block_dim={self.block_dim} is a block option but compression is {self.kind!r}; "
                              "drop it or set compression: block.", category="invalid_option")
        if self.buckets is not None and (isinstance(self.buckets, bool) or int(self.buckets) != self.buckets
                                         or self.buckets < 1):
            raise ConfigError(f"QR buckets must be a positive integer, got {self.buckets!r}.",
                              category="invalid_option")
        if self.kind == "block" and (self.block_dim is None or isinstance(self.block_dim, bool)
                                     or int(self.block_dim) != self.block_dim or self.block_dim < 1):
            raise ConfigError(f"compression: block needs a positive integer block_dim (E_b = D / w), got "
                              f"{self.block_dim!r}.", category="invalid_option")

    @property
    def compressed(self) -> bool:
        return self.kind != "none"

    def check_table(self, name: str, rows: int, dim: int) -> None:
        """Raises :class:`ConfigError` when this spec cannot store table ``name`` (V = ``rows``, D = ``dim``)."""
        if self.kind == "qr":
            m = qr_buckets(rows, self.buckets)
            if m > rows:
                raise ConfigError(f"Table {name!r}: QR buckets={m} exceeds its {rows} rows; use buckets ≤ {rows} "
                                  "(default ⌈√V⌉).", category="invalid_option")
            if self.combine == "concat" and dim % 2:
                raise ConfigError(f"Table {name!r}: QR combine 'concat' splits dim {dim} in two halves, so the dim "
                                  "must be even; use an even embedding_dim or combine 'mult'/'add'.",
                                  category="invalid_option")
        if self.kind == "block" and self.block_dim is not None and self.block_dim > dim:
            raise ConfigError(f"Table {name!r}: block_dim={self.block_dim} exceeds its embedding dim {dim}; "
                              f"use block_dim ≤ {dim} (e.g. {max(1, dim // 4)}).", category="invalid_option")


@dataclass(frozen=True)
class PhysicalTable:
    """One stored table of a logical table: name suffix, rows and dim."""

    suffix: str
    rows: int
    dim: int


def qr_buckets(rows: int, buckets: Optional[int] = None) -> int:
    """m: ``buckets`` or ⌈√rows⌉ (the size minimising ⌈V/m⌉ + m)."""
    if buckets is not None:
        return int(buckets)
    return math.isqrt(max(int(rows), 1) - 1) + 1


def qr_rows(rows: int, buckets: Optional[int] = None) -> Tuple[int, int]:
    """(quotient rows ⌈V/m⌉, remainder rows m) of a QR table of ``rows`` logical rows."""
    m = qr_buckets(rows, buckets)
    return -(-int(rows) // m), m


def qr_dims(dim: int, combine: str) -> Tuple[int, int]:
    """(quotient dim, remainder dim): D and D for mult/add, D/2 and D/2 for concat."""
    return (dim // 2, dim // 2) if combine == "concat" else (dim, dim)


def physical_tables(rows: int, dim: int, spec: CompressionSpec) -> List[PhysicalTable]:
    """The tables that store a logical V × D table under ``spec`` (what a sharding plan places)."""
    if spec.kind == "qr":
        (q, r), (dq, dr) = qr_rows(rows, spec.buckets), qr_dims(dim, spec.combine)
        return [PhysicalTable(QR_QUOTIENT_SUFFIX, q, dq), PhysicalTable(QR_REMAINDER_SUFFIX, r, dr)]
    if spec.kind == "block":
        return [PhysicalTable(BLOCK_SUFFIX, int(rows), int(spec.block_dim or dim))]
    return [PhysicalTable("", int(rows), int(dim))]


def projection_shape(dim: int, spec: CompressionSpec) -> Optional[Tuple[int, int]]:
    """(E_b, D) of a block table's projection; None for other kinds."""
    return (int(spec.block_dim or dim), int(dim)) if spec.kind == "block" else None


def storage_spec(storage: Optional[Mapping[str, Any]]) -> CompressionSpec:
    """The :class:`CompressionSpec` of a plan's ``storage`` entry (``TablePlan.storage``, plan.json); None: plain.

    A cached table (``compression: none``, ``kernel: cached``) is a plain table
    here: only its TorchRec compute kernel differs.
    """
    if not storage or storage.get("compression", "none") == "none":
        return CompressionSpec()
    kind = str(storage["compression"])
    return CompressionSpec(
        kind, buckets=int(storage["buckets"]) if kind == "qr" and storage.get("buckets") is not None else None,
        combine=str(storage.get("combine") or "mult") if kind == "qr" else "mult",
        block_dim=int(storage["block_dim"]) if kind == "block" and storage.get("block_dim") is not None else None)


def spec_storage(spec: CompressionSpec, rows: int) -> Dict[str, Any]:
    """The inverse of :func:`storage_spec` for a table of ``rows`` rows, QR buckets resolved.

    What checkpoints (meta.json) and exported models (model.json) record.
    """
    if spec.kind == "qr":
        return {"compression": "qr", "buckets": qr_buckets(rows, spec.buckets), "combine": spec.combine}
    if spec.kind == "block":
        return {"compression": "block", "block_dim": int(spec.block_dim)}
    return {"compression": "none"}


def refuse_low_precision(compressed: Mapping[str, str]) -> None:
    """:class:`ConfigError` naming ``model.embedding_dtype`` when a compressed table (name -> its dtype, ``fp32``,
    ``fp16``) is not fp32: its projection, replicated QR rows and the combining of its parts are fp32."""
    half = sorted(n for n, d in compressed.items() if d.lower() != "fp32")
    if half:
        raise ConfigError(f"Invalid config value model.embedding_dtype: {compressed[half[0]].lower()} tables cannot be "
                          f"compressed, and tables {half} are. Use model.embedding_dtype: fp32 with compressed tables, "
                          "or drop their compression pins (planner.tables.<T>); the planner compresses a table on "
                          "its own only when the plan does not fit plainly.", category="invalid_option")


def compressed_bytes(rows: int, dim: int, spec: CompressionSpec, elem_bytes: int = DEFAULT_ELEMENT_BYTES) -> int:
    """Bytes of the embedding tables storing a V × D table under ``spec`` (projection excluded)."""
    return sum(t.rows * t.dim for t in physical_tables(rows, dim, spec)) * int(elem_bytes)


def projection_bytes(dim: int, spec: CompressionSpec, elem_bytes: int = DEFAULT_ELEMENT_BYTES) -> int:
    """Bytes of a block table's replicated projection (0 for other kinds)."""
    shape = projection_shape(dim, spec)
    return shape[0] * shape[1] * int(elem_bytes) if shape else 0


def compression_ratio(rows: int, dim: int, spec: CompressionSpec) -> float:
    """Plain bytes / compressed bytes (tables and projection)."""
    plain = rows * dim
    stored = compressed_bytes(rows, dim, spec, 1) + projection_bytes(dim, spec, 1)
    return plain / stored


__all__ = [
    "BLOCK_SUFFIX", "COMPRESSION_KINDS", "CompressionSpec", "DEFAULT_ELEMENT_BYTES", "PhysicalTable",
    "QR_COMBINES", "QR_QUOTIENT_SUFFIX", "QR_REMAINDER_SUFFIX", "compressed_bytes", "compression_ratio",
    "physical_tables", "projection_bytes", "projection_shape", "qr_buckets", "qr_dims", "qr_rows",
    "refuse_low_precision", "spec_storage", "storage_spec",
]
