"""The model contract: what a model factory receives, what it must return, and the check of both.

A factory is a plain function ``factory(embeddings, schema, **args) -> nn.Module``.
``embeddings`` (:class:`Embeddings`) holds the embedding modules rayemb built
from the job's plan: ``pooled`` maps the batch's ``KeyedJaggedTensor`` to a
``KeyedTensor`` with one ``(B, dims[i])`` vector per pooled feature, whatever the
placement behind it (data-parallel, sharded, hybrid hot/cold, compressed). A
feature's width is its table's dim (schema.yaml ``embedding_dim``, else
``model.embedding_dim``), so widths may differ; two features reading one table
(``table:``) get vectors of the same rows;
``sequence`` (only with ``model.sequence_tower`` other than ``none``) maps the
sequence features' KJT to one ``JaggedTensor`` per feature. The model holds
them as submodules and is called on each batch as::

    output = model(dense, sparse)                 # dense: (B, num_dense) float, sparse: KJT of the pooled ids
    output = model(dense, sparse, sequence)       # with sequence features

``output`` is ``(B,)`` logits, ``(B, T)`` for a schema with ``T`` label columns
(or what the job's own loss takes), and the loss sees the whole batch's output. The model never touches sharding:
``DistributedModelParallel`` shards the modules it was handed, under whatever
attribute names the model gave them, and checkpoints, resharding, resume and
export find the tables by those modules' own parameter names.

:func:`check_model` finds where the model holds each module and fails with one
message naming what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from rayemb.embedding.sequence import SequenceFeature
from rayemb.errors import BAD_FACTORY, ConfigError

#: the attribute a model must give the sequence collection: checkpoints find its tables by it
SEQUENCE_ATTRIBUTE = "sequence"


@dataclass(frozen=True)
class Embeddings:
    """The embedding modules of a job, built from its plan, as a model factory receives them."""

    #: ``KeyedJaggedTensor -> KeyedTensor``: one ``(B, dims[i])`` pooled embedding per feature of ``features``
    pooled: nn.Module
    #: the pooled features, in the ``KeyedTensor``'s key order: the schema's, except that features sharing a
    #: table follow its owner (:attr:`~rayemb.data.schema.DatasetSchema.pooled_features`)
    features: Tuple[str, ...]
    #: ``model.embedding_dim``: the dim of tables whose schema entry gives none, and of the sequence tables
    dim: int
    #: ``KeyedJaggedTensor -> Dict[str, JaggedTensor]`` of the sequence features, or None without them
    sequence: Optional[nn.Module] = None
    #: the sequence features the ``sequence`` module embeds (name, rows, dim, max_length)
    sequence_features: Tuple[SequenceFeature, ...] = ()
    #: where the model's dense layers go (the rank's device)
    device: Optional[torch.device] = None
    #: each pooled feature's vector width, in ``features`` order (empty when built: every one ``dim``)
    dims: Tuple[int, ...] = ()

    def __post_init__(self) -> None:
        dims = tuple(int(d) for d in self.dims) or (int(self.dim),) * len(self.features)
        if len(dims) != len(self.features):
            raise ValueError(f"Embeddings: {len(dims)} dims for {len(self.features)} features {self.features}; "
                             "give one dim per pooled feature")
        object.__setattr__(self, "dims", dims)

    def dim_of(self, feature: str) -> int:
        """The width of pooled feature ``feature``'s vector."""
        return self.dims[self.features.index(feature)]

    @property
    def pooled_width(self) -> int:
        """The width of every pooled vector side by side (``KeyedTensor.values()``'s second dim)."""
        return sum(self.dims)


def model_inputs(batch: Any, device: Any, non_blocking: bool = False) -> Tuple[Any, ...]:
    """A batch's positional model inputs on ``device``: ``(dense, sparse)``, or with sequence features
    ``(dense, sparse, sequence)`` (:class:`~rayemb.data.batching.Batch` or anything with those fields).
    ``non_blocking``: asynchronous copies from pinned memory (:mod:`rayemb.train.worker.device_feed`)."""
    dense, sparse = batch.dense.to(device, non_blocking=non_blocking), batch.sparse.to(device, non_blocking)
    if batch.sequence is None:
        return dense, sparse
    return dense, sparse, batch.sequence.to(device, non_blocking)


