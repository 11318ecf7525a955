"""The job's tables as TorchRec configs: one pooled table per table-owning sparse feature, one per sequence feature.

Tables share their owning feature's name, so statistics, splits, plans and
checkpoints key them alike; a feature with ``table: F`` in schema.yaml is one
more of table ``F``'s ``feature_names``. A pooled table has its schema entry's
``embedding_dim`` (else the model's) and the model's ``embedding_dtype``; a
sequence table has the model's ``embedding_dim``.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig

from rayemb.embedding.sequence import SequenceFeature, sequence_collection
from rayemb.errors import ConfigError


#: model.embedding_dtype -> the TorchRec data type its tables are built with (FBGEMM's weights_precision)
DATA_TYPES = {"fp32": DataType.FP32, "fp16": DataType.FP16}


def table_configs(schema, embedding_dim: int, dtype: str = "fp32") -> List[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per pooled table of a :class:`DatasetSchema` (:attr:`~DatasetSchema.tables`),
    named after its owning feature, its features that one and those naming it in ``table:``.

    ``embedding_dim`` (``model.embedding_dim``) is the dim of a table whose schema entry gives none. ``dtype``
    (``model.embedding_dtype``) is the weights' storage: every half of a hybrid table inherits it.
    """
    dims = schema.table_dims(embedding_dim)
    return [
        EmbeddingBagConfig(
            name=f.name,
            embedding_dim=dims[f.name],
            num_embeddings=f.num_embeddings,
            feature_names=schema.table_features(f.name),
            data_type=DATA_TYPES[dtype],
        )
        for f in schema.tables
    ]


def sequence_features(model_cfg, schema) -> List[SequenceFeature]:
    """The schema's sequence features as the model embeds them ([] for ``sequence_tower: none``).

    Tables have the model's ``embedding_dim`` (the tower output joins the pooled
    vectors in one interaction). ``attention`` needs a ``target`` on every feature.
    """
    mode = model_cfg.sequence_tower
    if mode == "none":
        return []
    if not schema.sequence:
        raise ConfigError(
            f"model.sequence_tower is {mode!r} but the dataset's schema.yaml declares no sequence feature. Add one "
            "(`sequence: true`, `max_length: N`; e.g. `rayemb gen-data --sequence-length 20`) or set "
            "model.sequence_tower: none.", category="invalid_config")
    untargeted = [f.name for f in schema.sequence if f.target is None]
    if mode == "attention" and untargeted:
        raise ConfigError(
            f"model.sequence_tower: attention compares each history with a target item, but sequence feature(s) "
            f"{untargeted} declare no `target:` in schema.yaml. Add `target: <pooled feature>` or use "
            "model.sequence_tower: mean.", category="invalid_config")
    return [SequenceFeature(f.name, f.num_embeddings, model_cfg.embedding_dim, f.max_length) for f in schema.sequence]


def sequence_module(model_cfg, schema, device: Optional[torch.device] = None) -> Optional[nn.Module]:
    """The ``EmbeddingCollection`` of the schema's sequence features (None for ``sequence_tower: none``)."""
    features = sequence_features(model_cfg, schema)
    return sequence_collection(features, device=device) if features else None
