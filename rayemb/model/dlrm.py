"""DLRM (Naumov et al., 2019, arXiv:1906.00091) over a pluggable embedding module.

``bottom MLP(dense) ─┐
                     ├─ pairwise dot interaction ─ top MLP ─ logit``
``embedding(KJT) ────┘``

The embedding module is anything that maps a ``KeyedJaggedTensor`` to a
``KeyedTensor`` of pooled ``(B, D)`` embeddings per feature: a TorchRec
``EmbeddingBagCollection`` or rayemb's hybrid embedding. TorchRec's ``DenseArch``,
``InteractionArch`` and ``OverArch`` are reused as they are.

Example::

    >>> ebc = EmbeddingBagCollection(tables=[...], device=torch.device("meta"))
    >>> model = DLRM(ebc, feature_names=["C1", "C2"], dense_in_features=13,
    ...              bottom_mlp=[64, 16], top_mlp=[64, 1])
    >>> logits = model(dense, kjt)          # (B,)
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import nn
from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


class DLRM(nn.Module):
    def __init__(
        self,
        embedding: nn.Module,
        feature_names: Sequence[str],
        dense_in_features: int,
        bottom_mlp: Sequence[int],
        top_mlp: Sequence[int],
        dense_device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.feature_names: List[str] = list(feature_names)
        num_sparse = len(self.feature_names)
        dim = bottom_mlp[-1]
        self.dense_arch = DenseArch(dense_in_features, list(bottom_mlp), device=dense_device)
        self.inter_arch = InteractionArch(num_sparse_features=num_sparse)
        over_in = dim + (num_sparse + 1) * num_sparse // 2
        self.over_arch = OverArch(over_in, list(top_mlp), device=dense_device)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        dense_out = self.dense_arch(dense)
        pooled = self.embedding(sparse).to_dict()
        sparse_out = torch.stack([pooled[f] for f in self.feature_names], dim=1)  # (B, F, D)
        return self.over_arch(self.inter_arch(dense_out, sparse_out)).squeeze(-1)


def table_configs(schema, embedding_dim: int) -> List[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per sparse feature of a :class:`DatasetSchema`, named after its feature.

    Tables share the feature's name so stats, splits and plans key them alike.
    """
    return [
        EmbeddingBagConfig(
            name=f.name,
            embedding_dim=embedding_dim,
            num_embeddings=f.num_embeddings,
            feature_names=[f.name],
        )
        for f in schema.sparse
    ]
