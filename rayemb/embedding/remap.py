"""Hot/cold id remapping of the hybrid embedding, in the data path (vectorised numpy, picklable).

A hybrid table (:mod:`rayemb.embedding.hybrid`) keeps its hot rows F and its
cold rows in two halves; every batch's ids must be mapped to rows of those
halves before the module sees them. :class:`HybridRemapper` does that without
a V-sized array (binary search over the sorted hot ids) and converts whole
tables between their logical ``[V, D]`` form and the two halves.

Example::

    >>> r = HybridRemapper([EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10,
    ...                                        feature_names=["f"])], {"t": np.array([7, 2])})
    >>> out = r.remap_arrays({"f": (np.array([2, 5, 7]), np.array([3]), None)})
    >>> out["f__hot"][0].tolist(), out["f__cold"][0].tolist()
    ([0, 1], [4])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rayemb.errors import ConfigError, DataError

#: suffix of the replicated hot-row table / feature made from a hybrid table
HOT_SUFFIX = "__hot"
#: suffix of the sharded cold-row table / feature made from a hybrid table
COLD_SUFFIX = "__cold"
#: bag lengths of the remapped KJT, as the data path makes them (:mod:`rayemb.data.batching`): the
#: row-wise cold exchange sends every bag's length to every rank, so int64 would double those bytes
LENGTH_DTYPE = np.int32


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


def _validate_hot_ids(config: EmbeddingBagConfig, ids: np.ndarray, raw: bool = False) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ConfigError(
            f"Hot ids of table {config.name!r} must be a 1-D integer array; got shape "
            f"{arr.shape} dtype {arr.dtype}. Pass the table's frequent ids as np.int64."
        )
    arr = np.unique(arr.astype(np.int64, copy=False))
    if raw:  # any int64 is a raw id; the hot rows and the managed-collision slots share the capacity
        if arr.size > config.num_embeddings - 2:
            raise ConfigError(
                f"Table {config.name!r} holds raw ids and was given {arr.size} hot ids, but its capacity is "
                f"{config.num_embeddings} rows, which must also keep at least 2 slots for the other ids. Raise "
                "num_embeddings or lower the hot set (planner.memory_budget, fewer heavy hitters).")
        return arr
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

    Output key order: plain features, hot features, cold features grouped
    by embedding dim, then the ``raw`` features (raw-id tables: their ids pass
    unchanged, any int64, for the module's managed-collision tables); the
    module splits by these segment sizes. A raw-id table may have hot ids too
    (raw values, any int64): those go to ``f__hot`` as above, and the rest of
    its ids stay raw in ``f`` (its managed-collision table is the cold half). Picklable
    and torch-free in its state (numpy arrays), so it can run in a Ray Data
    ``map_batches`` or the worker's batch conversion.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        hot_ids: Mapping[str, Optional[np.ndarray]],
        raw: Sequence[str] = (),
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
        #: the raw-id tables (hybrid or not)
        self.raw_tables: List[str] = [t.name for t in tables if t.name in raw]
        self.plain_features: List[str] = []
        self.hot_features: List[str] = []
        #: features of the raw-id tables: passed unchanged, the last segment
        self.raw_features: List[str] = []
        cold_by_dim: Dict[int, List[str]] = {}
        for t in tables:
            self._num_embeddings[t.name] = int(t.num_embeddings)
            for f in t.feature_names:
                self._feature_table[f] = t.name
            ids = hot_ids.get(t.name)
            if t.name in raw:
                self.raw_features += list(t.feature_names)
                if ids is not None and len(ids):
                    self._hybrid[t.name] = _HybridTable(t, _validate_hot_ids(t, ids, raw=True))
                    self.hot_features += [f + HOT_SUFFIX for f in t.feature_names]
                continue
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
        return self.plain_features + self.hot_features + self.cold_features + self.raw_features

    @property
    def segments(self) -> List[int]:
        """Key counts of the remapped KJT's consecutive segments: plain, hot, one per cold dim, raw (when any)."""
        return [len(self.plain_features), len(self.hot_features)] + [
            len(self.cold_features_by_dim[d]) for d in self.cold_dims
        ] + ([len(self.raw_features)] if self.raw_features else [])

    def hybrid_tables(self) -> List[str]:
        return list(self._hybrid)

    def num_hot(self, table: str) -> int:
        """|F|: rows of a hybrid table's hot half (0: it has none)."""
        return self._hybrid[table].num_hot

    def num_cold(self, table: str) -> int:
        """V - |F|: rows of a hybrid table's cold half (0: it has none); a raw-id table's: its managed-collision
        table's slots."""
        return self._hybrid[table].num_cold

    def is_raw(self, table: str) -> bool:
        """Whether ``table`` holds raw ids (its hot ids, if any, are raw values; its cold half is managed)."""
        return table in self.raw_tables

    def hot_ids(self, table: str) -> np.ndarray:
        """Sorted hot ids of a hybrid table (hot row k holds id ``hot_ids[k]``)."""
        return self._hybrid[table].hot_ids

    def cold_ids(self, table: str) -> np.ndarray:
        """Sorted cold ids of a hybrid table (cold row j holds id ``cold_ids[j]``); V-sized. Not for a raw-id
        table, whose cold ids are whichever its managed-collision table holds."""
        if self.is_raw(table):
            raise ValueError(f"raw-id table {table!r} has no fixed cold ids")
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
            lengths = np.asarray(lengths, dtype=LENGTH_DTYPE)
            table = self._feature_table[f]
            raw = f in self.raw_features  # any int64 is a raw id
            if not raw and values.size and (values.min() < 0 or values.max() >= self._num_embeddings[table]):
                raise DataError(
                    f"Feature {f!r} has ids in [{values.min()}, {values.max()}] but table "
                    f"{table!r} has {self._num_embeddings[table]} rows. Hash or clip ids "
                    "into range when writing the dataset, or raise num_embeddings."
                )
            ht = self._hybrid.get(table)
            if ht is None:
                out[f] = (values, lengths, weights)
                continue
            # the cold ids of a raw table stay raw, under the feature's own name, for its managed-collision table
            cold_key = f if raw else f + COLD_SUFFIX
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
                    np.bincount(bag[is_hot], minlength=lengths.size).astype(LENGTH_DTYPE),
                    None if w is None else w[is_hot],
                )
            if raw or ht.num_cold > 0:
                cold = ~is_hot
                out[cold_key] = (
                    values[cold] if raw else values[cold] - pos[cold],
                    np.bincount(bag[cold], minlength=lengths.size).astype(LENGTH_DTYPE),
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
        lengths = np.concatenate([remapped[k][1] for k in keys]) if keys else np.zeros(0, LENGTH_DTYPE)
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


__all__ = ["COLD_SUFFIX", "HOT_SUFFIX", "HybridRemapper"]
