"""Sequence (non-pooled) features: an ``EmbeddingCollection``, jagged batches, padded output, a history tower.

A sequence feature is a per-sample list of ids in time order (oldest first,
e.g. the items a user clicked), truncated to its ``max_length`` most recent
ids. Unlike a pooled feature, every id keeps its own embedding: TorchRec's
``EmbeddingCollection`` returns one ``JaggedTensor`` per feature whose
``values()`` are ``[sum(lengths), D]``. The collection shards table-wise,
row-wise and column-wise with ``rayemb.embedding.sharders.cpu_capable_sharders``
on gloo and nccl (``tests/dist/test_sequence_equivalence.py`` checks each
against an unsharded collection, including several column shards of one
table on one rank).

Pieces, in data-path order:

* :class:`SequenceFeature` (name, num_embeddings, embedding_dim, max_length)
  and :func:`sequence_collection` build the module (one table per feature,
  the table named like the feature);
* :func:`truncate_recent` (flat ``lengths``/``values`` arrays, as a pyarrow
  list column gives them) and :func:`sequence_kjt` (per-row id lists) build
  the ``KeyedJaggedTensor``, vectorised in numpy, keeping the latest ids;
* :func:`pad_sequences` turns each output ``JaggedTensor`` into a padded
  ``[B, max_length, D]`` tensor and a ``[B, max_length]`` mask (valid
  positions first, the most recent id last among them);
* :class:`UserHistoryTower` pools the padded history against a target
  embedding (masked mean, or DIN-style attention) into ``[B, D]``.

Example::

    >>> feats = [SequenceFeature("clicks", num_embeddings=100, embedding_dim=8, max_length=3)]
    >>> ec = sequence_collection(feats)
    >>> kjt = sequence_kjt(feats, {"clicks": [[1, 2, 3, 4], [], [7]]})
    >>> kjt.lengths().tolist(), kjt.values().tolist()        # keeps the 3 latest ids
    ([3, 0, 1], [2, 3, 4, 7])
    >>> hist, mask = pad_sequences(ec(kjt), feats)["clicks"]
    >>> hist.shape, mask.tolist()[1]
    (torch.Size([3, 3, 8]), [False, False, False])
    >>> UserHistoryTower("attention")(hist, mask, torch.randn(3, 8)).shape
    torch.Size([3, 8])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingCollection
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

from rayemb.errors import ConfigError, DataError

#: pooling modes of :class:`UserHistoryTower`
TOWER_MODES = ("mean", "attention")


@dataclass(frozen=True)
class SequenceFeature:
    """One sequence feature and its embedding table (named like the feature).

    ``max_length`` is the number of most recent ids kept per sample; longer
    histories are cut at the old end by :func:`truncate_recent`.
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    max_length: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"A sequence feature needs a non-empty name; got {self.name!r}.",
                              category="invalid_config")
        if "." in self.name or hasattr(nn.ModuleDict, self.name):
            # TorchRec keeps tables in an nn.ModuleDict keyed by name: "items", "keys", "a.b" cannot be keys
            raise ConfigError(
                f"Sequence feature name {self.name!r} cannot name a TorchRec table (it contains '.' or is an "
                "nn.ModuleDict attribute such as 'items', 'keys', 'values'). Rename the feature, e.g. "
                f"{self.name.replace('.', '_') + '_seq'!r}.",
                category="invalid_config",
            )
        for field in ("num_embeddings", "embedding_dim", "max_length"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"Sequence feature {self.name!r}: {field} must be a positive integer; got {value!r}. "
                    f"Set {field} to the table's size, the embedding width or the number of ids to keep.",
                    category="invalid_config",
                )

    def embedding_config(self) -> EmbeddingConfig:
        """The TorchRec table config: one table per feature, named like it."""
        return EmbeddingConfig(name=self.name, embedding_dim=self.embedding_dim,
                               num_embeddings=self.num_embeddings, feature_names=[self.name])


def _check_features(features: Sequence[SequenceFeature]) -> None:
    if not features:
        raise ConfigError("No sequence features given; pass at least one SequenceFeature.",
                          category="invalid_config")
    names = [f.name for f in features]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"Sequence feature names must be unique; {dupes} appear more than once. "
                          "Rename the duplicates.", category="invalid_config")


