"""DeepFM (Guo et al., 2017) as a model of your own: written outside the rayemb package, on its public API.

rayemb builds the embedding tables from the job's plan (data-parallel, sharded,
hybrid hot/cold) and hands them to this factory; the model only says what to do
with the pooled vectors. Train it on the default synthetic job, from the
repository root::

    rayemb train --config jobs/configs/synth_small.yaml \\
        --set model.factory=examples.deepfm:deepfm --set "model.args={hidden: [64, 32]}"

The model: each dense feature vector projected to the embedding dim joins the
sparse features' vectors ``v_1 .. v_F``; a factorization machine sums their
pairwise dot products, ``0.5 * ((Σ v)² - Σ v²)``, and an MLP reads them all,
concatenated; the logit is the sum of the two.

Tables may have widths of their own (schema.yaml ``embedding_dim``, ``Embeddings.dims``): the dot products need
one width, so a vector of another width enters the factorization machine through a learned linear map to
``model.embedding_dim``, and the MLP reads every vector at its own width.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from rayemb import DatasetSchema, Embeddings


class DeepFM(nn.Module):
    def __init__(self, embeddings: Embeddings, num_dense: int, hidden: Sequence[int] = (64, 32)) -> None:
        super().__init__()
        self.embedding = embeddings.pooled  # held as a submodule: rayemb shards and checkpoints it in place
        self.features = list(embeddings.features)
        dim, device = embeddings.dim, embeddings.device
        self.dense_projection = nn.Linear(num_dense, dim, device=device)
        # only the features of another width: with one width for all, the model's parameters are DeepFM's own
        self.to_fm_dim = nn.ModuleDict({f: nn.Linear(d, dim, bias=False, device=device)
                                        for f, d in zip(self.features, embeddings.dims) if d != dim})
        layers, width = [], dim + embeddings.pooled_width
        for size in hidden:
            layers += [nn.Linear(width, size, device=device), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1, device=device))
        self.deep = nn.Sequential(*layers)

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:
        pooled = self.embedding(sparse).to_dict()
        vectors = [self.dense_projection(dense)] + [pooled[f] for f in self.features]
        fm_vectors = torch.stack(vectors[:1] + [self.to_fm_dim[f](pooled[f]) if f in self.to_fm_dim else pooled[f]
                                                for f in self.features], dim=1)  # (B, F+1, D)
        fm = 0.5 * (fm_vectors.sum(dim=1).pow(2) - fm_vectors.pow(2).sum(dim=1)).sum(dim=1)
        return fm + self.deep(torch.cat(vectors, dim=1)).squeeze(-1)


def deepfm(embeddings: Embeddings, schema: DatasetSchema, hidden: Sequence[int] = (64, 32)) -> DeepFM:
    """The factory rayemb calls on every rank (``model.factory: examples.deepfm:deepfm``)."""
    return DeepFM(embeddings, num_dense=len(schema.dense), hidden=hidden)
