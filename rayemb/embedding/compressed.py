"""Compressed embedding bags (quotient-remainder and block) built from stock TorchRec modules.

A table too big for a rank can be stored compressed (shapes and
bytes in :mod:`rayemb.embedding.compression_math`, torch-free for the planner):

* **QR** (Shi et al. 2020, "Compositional Embeddings Using Complementary
  Partitions", KDD'20; DLRM's ``QREmbeddingBag``): with m buckets, id i has
  the row ``combine(Q[i // m], R[i % m])`` of a ⌈V/m⌉-row quotient table and
  an m-row remainder table. A bag pools its ids' rows:
  ``pooled(b) = Σ_{i∈b} w_i · combine(Q[i//m], R[i%m])``. For ``add`` and
  ``concat`` this equals ``combine(Σ w_i Q[i//m], Σ w_i R[i%m])`` by
  linearity, so both tables pool inside an ``EmbeddingBagCollection`` (only
  pooled vectors cross the wire). ``mult`` is not linear in the pair
  (DLRM's pool-then-multiply adds cross terms in multi-hot bags), so its
  rows are looked up per id (an ``EmbeddingCollection``, or plain replicated
  rows when data-parallel) and the products pooled locally, as the hybrid
  embedding pools its cold rows.
* **Block** (one block of Ginart et al. 2021, "Mixed Dimension Embeddings";
  DLRM's ``PrEmbeddingBag``): a V × E_b table and a shared projection P
  (E_b → D, ``nn.Linear`` without bias). Pooling before the projection equals
  projecting each row then pooling, ``(Σ w_i T[i]) P = Σ w_i (T[i] P)``, so
  the table pools in the ``EmbeddingBagCollection`` and only the pooled
  E_b-wide vectors are projected.

Mean pooling divides by the bag's id count (FBGEMM's convention), before or
after the combine alike. ``DistributedModelParallel`` shards the children with
:func:`rayemb.embedding.sharders.cpu_capable_sharders` under the plan's
placement of each physical table (``{table}__q``, ``{table}__r``,
``{table}__block``; :meth:`CompressedEmbeddingBagCollection.parameter_constraints`);
projections are dense parameters, replicated and DDP-averaged like the MLPs.
:class:`CompressedReference` computes the same maths with plain
``nn.Embedding`` rows, combined and projected per id, for tests and as the spec.

Example::

    >>> tables = [EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=100, feature_names=["f0"])]
    >>> ebc = CompressedEmbeddingBagCollection(tables, {"t0": CompressionSpec("qr", combine="mult")})
    >>> kjt = KeyedJaggedTensor.from_lengths_sync(
    ...     keys=["f0"], values=torch.tensor([3, 50, 7]), lengths=torch.tensor([2, 1]))
    >>> ebc(kjt).values().shape
    torch.Size([2, 8])
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Collection, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from rayemb.embedding.compression_math import (BLOCK_SUFFIX, QR_QUOTIENT_SUFFIX, QR_REMAINDER_SUFFIX,
                                                CompressionSpec, physical_tables, qr_buckets)
from rayemb.errors import ConfigError, DataError

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import ParameterConstraints

logger = logging.getLogger(__name__)

#: sharding types of compressed tables, each checked on CPU/gloo by tests/dist/test_compressed_equivalence.py;
#: tables pooled in ``bags`` (block, QR add/concat) also table_row_wise (QR mult's EmbeddingCollection has none)
COMPRESSED_PLACEMENTS = ("data_parallel", "table_wise", "row_wise", "column_wise")
POOLED_COMPRESSED_PLACEMENTS = COMPRESSED_PLACEMENTS + ("table_row_wise",)

_NONE = CompressionSpec()


def _physical_kwargs(t: EmbeddingBagConfig, suffix: str, rows: int, dim: int) -> Dict[str, object]:
    # Sub-tables keep the logical table's init range (TorchRec's default would follow their row count).
    return dict(
        name=t.name + suffix, embedding_dim=dim, num_embeddings=rows,
        feature_names=[f + suffix for f in t.feature_names], data_type=t.data_type, init_fn=t.init_fn,
        weight_init_max=t.get_weight_init_max(), weight_init_min=t.get_weight_init_min(),
    )


def _mult_remainder_init(kwargs: Dict[str, object]) -> Dict[str, object]:
    # With both factors in ±a the product would start at a² (1e-6 at V = 2^20) and barely
    # train; remainder rows near 1 start the products at the logical table's own scale.
    a = max(abs(float(kwargs["weight_init_max"])), abs(float(kwargs["weight_init_min"])))
    return {**kwargs, "init_fn": None, "weight_init_min": 1.0 - a, "weight_init_max": 1.0 + a}


class ReplicatedRows(nn.Module):
    """One row table as a plain dense ``weight`` [V, D]: DMP leaves it unsharded, DDP replicates it.

    Holds a data-parallel QR-mult table: TorchRec 1.8's data-parallel
    ``EmbeddingCollection`` returns one row per bag instead of one per id on
    CPU. Kept under ``replicated.embeddings.{name}``, an ``EmbeddingCollection``'s
    key pattern, so :func:`rayemb.embedding.data_parallel.replicated_embedding_parameters`
    finds it; ``reset_parameters`` applies the config's init (DMP calls it on meta modules).
    """

    def __init__(self, config: EmbeddingConfig, device: Optional[torch.device] = None) -> None:
        super().__init__()
        self._config = config
        self.weight = nn.Parameter(torch.empty(config.num_embeddings, config.embedding_dim, device=device))
        if self.weight.device.type != "meta":
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        c = self._config
        if c.init_fn is not None:
            c.init_fn(self.weight)
        else:
            self.weight.uniform_(c.get_weight_init_min(), c.get_weight_init_max())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(ids, self.weight)


class CompressedEmbeddingBagCollection(nn.Module):
    """Drop-in for ``EmbeddingBagCollection`` whose tables may be stored QR- or block-compressed.

    Children (``bags`` and ``rows`` sharded by ``DistributedModelParallel`` with stock sharders):

    * ``bags``: ``EmbeddingBagCollection`` of plain tables, QR ``add``/``concat``
      quotient and remainder tables and block tables (pooled lookups);
    * ``rows``: ``ModuleDict`` ``d{dim}`` -> ``EmbeddingCollection`` of QR
      ``mult`` quotient and remainder tables (row lookups, pooled here), for
      table-, row- and column-wise placements;
    * ``replicated``: ``embeddings`` -> name -> :class:`ReplicatedRows`, the QR
      ``mult`` tables named in ``data_parallel`` (dense, replicated);
    * ``projections``: ``ModuleDict`` table -> ``nn.Linear(E_b, D, bias=False)`` (dense, replicated).

    ``forward`` takes the KJT an ``EmbeddingBagCollection(tables)`` takes (ids
    in [0, V)) and returns a ``KeyedTensor`` with its keys and ``length_per_key``;
    ids split into (quotient, remainder) inside (:meth:`physical_features`).
    :meth:`table_parameters` take TorchRec's fused optimizer; the rest
    (projections, replicated rows, data-parallel tables) a regular one.

    Args:
        tables: the logical tables, as for ``EmbeddingBagCollection`` (one table per feature).
        compression: table name -> :class:`CompressionSpec`; absent tables are plain.
        is_weighted: whether features carry per-id weights.
        device: where to allocate (``torch.device("meta")`` for planning only).
        data_parallel: tables the plan places data-parallel (only QR ``mult`` ones change the module).
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        compression: Mapping[str, CompressionSpec],
        is_weighted: bool = False,
        device: Optional[torch.device] = None,
        data_parallel: Collection[str] = (),
    ) -> None:
        super().__init__()
        names = {t.name for t in tables}
        unknown = sorted((set(compression) | set(data_parallel)) - names)
        if unknown:
            raise ConfigError(f"compression or data_parallel names tables {unknown} that are not among the tables "
                              f"{sorted(names)}; fix the table names.", category="invalid_option")
        features = [f for t in tables for f in t.feature_names]
        if len(set(features)) != len(features):
            raise ConfigError(f"feature names {features} repeat across tables; compressed tables need one table "
                              "per feature.", category="invalid_option")
        self._tables = list(tables)
        self._specs = {t.name: compression.get(t.name, _NONE) for t in tables}
        self._is_weighted = is_weighted
        self._data_parallel = frozenset(data_parallel)
        bag_cfgs: List[EmbeddingBagConfig] = []
        # (replicated?, dim) -> (quotient configs, remainder configs)
        row_cfgs: Dict[Tuple[bool, int], Tuple[List[EmbeddingConfig], List[EmbeddingConfig]]] = {}
        projections: Dict[str, nn.Module] = {}
        #: physical feature -> (logical feature, buckets m, 0 = id / 1 = quotient / 2 = remainder, physical table)
        self._source: Dict[str, Tuple[str, int, int, str]] = {}
        for t in tables:
            spec = self._specs[t.name]
            spec.check_table(t.name, t.num_embeddings, t.embedding_dim)
            m = qr_buckets(t.num_embeddings, spec.buckets) if spec.kind == "qr" else 1
            for part in physical_tables(t.num_embeddings, t.embedding_dim, spec):
                kw = _physical_kwargs(t, part.suffix, part.rows, part.dim)
                op = {QR_QUOTIENT_SUFFIX: 1, QR_REMAINDER_SUFFIX: 2}.get(part.suffix, 0)
                for f in t.feature_names:
                    self._source[f + part.suffix] = (f, m, op, t.name + part.suffix)
                if self._is_mult(t.name):
                    q_list, r_list = row_cfgs.setdefault((t.name in self._data_parallel, part.dim), ([], []))
                    if op == 1:
                        q_list.append(EmbeddingConfig(**kw))
                    else:
                        r_list.append(EmbeddingConfig(**_mult_remainder_init(kw)))
                else:
                    # SUM here, mean applied after combining (FBGEMM has no weighted mean on CPU)
                    bag_cfgs.append(EmbeddingBagConfig(pooling=PoolingType.SUM, **kw))
            if spec.kind == "block":
                projections[t.name] = nn.Linear(int(spec.block_dim), t.embedding_dim, bias=False, device=device)
        groups = sorted(row_cfgs.items())
        self.bags = EmbeddingBagCollection(bag_cfgs, is_weighted=is_weighted, device=device) if bag_cfgs else None
        self.rows = nn.ModuleDict(
            {f"d{d}": EmbeddingCollection(q + r, device=device) for (rep, d), (q, r) in groups if not rep})
        replicated = [c for (rep, _), (q, r) in groups if rep for c in q + r]
        self.replicated = nn.ModuleDict({"embeddings": nn.ModuleDict(
            {c.name: ReplicatedRows(c, device=device) for c in replicated})}) if replicated else None
        self.projections = nn.ModuleDict(projections)
        self._bag_keys = [f for c in bag_cfgs for f in c.feature_names]
        #: (replicated?, dim, physical features: quotient ones then the remainder ones, same feature order)
        self._row_groups = [(rep, d, [f for c in q + r for f in c.feature_names]) for (rep, d), (q, r) in groups]
        self._physical_keys = self._bag_keys + [f for _, _, keys in self._row_groups for f in keys]
        self._segments = [len(self._bag_keys)] + [len(keys) for _, _, keys in self._row_groups]
        self._features = features
        self._table_of = {f: t for t in tables for f in t.feature_names}
        logger.debug("compressed EBC: %d pooled tables, %d row groups (%d replicated tables), %d projections",
                     len(bag_cfgs), len(groups), len(replicated), len(projections))

    def _is_mult(self, table: str) -> bool:
        return self._specs[table].kind == "qr" and self._specs[table].combine == "mult"

    @property
    def is_weighted(self) -> bool:
        return self._is_weighted

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        """The logical tables (as an ``EmbeddingBagCollection`` would report them)."""
        return list(self._tables)

    def table_parameters(self) -> List[nn.Parameter]:
        """Parameters of the TorchRec tables (``bags``, ``rows``): give these the fused optimizer, before DMP."""
        return [p for m in (self.bags, self.rows) if m is not None for p in m.parameters()]

    def compression(self) -> Dict[str, CompressionSpec]:
        """Table name -> its :class:`CompressionSpec` (``none`` for plain tables)."""
        return dict(self._specs)

    def physical_table_names(self, table: str) -> List[str]:
        """The names a sharding plan uses for ``table``'s stored tables (``t``, ``t__q``/``t__r`` or ``t__block``)."""
        t = next(c for c in self._tables if c.name == table)
        return [table + p.suffix for p in physical_tables(t.num_embeddings, t.embedding_dim, self._specs[table])]

    def parameter_constraints(
        self,
        sharding_types: Union[str, Mapping[str, str]],
        compute_kernels: Optional[Mapping[str, str]] = None,
        pooling_factors: Optional[Mapping[str, float]] = None,
        min_partition: Optional[int] = None,
    ) -> Dict[str, "ParameterConstraints"]:
        """TorchRec ``ParameterConstraints`` of every physical table from its logical table's placement.

        ``sharding_types`` is one type for all tables or table name -> type
        (tables not named stay unconstrained). A compressed table's physical
        tables take its type (:data:`POOLED_COMPRESSED_PLACEMENTS`, QR mult :data:`COMPRESSED_PLACEMENTS`), plain
        tables any TorchRec type; the kernel is ``dense`` for data_parallel,
        else ``compute_kernels[table]`` or ``fused``. QR-mult tables built
        ``data_parallel`` are not TorchRec tables and get no constraint.
        ``pooling_factors`` (table -> mean ids per bag) feed the estimator.
        Feed the result to ``EmbeddingShardingPlanner(topology, constraints=...)``.
        Raises :class:`ConfigError` for a type the module cannot hold.
        """
        from torchrec.distributed.planner.types import ParameterConstraints

        kernels = compute_kernels or {}
        pooling = pooling_factors or {}
        out: Dict[str, ParameterConstraints] = {}
        for t in self._tables:
            kind = sharding_types if isinstance(sharding_types, str) else sharding_types.get(t.name)
            spec = self._specs[t.name]
            if kind is None:
                continue
            allowed = COMPRESSED_PLACEMENTS if self._is_mult(t.name) else POOLED_COMPRESSED_PLACEMENTS
            if spec.compressed and kind not in allowed:
                raise ConfigError(f"Sharding type {kind!r} is not supported for compressed table {t.name!r} "
                                  f"({spec.kind}); use one of {allowed}.", category="invalid_option")
            if self._is_mult(t.name) and (kind == "data_parallel") != (t.name in self._data_parallel):
                raise ConfigError(
                    f"QR-mult table {t.name!r} is placed {kind} but the module was built with data_parallel="
                    f"{sorted(self._data_parallel)}; build it with the plan (compressed_from_placements).",
                    category="invalid_option")
            if t.name in self._data_parallel and self._is_mult(t.name):
                continue
            kernel = "dense" if kind == "data_parallel" else kernels.get(t.name) or "fused"
            extra = {"pooling_factors": [float(pooling[t.name])]} if t.name in pooling else {}
            for name in self.physical_table_names(t.name):
                out[name] = ParameterConstraints(sharding_types=[kind], compute_kernels=[kernel],
                                                 min_partition=min_partition, **extra)
        return out

    # -- forward --

    def physical_features(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Physical features: plain/block ids as they are, QR ids as ``i // m`` and ``i % m``; keys: the ``bags``
        features, then per row group its quotient then its remainder features (split by ``_segments``)."""
        if features.keys() != self._features:
            raise DataError(f"CompressedEmbeddingBagCollection got features {features.keys()} but expects "
                            f"{self._features} (the tables' feature names, in table order).", category="invalid_input")
        per_key = dict(zip(features.keys(), features.values().split(features.length_per_key())))
        lengths = dict(zip(features.keys(), features.lengths().view(len(features.keys()), -1)))
        w = features.weights_or_none() if self._is_weighted else None
        weights = dict(zip(features.keys(), w.split(features.length_per_key()))) if w is not None else None
        values = []
        for key in self._physical_keys:
            f, m, op, _ = self._source[key]
            v = per_key[f]
            values.append(v if op == 0 else torch.div(v, m, rounding_mode="floor") if op == 1 else v % m)
        return KeyedJaggedTensor(
            keys=self._physical_keys, values=torch.cat(values),
            lengths=torch.cat([lengths[self._source[k][0]] for k in self._physical_keys]),
            weights=torch.cat([weights[self._source[k][0]] for k in self._physical_keys]) if weights else None,
            stride=features.stride(),
        )

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        batch = features.stride()
        parts = self.physical_features(features).split(self._segments)
        pooled: Dict[str, torch.Tensor] = {}
        if self.bags is not None:
            pooled.update(self.bags(parts[0]).to_dict())
        for (replicated, dim, keys), part in zip(self._row_groups, parts[1:]):
            if replicated:
                tables = self.replicated["embeddings"]
                ids = part.values().split(part.length_per_key())
                rows = [tables[self._source[k][3]](v) for k, v in zip(keys, ids)]
            else:
                # EmbeddingCollection carries no per-id weights: look rows up unweighted, weigh in _pool_products.
                jts = self.rows[f"d{dim}"](KeyedJaggedTensor(keys=keys, values=part.values(), lengths=part.lengths()))
                rows = [jts[k].values() for k in keys]
            pooled.update(self._pool_products(rows, part, keys, batch, dim))
        out: Dict[str, torch.Tensor] = {}
        counts = dict(zip(features.keys(), features.lengths().view(len(self._features), batch)))
        for f in self._features:
            t = self._table_of[f]
            spec = self._specs[t.name]
            if spec.kind == "block":
                out[f] = self.projections[t.name](pooled[f + BLOCK_SUFFIX])
            elif spec.kind == "qr" and spec.combine == "concat":
                out[f] = torch.cat([pooled[f + QR_QUOTIENT_SUFFIX], pooled[f + QR_REMAINDER_SUFFIX]], dim=1)
            elif spec.kind == "qr" and spec.combine == "add":
                out[f] = pooled[f + QR_QUOTIENT_SUFFIX] + pooled[f + QR_REMAINDER_SUFFIX]
            else:  # plain, or QR mult (already combined and pooled by _pool_products)
                out[f] = pooled[f]
            if t.pooling == PoolingType.MEAN:
                out[f] = out[f] / counts[f].clamp(min=1).unsqueeze(1).to(out[f].dtype)
        return KeyedTensor(keys=list(self._features), length_per_key=[self._table_of[f].embedding_dim
                                                                      for f in self._features],
                           values=torch.cat([out[f] for f in self._features], dim=1), key_dim=1)

    def _pool_products(self, rows: List[torch.Tensor], part: KeyedJaggedTensor, keys: List[str], batch: int,
                       dim: int) -> Dict[str, torch.Tensor]:
        """QR-mult features of one row group: ``Σ_i w_i Q[i//m] ⊙ R[i%m]`` per bag, all features at once."""
        n = len(keys) // 2  # quotient keys, then the remainder keys of the same features in the same order
        emb = torch.cat(rows[:n]) * torch.cat(rows[n:])
        w = part.weights_or_none()
        if w is not None:
            emb = emb * w[: emb.shape[0]].unsqueeze(1).to(emb.dtype)
        bag = torch.repeat_interleave(torch.arange(n * batch, device=emb.device), part.lengths()[: n * batch])
        sums = torch.zeros(n * batch, dim, dtype=emb.dtype, device=emb.device).index_add(0, bag, emb)
        sums = sums.view(n, batch, dim)
        return {self._source[key][0]: sums[i] for i, key in enumerate(keys[:n])}


def compressed_from_placements(
    tables: Sequence[EmbeddingBagConfig],
    compression: Mapping[str, CompressionSpec],
    placements: Mapping[str, object],
    is_weighted: bool = False,
    device: Optional[torch.device] = None,
    min_partition: Optional[int] = None,
) -> Tuple[CompressedEmbeddingBagCollection, Dict[str, "ParameterConstraints"]]:
    """Module + planner constraints from per-table sharding types (str or ``ShardingType``/``Placement`` enum).

    Tables absent from ``placements`` stay unconstrained (QR-mult ones then
    must not be planned data-parallel).
    """
    types = {name: str(getattr(p, "value", p)) for name, p in placements.items()}
    dp = [name for name, kind in types.items() if kind == "data_parallel"]
    module = CompressedEmbeddingBagCollection(tables, compression, is_weighted=is_weighted, device=device,
                                              data_parallel=dp)
    return module, module.parameter_constraints(types, min_partition=min_partition)


# ---- REFERENCE ---- #


class CompressedReference(nn.Module):
    """The same maths unsharded, per id: ``pooled(b) = Σ_{i∈b} w_i · row(i)`` (÷ count for mean).

    ``row(i)`` is ``E[i]`` (plain), ``combine(Q[i//m], R[i%m])`` (QR) or
    ``T[i] P`` (block, projected per row: the module projects pooled sums).
    Parameters: ``tables.{physical name}`` (``nn.Embedding``) and
    ``projections.{table}`` (``nn.Linear``); :meth:`load_from` copies an
    unsharded :class:`CompressedEmbeddingBagCollection`'s weights.
    """

    def __init__(self, tables: Sequence[EmbeddingBagConfig], compression: Mapping[str, CompressionSpec],
                 is_weighted: bool = False) -> None:
        super().__init__()
        self._tables = list(tables)
        self._is_weighted = is_weighted
        self._specs = {t.name: compression.get(t.name, _NONE) for t in tables}
        self.tables = nn.ModuleDict({
            t.name + p.suffix: nn.Embedding(p.rows, p.dim)
            for t in tables for p in physical_tables(t.num_embeddings, t.embedding_dim, self._specs[t.name])})
        self.projections = nn.ModuleDict({
            t.name: nn.Linear(int(self._specs[t.name].block_dim), t.embedding_dim, bias=False)
            for t in tables if self._specs[t.name].kind == "block"})

    def load_from(self, state: Mapping[str, torch.Tensor]) -> None:
        """Loads the (unsharded) state dict of a :class:`CompressedEmbeddingBagCollection` of the same tables."""
        mine = {}
        for key, value in state.items():
            parts = key.split(".")
            if "projections" in parts:
                mine[".".join(parts[parts.index("projections"):])] = value
            elif "embedding_bags" in parts or "embeddings" in parts:
                mine[f"tables.{parts[-2]}.weight"] = value
        self.load_state_dict(mine, strict=True)

    def row(self, table: EmbeddingBagConfig, ids: torch.Tensor) -> torch.Tensor:
        """The embedding of each id of ``table``: ``[len(ids), D]``."""
        spec = self._specs[table.name]
        if spec.kind == "qr":
            m = qr_buckets(table.num_embeddings, spec.buckets)
            q = self.tables[table.name + QR_QUOTIENT_SUFFIX](torch.div(ids, m, rounding_mode="floor"))
            r = self.tables[table.name + QR_REMAINDER_SUFFIX](ids % m)
            return q * r if spec.combine == "mult" else q + r if spec.combine == "add" else torch.cat([q, r], 1)
        if spec.kind == "block":
            return self.projections[table.name](self.tables[table.name + BLOCK_SUFFIX](ids))
        return self.tables[table.name](ids)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        batch = features.stride()
        by_key = features.to_dict()
        outs = []
        for t in self._tables:
            for f in t.feature_names:
                jt = by_key[f]
                emb = self.row(t, jt.values())
                if self._is_weighted:
                    emb = emb * jt.weights().unsqueeze(1)
                lengths = jt.lengths()
                bag = torch.repeat_interleave(torch.arange(batch, device=emb.device), lengths)
                pooled = torch.zeros(batch, t.embedding_dim, dtype=emb.dtype, device=emb.device).index_add(0, bag, emb)
                if t.pooling == PoolingType.MEAN:
                    pooled = pooled / lengths.clamp(min=1).unsqueeze(1).to(pooled.dtype)
                outs.append(pooled)
        return KeyedTensor(keys=[f for t in self._tables for f in t.feature_names], key_dim=1,
                           length_per_key=[t.embedding_dim for t in self._tables for _ in t.feature_names],
                           values=torch.cat(outs, dim=1))


__all__ = [
    "COMPRESSED_PLACEMENTS", "POOLED_COMPRESSED_PLACEMENTS", "CompressedEmbeddingBagCollection",
    "CompressedReference", "CompressionSpec", "ReplicatedRows", "compressed_from_placements",
]