def sequence_collection(features: Sequence[SequenceFeature],
                        device: Optional[torch.device] = None) -> EmbeddingCollection:
    """An ``EmbeddingCollection`` with one table per sequence feature.

    TorchRec requires one embedding dim per ``EmbeddingCollection``; features
    of different dims need one collection each (group them by
    ``embedding_dim``). Build on ``torch.device("meta")`` before sharding with
    ``DistributedModelParallel``.
    """
    _check_features(features)
    dims = sorted({f.embedding_dim for f in features})
    if len(dims) > 1:
        raise ConfigError(
            f"Sequence features {[f.name for f in features]} have embedding dims {dims}; an "
            "EmbeddingCollection holds tables of one dim only. Give them the same embedding_dim or build "
            "one collection per dim.",
            category="invalid_config",
        )
    return EmbeddingCollection(tables=[f.embedding_config() for f in features], device=device)


def truncate_recent(lengths: np.ndarray, values: np.ndarray, max_length: int) -> Tuple[np.ndarray, np.ndarray]:
    """Keeps the last ``max_length`` ids of every row of a flat jagged array.

    Row ``i`` is ``values[o_i : o_i + lengths[i]]`` (``o`` the exclusive
    cumsum of ``lengths``), oldest id first. Returns ``(min(lengths,
    max_length), kept values)`` as int64, rows in order, ids in order. The
    position of a value inside its row is ``p = j - o_row(j)``; it is kept when
    ``p >= lengths[row] - max_length``.
    """
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise ValueError(f"max_length must be a positive integer; got {max_length!r}")
    lengths = np.asarray(lengths)
    values = np.asarray(values)
    if lengths.ndim != 1 or values.ndim != 1:
        raise DataError(f"lengths and values must be 1-D; got shapes {lengths.shape} and {values.shape}.",
                        category="invalid_values")
    lengths = lengths.astype(np.int64, copy=False)
    if lengths.size and lengths.min() < 0:
        raise DataError(f"Sequence lengths must be >= 0; got {int(lengths.min())}.", category="invalid_values")
    if int(lengths.sum()) != values.size:
        raise DataError(f"Sequence lengths sum to {int(lengths.sum())} but there are {values.size} ids; "
                        "pass the lengths that belong to these values.", category="invalid_values")
    values = values.astype(np.int64, copy=False)
    kept = np.minimum(lengths, max_length)
    if values.size == 0 or (kept == lengths).all():
        return kept, values
    starts = np.cumsum(lengths) - lengths
    pos = np.arange(values.size, dtype=np.int64) - np.repeat(starts, lengths)
    keep = pos >= np.repeat(lengths - kept, lengths)
    return kept, values[keep]


def _flatten_rows(rows: Sequence[Sequence[int]]) -> Tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    nonempty = [np.asarray(r, dtype=np.int64) for r in rows if len(r)]
    values = np.concatenate(nonempty) if nonempty else np.zeros(0, dtype=np.int64)
    return lengths, values


def sequence_kjt(features: Sequence[SequenceFeature],
                 rows: Mapping[str, object]) -> KeyedJaggedTensor:
    """A ``KeyedJaggedTensor`` of the features' sequences, each cut to its latest ``max_length`` ids.

    ``rows[name]`` is either a list of per-sample id lists (oldest first) or a
    ``(lengths, values)`` tuple of flat arrays (a pyarrow list column's
    ``value_lengths()`` and ``flatten()``). Every feature must have the
    same number of samples and ids in ``[0, num_embeddings)``; everything is
    checked before the tensor is built.
    """
    _check_features(features)
    missing = [f.name for f in features if f.name not in rows]
    if missing:
        raise DataError(f"No ids given for sequence features {missing}; pass one entry per feature "
                        f"(got {sorted(rows)}).", category="missing_column")
    lens, vals = [], []
    for f in features:
        given = rows[f.name]
        if isinstance(given, tuple) and len(given) == 2:
            lengths, values = given
        else:
            lengths, values = _flatten_rows(given)  # type: ignore[arg-type]
        lengths, values = truncate_recent(lengths, values, f.max_length)
        if values.size and (values.min() < 0 or values.max() >= f.num_embeddings):
            raise DataError(
                f"Sequence feature {f.name!r} has ids outside [0, {f.num_embeddings}) (observed range "
                f"[{int(values.min())}, {int(values.max())}]). Fix num_embeddings to cover the ids or map "
                "them into the table (e.g. id mod num_embeddings).",
                category="invalid_ids",
            )
        lens.append(lengths)
        vals.append(values)
    sizes = {f.name: int(x.size) for f, x in zip(features, lens)}
    if len(set(sizes.values())) > 1:
        raise DataError(f"Sequence features have different numbers of samples {sizes}; every feature needs "
                        "one (possibly empty) list per sample.", category="invalid_values")
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f.name for f in features],
        values=torch.from_numpy(np.concatenate(vals)),
        lengths=torch.from_numpy(np.concatenate(lens)),
    )


