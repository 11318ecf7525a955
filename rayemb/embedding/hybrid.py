"""Hybrid embedding: hot rows replicated (data-parallel), cold rows sharded with per-id exchange.

Why: with pooled model-parallel sharding (TorchRec TW/RW/CW on an
``EmbeddingBagCollection``) every bag's pooled vector crosses the wire, B·D
values per table and step whatever share of lookups hits a few frequent ids.
Here each hybrid table is split in two row sets:

* the hot set F (frequent ids) lives in an ``EmbeddingBagCollection`` sharded
  ``data_parallel``: every rank holds all |F| rows, pools its hot ids locally,
  and the gradient is all-reduced (|F|·D values per step);
* the cold rows (V-|F|) live in an ``EmbeddingCollection`` (sequence, not
  pooled) sharded row-, table- or column-wise: the all-to-all moves one row
  per cold id, (1-h)·B·P rows where h is the hot share of lookups, and the
  bag is pooled locally: ``pooled(b) = Σ_{hot i∈b} w_i·H[i] + Σ_{cold i∈b} w_i·C[i]``,
  divided by the bag length for mean pooling.

This is HugeCTR's hybrid embedding (frequent categories data-parallel,
infrequent model-parallel; NVIDIA HugeCTR ``hybrid_embedding``, MLPerf DLRM
v1.0) generalised to multi-hot bags, per-id weights, mean pooling and any
TorchRec optimizer, built from stock TorchRec modules so
``DistributedModelParallel`` shards them with stock sharders and fused
FBGEMM optimizers. Tables without a hot set stay in an ordinary
``EmbeddingBagCollection`` in the same module, sharded by the plan; raw-id
tables (``ids: raw``) live in a managed-collision EBC, sharded row-wise
(:mod:`rayemb.embedding.raw_tables`); a hybrid raw-id table keeps its hot
ids (raw values) in fixed replicated rows of the hot child, never evicted,
and the managed-collision table holds the rest of its capacity.

Ids are remapped hot/cold in the data path by
:class:`~rayemb.embedding.remap.HybridRemapper` (vectorised numpy, picklable),
so the training step never loops over rows. The module states its own
planner constraints (:meth:`HybridEmbeddingBagCollection.parameter_constraints`)
and the state-dict keys of its halves
(:meth:`HybridEmbeddingBagCollection.split_state_dict`); the bytes it moves
are predicted by :mod:`rayemb.planner.traffic`.

Example::

    >>> tables = [EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=100,
    ...                              feature_names=["f0"])]
    >>> ebc = HybridEmbeddingBagCollection(tables, hot_ids={"t0": np.array([3, 7])})
    >>> kjt = KeyedJaggedTensor.from_lengths_sync(
    ...     keys=["f0"], values=torch.tensor([3, 50, 7]), lengths=torch.tensor([2, 1]))
    >>> ebc(ebc.remapper.remap(kjt)).values().shape
    torch.Size([2, 8])
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from rayemb.embedding.compressed import CompressedEmbeddingBagCollection
from rayemb.embedding.compression_math import CompressionSpec, refuse_low_precision
from rayemb.embedding.prefetch import InputDistPrefetch
from rayemb.embedding.raw_tables import raw_id_collection
from rayemb.embedding.remap import COLD_SUFFIX, HOT_SUFFIX, HybridRemapper
from rayemb.errors import ConfigError, DataError
from rayemb.placements import HYBRID_COLD_PLACEMENTS

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import ParameterConstraints

logger = logging.getLogger(__name__)

#: TorchRec EmbeddingCollection sharding types usable for cold halves on CPU and GPU
COLD_SHARDING_TYPES = tuple(p.value for p in HYBRID_COLD_PLACEMENTS)


# ---- MODULE ---- #


def _plain_module(configs: Sequence[EmbeddingBagConfig], compression: Mapping[str, CompressionSpec],
                  is_weighted: bool, device: Optional[torch.device], data_parallel: Sequence[str]
                  ) -> Optional[nn.Module]:
    """The ``plain`` child: an ``EmbeddingBagCollection``, or a compressed one when a table is compressed."""
    if not configs:
        return None
    names = {c.name for c in configs}
    if not compression:
        return EmbeddingBagCollection(list(configs), is_weighted=is_weighted, device=device)
    return CompressedEmbeddingBagCollection(configs, compression, is_weighted=is_weighted, device=device,
                                            data_parallel=[n for n in data_parallel if n in names])


def _sub_config(t: EmbeddingBagConfig, suffix: str, rows: int) -> Dict[str, object]:
    # Keep the logical table's init range: TorchRec's default, uniform(±sqrt(1/V)),
    # would otherwise follow the half's row count and inflate small hot halves.
    return dict(
        weight_init_max=t.get_weight_init_max(),
        weight_init_min=t.get_weight_init_min(),
        name=t.name + suffix,
        embedding_dim=t.embedding_dim,
        num_embeddings=rows,
        feature_names=[f + suffix for f in t.feature_names],
        data_type=t.data_type,
        init_fn=t.init_fn,
    )


class HybridEmbeddingBagCollection(nn.Module):
    """Drop-in for ``EmbeddingBagCollection`` whose hybrid tables split rows hot/cold.

    Children (each sharded by ``DistributedModelParallel`` with stock sharders):

    * ``plain``: ``EmbeddingBagCollection`` of tables without a hot set (any plan), or a
      :class:`~rayemb.embedding.compressed.CompressedEmbeddingBagCollection` when
      ``compression`` names a table (QR / block; never hybrid);
    * ``hot``: ``EmbeddingBagCollection`` of hot rows, SUM pooling (mean is
      applied after merging with the cold half); shard it ``data_parallel``;
    * ``cold``: ``ModuleDict`` ``d{dim}`` -> ``EmbeddingCollection`` of cold rows;
      shard it ``row_wise`` / ``table_wise`` / ``column_wise``;
    * ``raw``: the raw-id tables (``raw``: their schema features), a managed-collision
      EBC looked up by raw int64 ids; shard it ``row_wise`` (its sharder's only type).
      A raw-id table with hot ids (raw values) has its hot half in ``hot`` and
      the rest of its capacity, ``num_embeddings - |F|`` slots, here.

    A table whose hot set is empty has no hot half and one covering all ids
    has no cold half. ``forward`` takes the KJT made by :attr:`remapper` and
    returns a ``KeyedTensor`` with the keys and ``length_per_key`` an
    ``EmbeddingBagCollection(tables)`` would return. Weighted features
    (``is_weighted=True``) multiply each id's row by its weight before
    pooling; mean pooling divides by the bag's id count (FBGEMM's convention).

    Args:
        tables: the logical tables, as for ``EmbeddingBagCollection``.
        hot_ids: table name -> hot ids (np.int64). Tables absent (or None) are plain.
        is_weighted: whether features carry per-id weights.
        device: where to allocate (``torch.device("meta")`` for planning only).
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        hot_ids: Mapping[str, Optional[np.ndarray]],
        is_weighted: bool = False,
        device: Optional[torch.device] = None,
        compression: Optional[Mapping[str, CompressionSpec]] = None,
        data_parallel: Sequence[str] = (),
        raw: Sequence[Any] = (),
    ) -> None:
        super().__init__()
        self._tables = list(tables)
        self._is_weighted = is_weighted
        self._raw_tables = {f.name for f in raw}
        self.remapper = HybridRemapper(tables, hot_ids, raw=sorted(self._raw_tables))
        r = self.remapper
        hybrid = set(r.hybrid_tables())
        self._compression = {n: s for n, s in (compression or {}).items() if s.compressed}
        both = sorted(hybrid & set(self._compression))
        if both:
            raise ConfigError(
                f"Tables {both} are both hybrid and compressed; a compressed table has no hot/cold split. Drop "
                "the hybrid pin or the compression pin (planner.tables.<T>).", category="invalid_option")
        refuse_low_precision({t.name: t.data_type.value for t in tables if t.name in self._compression})
        plain_cfgs = [t for t in tables if t.name not in hybrid and t.name not in self._raw_tables]
        hot_cfgs: List[EmbeddingBagConfig] = []
        cold_cfgs: Dict[int, List[EmbeddingConfig]] = {}
        for t in tables:
            if t.name not in hybrid:
                continue
            if r.num_hot(t.name):
                hot_cfgs.append(EmbeddingBagConfig(pooling=PoolingType.SUM, **_sub_config(t, HOT_SUFFIX, r.num_hot(t.name))))
            if r.num_cold(t.name) and not r.is_raw(t.name):
                cold_cfgs.setdefault(int(t.embedding_dim), []).append(
                    EmbeddingConfig(**_sub_config(t, COLD_SUFFIX, r.num_cold(t.name)))
                )
        self.plain = _plain_module(plain_cfgs, self._compression, is_weighted, device, data_parallel)
        self.hot = EmbeddingBagCollection(hot_cfgs, is_weighted=is_weighted, device=device) if hot_cfgs else None
        self.cold = nn.ModuleDict(
            {f"d{d}": EmbeddingCollection(cold_cfgs[d], device=device) for d in r.cold_dims}
        )
        self.raw = raw_id_collection(tables, raw, self._compression, device, hot_rows={
            n: r.num_hot(n) for n in hybrid & self._raw_tables}) if raw else None
        self._mean_features = {  # raw-id tables pool by sum, hot half and managed half alike
            f for t in tables if t.name in hybrid - self._raw_tables and t.pooling == PoolingType.MEAN
            for f in t.feature_names
        }
        self._dims = {f: int(t.embedding_dim) for t in tables for f in t.feature_names}
        #: the next batch's input exchange of the sharded children (rayemb.embedding.prefetch); not state
        self.prefetch = InputDistPrefetch()
        logger.debug(
            "hybrid EBC: %d plain, %d hot, %d cold tables", len(plain_cfgs), len(hot_cfgs),
            sum(len(v) for v in cold_cfgs.values()),
        )

    @property
    def is_weighted(self) -> bool:
        return self._is_weighted

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        """The logical tables (as an ``EmbeddingBagCollection`` would report them)."""
        return list(self._tables)

    def compression(self) -> Dict[str, CompressionSpec]:
        """Compressed table -> its :class:`CompressionSpec` (plain and hybrid tables are absent)."""
        return dict(self._compression)

    def table_parameters(self) -> List[nn.Parameter]:
        """Parameters of the TorchRec tables: give these TorchRec's fused optimizer (before DMP).

        Everything else (block projections, data-parallel QR-mult rows) is a
        dense parameter: replicated, DDP-averaged and stepped by a regular
        optimizer (``rayemb.embedding.data_parallel.replicated_embedding_parameters`` finds the rows).
        """
        plain = self.plain
        own = plain.table_parameters() if isinstance(plain, CompressedEmbeddingBagCollection) else (
            list(plain.parameters()) if plain is not None else [])
        return own + [p for m in (self.hot, self.cold, self.raw) if m is not None for p in m.parameters()]

    # -- what the planner and checkpoints need to know about the halves --

    def split_state_dict(self, weights: Mapping[str, torch.Tensor], prefix: str = "") -> Dict[str, torch.Tensor]:
        """State-dict entries of this module holding the full logical tables ``weights`` (name -> ``[V, D]``).

        Hybrid tables are split into their hot and cold halves
        (:meth:`HybridRemapper.split_weight`; an empty half has no entry),
        plain tables pass whole. ``prefix`` is this module's path in a parent
        (e.g. ``"sparse."``). The inverse direction is
        :meth:`HybridRemapper.merge_weight`. Compressed tables take their
        physical tables' weights (``weights["t__q"]``, ...).
        """
        r = self.remapper
        out: Dict[str, torch.Tensor] = {}
        if isinstance(self.plain, CompressedEmbeddingBagCollection):
            # physical tables (t, t__q, t__r, t__block) under their own names; projections are not tables
            keys = {k.split(".")[-2]: k for k in self.plain.state_dict() if k.endswith(".weight")
                    and not k.startswith("projections.")}
            out.update({f"{prefix}plain.{keys[n]}": w for n, w in weights.items() if n in keys})
        for t in self._tables:
            if t.name in self._raw_tables:  # its state is the ids it holds, hot ones too (rayemb.checkpoint.raw_state)
                continue
            if t.name not in r.hybrid_tables():
                if not isinstance(self.plain, CompressedEmbeddingBagCollection):
                    out[f"{prefix}plain.embedding_bags.{t.name}.weight"] = weights[t.name]
                continue
            full = weights[t.name]
            hot, cold = r.split_weight(t.name, full)
            if r.num_hot(t.name):
                out[f"{prefix}hot.embedding_bags.{t.name}{HOT_SUFFIX}.weight"] = hot
            if r.num_cold(t.name):
                out[f"{prefix}cold.d{t.embedding_dim}.embeddings.{t.name}{COLD_SUFFIX}.weight"] = cold
        return out

    def parameter_constraints(
        self,
        cold_sharding_type: Union[str, Mapping[str, str]] = "row_wise",
        plain_sharding_types: Optional[Mapping[str, Sequence[str]]] = None,
        compute_kernels: Optional[Mapping[str, str]] = None,
        pooling_factors: Optional[Mapping[str, float]] = None,
        hot_shares: Optional[Mapping[str, float]] = None,
        min_partition: Optional[int] = None,
    ) -> Dict[str, "ParameterConstraints"]:
        """TorchRec ``ParameterConstraints`` of every half and plain table (the one place that knows them).

        * hot half: ``data_parallel``, ``dense`` kernel;
        * cold half: ``cold_sharding_type`` (one type, or table name -> type;
          default row_wise), kernel ``compute_kernels[table]`` or ``fused``,
          column shards at least ``min_partition`` wide;
        * plain table named in ``plain_sharding_types``: those types, ``dense``
          when only data_parallel, else ``compute_kernels[table]`` if given
          (TorchRec chooses otherwise); plain tables not named stay unconstrained.

        With ``pooling_factors`` (table -> mean ids per bag P) and
        ``hot_shares`` (table -> share h of lookups hitting the hot set) the
        estimator gets P·h for the hot half, P·(1-h) for the cold one, P for a
        plain table. Feed the result to ``EmbeddingShardingPlanner(topology, constraints=...)``.
        Raises :class:`ConfigError` for a cold type outside :data:`COLD_SHARDING_TYPES`.
        """
        from torchrec.distributed.planner.types import ParameterConstraints

        kernels = compute_kernels or {}
        pooling = pooling_factors or {}
        shares = hot_shares or {}

        def pooled(name: str, share: float) -> Dict[str, object]:
            return {"pooling_factors": [max(share * pooling[name], 1e-3)]} if name in pooling else {}

        out: Dict[str, ParameterConstraints] = {}
        r = self.remapper
        stored = {n: list(v)[0] for n, v in (plain_sharding_types or {}).items() if n in self._compression}
        if stored:  # compressed tables: their physical tables' constraints (one sharding type each)
            out.update(self.plain.parameter_constraints(stored, kernels, pooling, min_partition))
        for t in self._tables:
            name = t.name
            if name in self._compression:
                continue
            if name not in r.hybrid_tables():
                if plain_sharding_types and name in plain_sharding_types:
                    types = list(plain_sharding_types[name])
                    kernel = ["dense"] if types == ["data_parallel"] else [kernels[name]] if kernels.get(name) else None
                    out[name] = ParameterConstraints(sharding_types=types, compute_kernels=kernel, **pooled(name, 1.0))
                continue
            cold_type = cold_sharding_type if isinstance(cold_sharding_type, str) else cold_sharding_type.get(
                name, "row_wise")
            # every row hot: no cold half to shard (the planner reports the table data-parallel then)
            if cold_type not in COLD_SHARDING_TYPES and (r.num_cold(name) or r.is_raw(name)):
                raise ConfigError(
                    f"Sharding type {cold_type!r} is not supported for the cold half of hybrid table "
                    f"{name!r}; use one of {COLD_SHARDING_TYPES} (EmbeddingCollection shardings)."
                )
            h = shares.get(name, 0.0)
            if r.num_hot(name):
                out[name + HOT_SUFFIX] = ParameterConstraints(
                    sharding_types=["data_parallel"], compute_kernels=["dense"], **pooled(name, h))
            if r.num_cold(name) and not r.is_raw(name):  # a raw table's cold half: the managed-collision EBC's plan
                out[name + COLD_SUFFIX] = ParameterConstraints(
                    sharding_types=[cold_type], compute_kernels=[kernels.get(name) or "fused"],
                    min_partition=min_partition, **pooled(name, 1.0 - h))
        return out

    # -- forward --

    def _parts(self, features: KeyedJaggedTensor) -> List[KeyedJaggedTensor]:
        """``features`` (made by :attr:`remapper`) split into the plain, hot and per-dim cold parts."""
        keys = self.remapper.output_keys
        if features.keys() != keys:
            raise DataError(f"HybridEmbeddingBagCollection got features {features.keys()} but expects {keys}. "
                            "Pass the batch through module.remapper.remap(kjt) first.")
        return features.split(self.remapper.segments)

    def _child_inputs(self, parts: List[KeyedJaggedTensor]) -> List[Tuple[str, nn.Module, KeyedJaggedTensor]]:
        """(name, child, the KJT the child looks up) for every table child, in forward order."""
        out: List[Tuple[str, nn.Module, KeyedJaggedTensor]] = []
        if self.plain is not None:
            out.append(("plain", self.plain, parts[0]))
        if self.hot is not None:
            out.append(("hot", self.hot, parts[1]))
        for i, d in enumerate(self.remapper.cold_dims):
            part = parts[2 + i]
            # EmbeddingCollection carries no per-id weights: rows are looked up unweighted, weighted in forward
            ids = KeyedJaggedTensor(keys=part.keys(), values=part.values(), lengths=part.lengths())
            out.append((f"cold.d{d}", self.cold[f"d{d}"], ids))
        return out

    def sharded_inputs(self, features: KeyedJaggedTensor) -> List[Tuple[str, nn.Module, KeyedJaggedTensor]]:
        """What :meth:`forward` will give each table child for ``features``: for ``self.prefetch.start``."""
        return self._child_inputs(self._parts(features))

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        r = self.remapper
        batch = features.stride()
        parts = self._parts(features)
        inputs = {name: (child, kjt) for name, child, kjt in self._child_inputs(parts)}

        def lookup(name: str):  # the child's output; its input exchange may have been prefetched
            return self.prefetch.lookup(features, name, *inputs[name])
        pooled: Dict[str, torch.Tensor] = {}
        counts: Dict[str, torch.Tensor] = {}
        if self.plain is not None:
            pooled.update(lookup("plain").to_dict())
        if self.hot is not None:
            hot_kjt = parts[1]
            for key, t in lookup("hot").to_dict().items():
                f = key[: -len(HOT_SUFFIX)]
                pooled[f] = t
            for key, ln in zip(hot_kjt.keys(), hot_kjt.lengths().view(len(hot_kjt.keys()), -1)):
                counts[key[: -len(HOT_SUFFIX)]] = ln
        for i, d in enumerate(r.cold_dims):
            part = parts[2 + i]
            rows = lookup(f"cold.d{d}")  # unweighted rows; the weights are applied here, locally
            # pool every cold feature of this dim at once: the rows in KJT (key-major) order, one
            # index_add into a (keys x batch) bag grid
            keys = part.keys()
            emb = torch.cat([rows[key].values() for key in keys]) if len(keys) > 1 else rows[keys[0]].values()
            lengths = part.lengths()
            w = part.weights_or_none()
            if w is not None:
                emb = emb * w.unsqueeze(1).to(emb.dtype)
            bag = torch.repeat_interleave(torch.arange(len(keys) * batch, device=emb.device), lengths)
            sums = torch.zeros(len(keys) * batch, d, dtype=emb.dtype, device=emb.device).index_add(0, bag, emb)
            sums, lengths = sums.view(len(keys), batch, d), lengths.view(len(keys), batch)
            for i, key in enumerate(keys):
                f = key[: -len(COLD_SUFFIX)]
                pooled[f] = pooled[f] + sums[i] if f in pooled else sums[i]
                counts[f] = counts[f] + lengths[i] if f in counts else lengths[i]
        if self.raw is not None:  # the last segment: raw ids, mapped to slots inside the managed-collision EBC
            for f, t in self.raw(parts[-1])[0].to_dict().items():  # a hybrid raw table's hot ids pooled above
                pooled[f] = pooled[f] + t if f in pooled else t
        for f in self._mean_features:
            pooled[f] = pooled[f] / counts[f].clamp(min=1).unsqueeze(1).to(pooled[f].dtype)
        keys = r.input_features
        return KeyedTensor(
            keys=keys,
            length_per_key=[self._dims[f] for f in keys],
            values=torch.cat([pooled[f] for f in keys], dim=1),
            key_dim=1,
        )


__all__ = ["COLD_SHARDING_TYPES", "COLD_SUFFIX", "HOT_SUFFIX", "HybridEmbeddingBagCollection", "HybridRemapper"]
