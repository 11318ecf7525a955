"""A two-tower retrieval model: a user tower and an item tower whose dot product scores a (user, item) pair.

The user tower reads the user-side pooled features (every pooled feature but
the item's, and the dense columns); the item tower reads only the item's id,
so an item's vector can be computed for the whole catalogue, once, and served
from a nearest-neighbour index. Both vectors are L2-normalised; the query is
divided by ``temperature``, so ``score = query . candidate`` is a scaled cosine.

It is a retrieval model in rayemb's sense (docs/api.md, "Retrieval models"):
it names its ``item_feature`` and returns ``(query, candidate)``, and rayemb
trains it with an in-batch sampled softmax over every rank's candidates,
corrected by each item's log sampling probability from the statistics pass
(logQ), and validates it by hit rate@K over the whole catalogue.

Select it with ``model.name: two_tower``; ``model.args`` sets its sizes::

    model:
      name: two_tower
      args: {item_feature: item, tower_mlp: [128, 64], temperature: 0.05}
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn
from torchrec.modules.mlp import MLP

from rayemb import DatasetSchema, Embeddings


def _tower(in_features: int, sizes: Sequence[int], device) -> nn.Module:
    """Hidden ReLU layers, then a linear output layer (a ReLU there would zero half of a unit vector's room)."""
    sizes = list(sizes)
    hidden = [MLP(in_features, sizes[:-1], device=device)] if len(sizes) > 1 else []
    return nn.Sequential(*hidden, nn.Linear(sizes[-2] if len(sizes) > 1 else in_features, sizes[-1], device=device))


class TwoTower(nn.Module):
    def __init__(self, embeddings: Embeddings, num_dense: int, item_feature: str,
                 user_features: Optional[Sequence[str]] = None, tower_mlp: Sequence[int] = (128, 64),
                 temperature: float = 0.05) -> None:
        super().__init__()
        features = list(embeddings.features)
        if item_feature not in features:
            raise ValueError(f"two_tower: item_feature={item_feature!r} is not a pooled sparse feature of the "
                             f"schema ({features}); set model.args.item_feature")
        users = [f for f in features if f != item_feature] if user_features is None else list(user_features)
        unknown = [f for f in users if f not in features or f == item_feature]
        if unknown or not (users or num_dense):
            raise ValueError(f"two_tower: user_features={users}: each must be a pooled sparse feature other than "
                             f"the item's ({features}), and the user tower needs at least one input")
        if not temperature > 0:
            raise ValueError(f"two_tower: temperature={temperature}; use a positive number (model.args.temperature)")
        if not tower_mlp:
            raise ValueError("two_tower: tower_mlp is empty; give the towers' layer sizes, e.g. [128, 64]")
        #: the retrieval contract: the sparse feature that holds a row's item, scored against the catalogue
        self.item_feature = item_feature
        self.user_features: List[str] = users
        self.temperature = float(temperature)
        self.embedding = embeddings.pooled
        device = embeddings.device
        # each feature as wide as its table (its own embedding_dim, or the model's)
        self.user_tower = _tower(num_dense + sum(embeddings.dim_of(f) for f in users), tower_mlp, device)
        self.item_tower = _tower(embeddings.dim_of(item_feature), tower_mlp, device)

    def forward(self, dense: torch.Tensor, sparse) -> Tuple[torch.Tensor, torch.Tensor]:
        pooled = self.embedding(sparse).to_dict()
        user = torch.cat([dense] + [pooled[f] for f in self.user_features], dim=1)
        query = nn.functional.normalize(self.user_tower(user), dim=-1) / self.temperature
        candidate = nn.functional.normalize(self.item_tower(pooled[self.item_feature]), dim=-1)
        return query, candidate


def two_tower(embeddings: Embeddings, schema: DatasetSchema, item_feature: str = "item",
              user_features: Optional[Sequence[str]] = None, tower_mlp: Sequence[int] = (128, 64),
              temperature: float = 0.05) -> TwoTower:
    """The two-tower factory (``model.name: two_tower``)."""
    return TwoTower(embeddings, len(schema.dense), item_feature, user_features, tower_mlp, temperature)