def pad_jagged(jt: JaggedTensor, max_length: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``[B, max_length, D]`` embeddings (zeros past each row's length) and a ``[B, max_length]`` bool mask.

    Differentiable in ``jt.values()``. Row ``b``'s ids sit at positions
    ``0 .. lengths[b]-1`` in their input order, so the most recent id is the
    last valid one.
    """
    values, lengths = jt.values(), jt.lengths().to(torch.long)
    if values.dim() != 2:
        raise ValueError(f"expected sequence embeddings [N, D]; got shape {tuple(values.shape)}")
    b = lengths.numel()
    if b and int(lengths.max()) > max_length:
        raise DataError(
            f"A sequence has {int(lengths.max())} ids, more than max_length={max_length}; build the batch "
            "with sequence_kjt / truncate_recent, which keep the latest max_length ids.",
            category="invalid_values",
        )
    row = torch.repeat_interleave(torch.arange(b, device=values.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    pos = torch.arange(values.shape[0], device=values.device) - torch.repeat_interleave(starts, lengths)
    out = values.new_zeros((b, max_length, values.shape[1]))
    out = out.index_put((row, pos), values)
    mask = torch.arange(max_length, device=values.device).unsqueeze(0) < lengths.unsqueeze(1)
    return out, mask


def pad_sequences(output: Mapping[str, JaggedTensor],
                  features: Sequence[SequenceFeature]) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    """Per feature, :func:`pad_jagged` of the collection's (sharded or not) output at its ``max_length``."""
    # keys() rather than `in`: a sharded collection returns a LazyAwaitable that delegates attributes only
    have = set(output.keys())
    missing = [f.name for f in features if f.name not in have]
    if missing:
        raise ValueError(f"the embedding output has no sequences for {missing}; it has {sorted(have)}")
    return {f.name: pad_jagged(output[f.name], f.max_length) for f in features}


class UserHistoryTower(nn.Module):
    """Pools a padded history ``h [B, L, D]`` (mask ``m [B, L]``) against a target ``t [B, D]`` into ``[B, D]``.

    * ``mean``: ``sum_i m_i h_i / max(1, sum_i m_i)``;
    * ``attention`` (DIN, Zhou et al. 2018, with a dot-product score):
      ``a = softmax_{i: m_i}(<h_i, t>)``, output ``sum_i a_i h_i``.

    A row with an empty history gives zeros (no NaN, zero gradient). No
    parameters: what it learns flows into the embeddings.

    Example::

        >>> tower = UserHistoryTower("mean")
        >>> h = torch.ones(2, 3, 4); m = torch.tensor([[True, True, False], [False] * 3])
        >>> tower(h, m, torch.zeros(2, 4)).tolist()[1]
        [0.0, 0.0, 0.0, 0.0]
    """

    def __init__(self, mode: str = "attention") -> None:
        super().__init__()
        if mode not in TOWER_MODES:
            raise ConfigError(f"UserHistoryTower mode {mode!r} is unknown; use one of {TOWER_MODES}.",
                              category="invalid_config")
        self.mode = mode

    @staticmethod
    def _check(history: torch.Tensor, mask: torch.Tensor, target: Optional[torch.Tensor]) -> None:
        if history.dim() != 3 or mask.shape != history.shape[:2]:
            raise ValueError(f"history must be [B, L, D] and mask [B, L]; got {tuple(history.shape)} and "
                             f"{tuple(mask.shape)}")
        if target is not None and target.shape != (history.shape[0], history.shape[2]):
            raise ValueError(f"target must be [B, D] = {(history.shape[0], history.shape[2])}; got "
                             f"{tuple(target.shape)}")

    def attention_weights(self, history: torch.Tensor, mask: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``[B, L]`` weights: a softmax over the valid positions, zero elsewhere (all zero for empty rows)."""
        self._check(history, mask, target)
        scores = torch.einsum("bld,bd->bl", history, target)
        # a finite fill (not -inf) keeps all-masked rows NaN-free; their weights are zeroed below
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        return torch.softmax(scores, dim=1) * mask.to(scores.dtype)

    def forward(self, history: torch.Tensor, mask: torch.Tensor, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        self._check(history, mask, target)
        m = mask.to(history.dtype)
        if self.mode == "mean":
            return (history * m.unsqueeze(2)).sum(1) / m.sum(1, keepdim=True).clamp_min(1.0)
        if target is None:
            raise ValueError("attention pooling needs the target embedding [B, D]")
        return torch.einsum("bl,bld->bd", self.attention_weights(history, mask, target), history)


__all__: List[str] = [
    "SequenceFeature",
    "TOWER_MODES",
    "UserHistoryTower",
    "pad_jagged",
    "pad_sequences",
    "sequence_collection",
    "sequence_kjt",
    "truncate_recent",
]
