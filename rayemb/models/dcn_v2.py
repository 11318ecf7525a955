"""DCN-v2 (Wang et al., 2021, arXiv:2008.13535): a cross network over the embeddings, then a deep network.

``x0 = [bottom MLP(dense), v_1, ..., v_F]`` concatenated (the ``v_i`` of any widths: each its
table's dim, :attr:`rayemb.Embeddings.dims`); each cross layer
computes ``x_{l+1} = x0 * (W_l x_l + b_l) + x_l`` (TorchRec's ``CrossNet``; with
``low_rank`` set, ``W_l = U_l V_l``, its ``LowRankCrossNet``), so ``L`` layers
hold feature crosses up to degree ``L + 1``; an MLP on the crossed vector gives
the logit (the paper's "stacked" structure).

Select it with ``model.name: dcn_v2``; ``model.args`` sets its sizes::

    model:
      name: dcn_v2
      args: {cross_layers: 3, low_rank: null, bottom_mlp: [64, 16], deep_mlp: [128, 64]}
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import nn
from torchrec.modules.crossnet import CrossNet, LowRankCrossNet
from torchrec.modules.mlp import MLP

from rayemb import DatasetSchema, Embeddings


class DCNv2(nn.Module):
    def __init__(self, embeddings: Embeddings, num_dense: int, cross_layers: int = 3, low_rank: Optional[int] = None,
                 bottom_mlp: Sequence[int] = (64, 16), deep_mlp: Sequence[int] = (128, 64), tasks: int = 1) -> None:
        super().__init__()
        if cross_layers < 1:
            raise ValueError(f"dcn_v2: cross_layers={cross_layers}; use 1 or more (model.args.cross_layers)")
        device = embeddings.device
        self.embedding = embeddings.pooled
        self.features: List[str] = list(embeddings.features)
        self.bottom = MLP(num_dense, list(bottom_mlp), device=device)
        width = bottom_mlp[-1] + sum(embeddings.dim_of(f) for f in self.features)
        cross = CrossNet(width, cross_layers) if low_rank is None else LowRankCrossNet(width, cross_layers, low_rank)
        self.cross = cross.to(device)  # TorchRec's cross nets take no device argument
        self.deep = MLP(width, list(deep_mlp), device=device)
        self.logit = nn.Linear(deep_mlp[-1], tasks, device=device)  # one logit per label column

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:
        pooled = self.embedding(sparse).to_dict()
        x0 = torch.cat([self.bottom(dense)] + [pooled[f] for f in self.features], dim=1)
        return self.logit(self.deep(self.cross(x0))).squeeze(-1)


def dcn_v2(embeddings: Embeddings, schema: DatasetSchema, cross_layers: int = 3, low_rank: Optional[int] = None,
           bottom_mlp: Sequence[int] = (64, 16), deep_mlp: Sequence[int] = (128, 64)) -> DCNv2:
    """The DCN-v2 factory (``model.name: dcn_v2``)."""
    return DCNv2(embeddings, len(schema.dense), cross_layers, low_rank, bottom_mlp, deep_mlp, len(schema.labels))
