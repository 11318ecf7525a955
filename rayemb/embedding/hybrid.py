"""Hybrid embedding: hot rows replicated (data-parallel), cold rows sharded with per-id exchange.

Why (DESIGN §4): with pooled model-parallel sharding (TorchRec TW/RW/CW on an
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
``EmbeddingBagCollection`` in the same module, sharded by the plan.

Ids are remapped hot/cold in the data path by :class:`HybridRemapper`
(vectorised numpy, picklable), so the training step never loops over rows.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from rayemb.errors import ConfigError, DataError

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import ParameterConstraints

logger = logging.getLogger(__name__)

#: suffix of the replicated hot-row table / feature made from a hybrid table
HOT_SUFFIX = "__hot"
#: suffix of the sharded cold-row table / feature made from a hybrid table
COLD_SUFFIX = "__cold"

#: placements the byte predictor knows
PLACEMENTS = ("data_parallel", "table_wise", "row_wise", "column_wise", "hybrid")


# ---- REMAP (data path) ---- #


@dataclass(frozen=True)
class _HybridTable:
    """One hybrid table: its config and sorted unique hot ids."""

    config: EmbeddingBagConfig
    hot_ids: np.ndarray  # int64, sorted, unique, in [0, num_embeddings)

    @property
    def num_hot(self) -> int:
        return int(self.hot_ids.size)

    @property
    def num_cold(self) -> int:
        return int(self.config.num_embeddings) - self.num_hot


def _validate_hot_ids(config: EmbeddingBagConfig, ids: np.ndarray) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ConfigError(
            f"Hot ids of table {config.name!r} must be a 1-D integer array; got shape "
            f"{arr.shape} dtype {arr.dtype}. Pass the table's frequent ids as np.int64."
        )
    arr = np.unique(arr.astype(np.int64, copy=False))
    if arr.size and (arr[0] < 0 or arr[-1] >= config.num_embeddings):
        raise ConfigError(
            f"Hot ids of table {config.name!r} must lie in [0, {config.num_embeddings}); "
            f"got range [{arr[0]}, {arr[-1]}]. Recompute the split from statistics of "
            "this dataset or fix the table's num_embeddings."
        )
    return arr


class HybridRemapper:
    """Turns a batch's KeyedJaggedTensor into the one a :class:`HybridEmbeddingBagCollection` consumes.

    For a hybrid table with sorted hot ids H (|H| = n) an id v maps by binary
    search, no V-sized array: ``p = searchsorted(H, v)``; v is hot iff
    ``p < n and H[p] == v``, then its hot row is p; otherwise its cold row is
    ``v - p`` (the number of cold ids below v). Each bag keeps its hot ids in
    feature ``f__hot`` and its cold ids in ``f__cold`` (order within the bag
    preserved, lengths counted per bag), so both halves pool back into the
    same bag. Features of non-hybrid tables pass through unchanged.

    Output key order: plain features, hot features, then cold features grouped
    by embedding dim (the module splits by these segment sizes). Picklable
    and torch-free in its state (numpy arrays), so it can run in a Ray Data
    ``map_batches`` or the worker's batch conversion.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        hot_ids: Mapping[str, Optional[np.ndarray]],
    ) -> None:
        names = [t.name for t in tables]
        unknown = sorted(set(hot_ids) - set(names))
        if unknown:
            raise ConfigError(
                f"Hot ids were given for tables {unknown} that are not among the "
                f"embedding tables {names}. Use the table names of the job's schema."
            )
        self._num_embeddings: Dict[str, int] = {}
        self._feature_table: Dict[str, str] = {}
        self._hybrid: Dict[str, _HybridTable] = {}
        self.plain_features: List[str] = []
        self.hot_features: List[str] = []
        cold_by_dim: Dict[int, List[str]] = {}
        for t in tables:
            self._num_embeddings[t.name] = int(t.num_embeddings)
            for f in t.feature_names:
                self._feature_table[f] = t.name
            ids = hot_ids.get(t.name)
            if ids is None:
                self.plain_features += list(t.feature_names)
                continue
            ht = _HybridTable(t, _validate_hot_ids(t, ids))
            self._hybrid[t.name] = ht
            if ht.num_hot > 0:
                self.hot_features += [f + HOT_SUFFIX for f in t.feature_names]
            if ht.num_cold > 0:
                cold_by_dim.setdefault(int(t.embedding_dim), []).extend(
                    f + COLD_SUFFIX for f in t.feature_names
                )
        #: cold dims in output order; one EmbeddingCollection per dim (TorchRec requires one dim per EC)
        self.cold_dims: List[int] = sorted(cold_by_dim)
        self.cold_features_by_dim: Dict[int, List[str]] = {d: cold_by_dim[d] for d in self.cold_dims}
        self.cold_features: List[str] = [f for d in self.cold_dims for f in cold_by_dim[d]]
        self.input_features: List[str] = [f for t in tables for f in t.feature_names]

    # -- introspection --

    @property
    def output_keys(self) -> List[str]:
        """Keys of the remapped KJT, in order."""
        return self.plain_features + self.hot_features + self.cold_features

    @property
    def segments(self) -> List[int]:
        """Key counts of the remapped KJT's consecutive segments: plain, hot, one per cold dim."""
        return [len(self.plain_features), len(self.hot_features)] + [
            len(self.cold_features_by_dim[d]) for d in self.cold_dims
        ]

    def hybrid_tables(self) -> List[str]:
        return list(self._hybrid)

    def hot_ids(self, table: str) -> np.ndarray:
        """Sorted hot ids of a hybrid table (hot row k holds id ``hot_ids[k]``)."""
        return self._hybrid[table].hot_ids

    def cold_ids(self, table: str) -> np.ndarray:
        """Sorted cold ids of a hybrid table (cold row j holds id ``cold_ids[j]``); V-sized."""
        ht = self._hybrid[table]
        mask = np.ones(ht.config.num_embeddings, dtype=bool)
        mask[ht.hot_ids] = False
        return np.flatnonzero(mask).astype(np.int64)

    def hot_share(self, table: str, ids: np.ndarray) -> float:
        """Share h of the given lookups (ids of ``table``) that hit the hot set."""
        hot = self._hybrid[table].hot_ids
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0 or hot.size == 0:
            return 0.0
        p = np.searchsorted(hot, ids)
        return float(np.mean(hot[np.minimum(p, hot.size - 1)] == ids))

    # -- remap --

    def remap_arrays(
        self,
        features: Mapping[str, Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]],
    ) -> Dict[str, Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]]:
        """Remap per-feature ``(values, lengths, weights|None)`` numpy arrays.

        Returns the same structure keyed by :attr:`output_keys`. Raises
        :class:`DataError` for an id outside ``[0, num_embeddings)``.
        """
        out: Dict[str, Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]] = {}
        for f in self.input_features:
            if f not in features:
                raise DataError(
                    f"Batch has no feature {f!r}; the embedding expects {self.input_features}. "
                    "Check that the dataset schema matches the job's tables."
                )
            values, lengths, weights = features[f]
            values = np.asarray(values, dtype=np.int64)
            lengths = np.asarray(lengths, dtype=np.int64)
            table = self._feature_table[f]
            if values.size and (values.min() < 0 or values.max() >= self._num_embeddings[table]):
                raise DataError(
                    f"Feature {f!r} has ids in [{values.min()}, {values.max()}] but table "
                    f"{table!r} has {self._num_embeddings[table]} rows. Hash or clip ids "
                    "into range when writing the dataset, or raise num_embeddings."
                )
            ht = self._hybrid.get(table)
            if ht is None:
                out[f] = (values, lengths, weights)
                continue
            hot = ht.hot_ids
            pos = np.searchsorted(hot, values)
            if hot.size:
                is_hot = hot[np.minimum(pos, hot.size - 1)] == values
            else:
                is_hot = np.zeros(values.shape, dtype=bool)
            bag = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
            w = None if weights is None else np.asarray(weights, dtype=np.float32)
            if ht.num_hot > 0:
                out[f + HOT_SUFFIX] = (
                    pos[is_hot],
                    np.bincount(bag[is_hot], minlength=lengths.size).astype(np.int64),
                    None if w is None else w[is_hot],
                )
            if ht.num_cold > 0:
                cold = ~is_hot
                out[f + COLD_SUFFIX] = (
                    values[cold] - pos[cold],
                    np.bincount(bag[cold], minlength=lengths.size).astype(np.int64),
                    None if w is None else w[cold],
                )
        return out

    def remap(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Remap a batch KJT (keys: the tables' feature names) to the hybrid module's KJT."""
        weights = kjt.weights_or_none()
        per_feature: Dict[str, Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]] = {}
        for key, jt in kjt.to_dict().items():
            w = jt.weights_or_none()
            per_feature[key] = (
                jt.values().detach().cpu().numpy(),
                jt.lengths().detach().cpu().numpy(),
                None if w is None else w.detach().cpu().numpy(),
            )
        return self.to_kjt(self.remap_arrays(per_feature), weighted=weights is not None)

    def to_kjt(
        self,
        remapped: Mapping[str, Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]],
        weighted: bool,
    ) -> KeyedJaggedTensor:
        """Assemble :meth:`remap_arrays` output into one KJT in :attr:`output_keys` order."""
        keys = self.output_keys
        values = np.concatenate([remapped[k][0] for k in keys]) if keys else np.zeros(0, np.int64)
        lengths = np.concatenate([remapped[k][1] for k in keys]) if keys else np.zeros(0, np.int64)
        w = None
        if weighted:
            w = torch.from_numpy(
                np.concatenate(
                    [
                        remapped[k][2] if remapped[k][2] is not None else np.ones(remapped[k][0].size, np.float32)
                        for k in keys
                    ]
                ).astype(np.float32)
            )
        return KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.from_numpy(np.ascontiguousarray(values)),
            lengths=torch.from_numpy(np.ascontiguousarray(lengths)),
            weights=w,
        )

    # -- weights --

    def split_weight(self, table: str, weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Full table ``[V, D]`` -> (hot rows ``[|F|, D]``, cold rows ``[V-|F|, D]``)."""
        hot = torch.from_numpy(self.hot_ids(table))
        cold = torch.from_numpy(self.cold_ids(table))
        return weight[hot], weight[cold]

    def merge_weight(self, table: str, hot: torch.Tensor, cold: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`split_weight`: hot and cold rows back into one ``[V, D]`` table."""
        ht = self._hybrid[table]
        dim = hot.shape[1] if hot.numel() else cold.shape[1]
        full = torch.empty(ht.config.num_embeddings, dim, dtype=(hot if hot.numel() else cold).dtype)
        if ht.num_hot:
            full[torch.from_numpy(ht.hot_ids)] = hot
        if ht.num_cold:
            full[torch.from_numpy(self.cold_ids(table))] = cold
        return full


# ---- MODULE ---- #


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

    * ``plain``: ``EmbeddingBagCollection`` of tables without a hot set (any plan);
    * ``hot``: ``EmbeddingBagCollection`` of hot rows, SUM pooling (mean is
      applied after merging with the cold half); shard it ``data_parallel``;
    * ``cold``: ``ModuleDict`` ``d{dim}`` -> ``EmbeddingCollection`` of cold rows;
      shard it ``row_wise`` / ``table_wise`` / ``column_wise``.

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
    ) -> None:
        super().__init__()
        self._tables = list(tables)
        self._is_weighted = is_weighted
        self.remapper = HybridRemapper(tables, hot_ids)
        r = self.remapper
        hybrid = set(r.hybrid_tables())
        plain_cfgs = [t for t in tables if t.name not in hybrid]
        hot_cfgs: List[EmbeddingBagConfig] = []
        cold_cfgs: Dict[int, List[EmbeddingConfig]] = {}
        for t in tables:
            if t.name not in hybrid:
                continue
            ht = r._hybrid[t.name]
            if ht.num_hot:
                hot_cfgs.append(EmbeddingBagConfig(pooling=PoolingType.SUM, **_sub_config(t, HOT_SUFFIX, ht.num_hot)))
            if ht.num_cold:
                cold_cfgs.setdefault(int(t.embedding_dim), []).append(
                    EmbeddingConfig(**_sub_config(t, COLD_SUFFIX, ht.num_cold))
                )
        self.plain = EmbeddingBagCollection(plain_cfgs, is_weighted=is_weighted, device=device) if plain_cfgs else None
        self.hot = EmbeddingBagCollection(hot_cfgs, is_weighted=is_weighted, device=device) if hot_cfgs else None
        self.cold = nn.ModuleDict(
            {f"d{d}": EmbeddingCollection(cold_cfgs[d], device=device) for d in r.cold_dims}
        )
        self._mean_features = {
            f for t in tables if t.name in hybrid and t.pooling == PoolingType.MEAN for f in t.feature_names
        }
        self._dims = {f: int(t.embedding_dim) for t in tables for f in t.feature_names}
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

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        r = self.remapper
        if features.keys() != r.output_keys:
            raise DataError(
                f"HybridEmbeddingBagCollection got features {features.keys()} but expects "
                f"{r.output_keys}. Pass the batch through module.remapper.remap(kjt) first."
            )
        batch = features.stride()
        parts = features.split(r.segments)
        pooled: Dict[str, torch.Tensor] = {}
        counts: Dict[str, torch.Tensor] = {}
        if self.plain is not None:
            pooled.update(self.plain(parts[0]).to_dict())
        if self.hot is not None:
            hot_kjt = parts[1]
            for key, t in self.hot(hot_kjt).to_dict().items():
                f = key[: -len(HOT_SUFFIX)]
                pooled[f] = t
            for key, ln in zip(hot_kjt.keys(), hot_kjt.lengths().view(len(hot_kjt.keys()), -1)):
                counts[key[: -len(HOT_SUFFIX)]] = ln
        for i, d in enumerate(r.cold_dims):
            part = parts[2 + i]
            # EmbeddingCollection carries no per-id weights: look rows up
            # unweighted and apply the weights here, locally.
            ids = KeyedJaggedTensor(keys=part.keys(), values=part.values(), lengths=part.lengths())
            rows = self.cold[f"d{d}"](ids)
            for key, jt in part.to_dict().items():
                f = key[: -len(COLD_SUFFIX)]
                emb = rows[key].values()
                lengths = jt.lengths()
                w = jt.weights_or_none()
                if w is not None:
                    emb = emb * w.unsqueeze(1).to(emb.dtype)
                bag = torch.repeat_interleave(torch.arange(batch, device=emb.device), lengths)
                cold_sum = torch.zeros(batch, d, dtype=emb.dtype, device=emb.device).index_add(0, bag, emb)
                pooled[f] = pooled[f] + cold_sum if f in pooled else cold_sum
                counts[f] = counts[f] + lengths if f in counts else lengths
        for f in self._mean_features:
            pooled[f] = pooled[f] / counts[f].clamp(min=1).unsqueeze(1).to(pooled[f].dtype)
        keys = r.input_features
        return KeyedTensor(
            keys=keys,
            length_per_key=[self._dims[f] for f in keys],
            values=torch.cat([pooled[f] for f in keys], dim=1),
            key_dim=1,
        )


# ---- PLACEMENT (constraints for TorchRec's planner) ---- #


#: TorchRec EmbeddingCollection sharding types usable for cold halves on CPU and GPU
COLD_SHARDING_TYPES = ("row_wise", "table_wise", "column_wise")


def hybrid_constraints(
    module: HybridEmbeddingBagCollection,
    cold_sharding_type: Union[str, Mapping[str, str]] = "row_wise",
    plain_sharding_types: Optional[Mapping[str, Sequence[str]]] = None,
    min_partition: Optional[int] = None,
) -> Dict[str, "ParameterConstraints"]:
    """``ParameterConstraints`` pinning hot halves to DP (dense) and cold halves to ``cold_sharding_type`` (fused).

    Feed them to ``EmbeddingShardingPlanner(topology, constraints=...)``.
    ``cold_sharding_type`` is one type for all hybrid tables or a mapping
    table name -> type. ``plain_sharding_types`` optionally restricts
    non-hybrid tables (table name -> allowed types; data_parallel gets the
    dense kernel, the others the fused one); ``min_partition`` bounds the
    column-wise shard width of cold halves.
    """
    from torchrec.distributed.planner.types import ParameterConstraints

    out: Dict[str, ParameterConstraints] = {}
    r = module.remapper
    for t in module.embedding_bag_configs():
        if t.name not in r.hybrid_tables():
            if plain_sharding_types and t.name in plain_sharding_types:
                types = list(plain_sharding_types[t.name])
                kernels = ["dense"] if types == ["data_parallel"] else None
                out[t.name] = ParameterConstraints(sharding_types=types, compute_kernels=kernels)
            continue
        cold_type = cold_sharding_type if isinstance(cold_sharding_type, str) else cold_sharding_type.get(
            t.name, "row_wise")
        if cold_type not in COLD_SHARDING_TYPES:
            raise ConfigError(
                f"Sharding type {cold_type!r} is not supported for the cold half of hybrid table "
                f"{t.name!r}; use one of {COLD_SHARDING_TYPES} (EmbeddingCollection shardings)."
            )
        ht = r._hybrid[t.name]
        if ht.num_hot:
            out[t.name + HOT_SUFFIX] = ParameterConstraints(
                sharding_types=["data_parallel"], compute_kernels=["dense"]
            )
        if ht.num_cold:
            out[t.name + COLD_SUFFIX] = ParameterConstraints(
                sharding_types=[cold_type], compute_kernels=["fused"], min_partition=min_partition
            )
    return out


def hybrid_from_placements(
    tables: Sequence[EmbeddingBagConfig],
    placements: Mapping[str, object],
    hot_ids: Mapping[str, np.ndarray],
    is_weighted: bool = False,
    device: Optional[torch.device] = None,
) -> Tuple[HybridEmbeddingBagCollection, Dict[str, "ParameterConstraints"]]:
    """Module + planner constraints from per-table placements (e.g. ``PlanResult.tables``).

    ``placements[name]`` has ``.placement`` (``"hybrid"`` or a TorchRec
    sharding type, str or enum) and ``.sharding_type`` (for hybrid tables:
    the cold half's type), like :class:`rayemb.planner.types.TablePlan`.
    Hybrid tables take their hot ids from ``hot_ids`` (e.g.
    ``FrequentSplit.hot_ids(name)``); the others stay plain, constrained to
    their sharding type. Tables absent from ``placements`` are plain and
    unconstrained.
    """
    hybrid_hot: Dict[str, np.ndarray] = {}
    cold_types: Dict[str, str] = {}
    plain_types: Dict[str, List[str]] = {}
    for t in tables:
        tp = placements.get(t.name)
        if tp is None:
            continue
        placement = str(getattr(getattr(tp, "placement"), "value", getattr(tp, "placement")))
        sharding_type = str(getattr(getattr(tp, "sharding_type"), "value", getattr(tp, "sharding_type")))
        if placement == "hybrid":
            if t.name not in hot_ids:
                raise ConfigError(
                    f"Table {t.name!r} is placed hybrid but no hot ids were given for it. "
                    "Pass the split's hot ids (FrequentSplit.hot_ids) for every hybrid table."
                )
            hybrid_hot[t.name] = hot_ids[t.name]
            cold_types[t.name] = sharding_type
        else:
            plain_types[t.name] = [sharding_type]
    module = HybridEmbeddingBagCollection(tables, hybrid_hot, is_weighted=is_weighted, device=device)
    return module, hybrid_constraints(module, cold_types, plain_types)


def replicated_embedding_parameters(model: nn.Module) -> Dict[str, nn.Parameter]:
    """Embedding parameters DMP left dense and data-parallel (hybrid hot halves, DP tables).

    TorchRec fuses the optimizer of sharded tables into their backward, but
    data-parallel tables use the ``dense`` kernel: their DDP-averaged gradients
    need a regular optimizer, normally of the same kind as the fused one
    (e.g. ``torchrec.optim.RowWiseAdagrad``). Call after ``DistributedModelParallel``.
    """
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    return {
        n: p for n, p in in_backward_optimizer_filter(model.named_parameters())
        if ".embedding_bags." in f".{n}" or ".embeddings." in f".{n}"
    }


def hybrid_sharders() -> list:
    """Sharders for DMP / the planner: TorchRec's, with row-wise EBC allowed on CPU."""
    from rayemb.embedding.sharders import cpu_capable_sharders

    return cpu_capable_sharders()


# ---- COST MODEL (DESIGN §4) ---- #


def predict_table_bytes(
    placement: str,
    *,
    batch_size: int,
    dim: int,
    world_size: int,
    pooling: float,
    num_rows: int,
    hot_share: float = 0.0,
    num_hot: int = 0,
    num_features: int = 1,
    elem_bytes: int = 4,
    id_bytes: int = 8,
    length_bytes: int = 8,
    weighted: bool = False,
    column_shards: int = 1,
    cold_sharding: str = "row_wise",
) -> Dict[str, float]:
    """Predicted bytes per training step (forward + backward) of one table, by collective.

    Bytes are *sent off-rank, summed over all ranks*, the convention
    :mod:`rayemb.embedding.comm` measures with: an all-reduce of N bytes costs
    2·(W-1)·N (ring: each rank sends 2·N·(W-1)/W), an all-to-all sends every
    chunk not addressed to its own rank, a reduce-scatter / all-gather whose
    full tensor holds N bytes per rank costs (W-1)·N. With global batch B,
    dim D, element size s, P ids per bag, hot share h, and uniform traffic
    (a share (W-1)/W of ids and rows leave their rank), q = (W-1)/W:

    * data_parallel: all-reduce 2·(W-1)·V·D·s
    * table_wise (pooled): ids q·B·P·id + lengths q·B·len, outputs 2·q·B·D·s
    * row_wise (pooled): ids q·B·P·id + lengths (W-1)·B·len (every rank gets
      every bag's length), reduce-scatter (W-1)·B·D·s, all-gather (W-1)·B·D·s
    * column_wise (pooled, k shards): k x table_wise with D/k columns per shard
    * hybrid: all-reduce 2·(W-1)·|F|·D·s, cold ids q·(1-h)·B·P·id + lengths
      (q·B·len table-wise cold, (W-1)·B·len row-wise cold; ids and lengths
      k-fold for k column shards), rows 2·q·(1-h)·B·P·D·s

    Metadata all-to-alls (per-rank split sizes, W²·features·8 bytes) are
    included. Weighted features add 4 bytes per exchanged id. Source: DESIGN §4;
    the hybrid rule follows HugeCTR's hybrid embedding cost model
    (frequent rows all-reduced, infrequent rows exchanged per id).
    """
    if placement not in PLACEMENTS:
        raise ConfigError(f"Unknown placement {placement!r}; use one of {PLACEMENTS}.")
    w, b, d, s = world_size, float(batch_size), dim, elem_bytes
    q = (w - 1) / w
    idb = id_bytes + (4 if weighted else 0)
    meta = w * (w - 1) * num_features * 8.0
    n_ids = b * pooling * num_features
    bags = b * num_features
    if placement == "data_parallel":
        return {"all_reduce": 2.0 * (w - 1) * num_rows * d * s}
    if placement == "table_wise":
        return {"all_to_all": q * n_ids * idb + q * bags * length_bytes + meta + 2.0 * q * bags * d * s}
    if placement == "column_wise":
        k = column_shards
        return {"all_to_all": k * (q * n_ids * idb + q * bags * length_bytes + meta) + 2.0 * q * bags * d * s}
    if placement == "row_wise":
        rs = (w - 1) * bags * d * s
        return {
            "all_to_all": q * n_ids * idb + (w - 1) * bags * length_bytes + meta,
            "reduce_scatter": rs,
            "all_gather": rs,
        }
    cold_ids = (1.0 - hot_share) * n_ids
    out = {"all_reduce": 2.0 * (w - 1) * num_hot * d * s} if num_hot else {}
    if num_hot >= num_rows:
        return out
    if cold_sharding == "row_wise":
        lookup = q * cold_ids * idb + (w - 1) * bags * length_bytes + meta
    elif cold_sharding == "table_wise":
        lookup = q * cold_ids * idb + q * bags * length_bytes + meta
    else:
        lookup = column_shards * (q * cold_ids * idb + q * bags * length_bytes + meta)
    out["all_to_all"] = lookup + 2.0 * q * cold_ids * d * s
    return out


def predict_bytes_per_step(tables: Sequence[Mapping[str, object]]) -> Dict[str, float]:
    """Sum of :func:`predict_table_bytes` over tables (each a kwargs mapping with ``placement``)."""
    total: Dict[str, float] = {}
    for spec in tables:
        kw = dict(spec)
        placement = str(kw.pop("placement"))
        for k, v in predict_table_bytes(placement, **kw).items():  # type: ignore[arg-type]
            total[k] = total.get(k, 0.0) + v
    return total


__all__ = [
    "COLD_SHARDING_TYPES",
    "COLD_SUFFIX",
    "HOT_SUFFIX",
    "HybridEmbeddingBagCollection",
    "HybridRemapper",
    "hybrid_constraints",
    "hybrid_from_placements",
    "hybrid_sharders",
    "replicated_embedding_parameters",
    "predict_bytes_per_step",
    "predict_table_bytes",
]