def _path_of(model: nn.Module, target: nn.Module) -> Optional[str]:
    for name, module in model.named_modules():
        if module is target:
            return name
    return None


def _foreign_tables(model: nn.Module, ours: Tuple[nn.Module, ...]) -> Dict[str, str]:
    """Embedding modules inside ``model`` that rayemb did not build: path -> type."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    inside = {id(m) for o in ours for m in o.modules()}
    return {name: type(m).__name__ for name, m in model.named_modules()
            if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection, nn.Embedding, nn.EmbeddingBag))
            and id(m) not in inside}


def check_model(model: Any, embeddings: Embeddings, factory_name: str) -> Dict[str, str]:
    """The module paths of ``embeddings``' modules inside ``model`` (``{"pooled": ..., "sequence": ...}``).

    Raises :class:`~rayemb.errors.ConfigError` (``bad_model_factory``) naming the fix when the factory
    returned no module, dropped a module it was given, or holds embedding tables of its own (those would be
    neither planned nor checkpointed).
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"The model factory {factory_name} returned {type(model).__name__}, not a torch.nn.Module. "
                          "Return the model: `return MyModel(embeddings, schema, ...)`.", BAD_FACTORY)
    paths = {"pooled": _path_of(model, embeddings.pooled)}
    if paths["pooled"] is None:
        raise ConfigError(f"The model {type(model).__name__} built by {factory_name} does not hold the pooled "
                          "embedding module it was given. Keep it as a submodule, e.g. "
                          "`self.embedding = embeddings.pooled`, and call it on the batch's sparse input.",
                          BAD_FACTORY)
    if paths["pooled"] == "":
        raise ConfigError(f"The model factory {factory_name} returned the embedding module itself; return a model "
                          "that holds it and maps its output to logits.", BAD_FACTORY)
    if embeddings.sequence is not None:
        path = _path_of(model, embeddings.sequence)
        if path is None or path.rsplit(".", 1)[-1] != SEQUENCE_ATTRIBUTE:
            raise ConfigError(f"The model {type(model).__name__} built by {factory_name} must hold the sequence "
                              f"features' module as an attribute named {SEQUENCE_ATTRIBUTE!r} "
                              f"(`self.{SEQUENCE_ATTRIBUTE} = embeddings.sequence`; found: {path!r}); checkpoints "
                              "find the history tables by that name.", BAD_FACTORY)
        paths["sequence"] = path
    foreign = _foreign_tables(model, tuple(m for m in (embeddings.pooled, embeddings.sequence) if m is not None))
    if foreign:
        raise ConfigError(f"The model {type(model).__name__} built by {factory_name} holds embedding tables rayemb "
                          f"did not build: {foreign}. Declare those ids as sparse features in schema.yaml and read "
                          "their vectors from `embeddings.pooled`: rayemb plans, shards and checkpoints only the "
                          "tables it built.", BAD_FACTORY)
    return paths


def check_retrieval(model: Any, schema: Any, factory_name: str) -> None:
    """A retrieval model's ``item_feature`` is a one-id-per-row pooled feature (ConfigError naming the fix)."""
    item = getattr(model, "item_feature", None)
    if item is None:
        return
    single = {f.name for f in schema.sparse if not f.multi_hot}
    if not isinstance(item, str) or item not in single:
        raise ConfigError(f"The retrieval model {type(model).__name__} built by {factory_name} names "
                          f"item_feature={item!r}, which is not a one-id-per-row sparse feature of the schema "
                          f"({sorted(single)}). Name the column that holds each row's item.", BAD_FACTORY)


__all__ = ["Embeddings", "check_model", "check_retrieval", "model_inputs", "SEQUENCE_ATTRIBUTE"]
