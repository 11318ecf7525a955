"""Pieces the distributed equivalence tests share: a KJT slice of generated bags, and a tiny model head.

``feats`` maps a feature name to ``(lengths, values, weights or None)`` numpy arrays over the
whole global batch; :func:`kjt_slice` cuts rows ``[lo, hi)`` of every feature into one
``KeyedJaggedTensor`` (key-major, as TorchRec expects), so each rank takes its own rows and the
reference takes them all. :class:`HeadModel` puts a linear head on any module that maps a KJT to
a ``KeyedTensor`` (an EBC, rayemb's hybrid or compressed embeddings).
"""

from __future__ import annotations

import numpy as np
import torch


def kjt_slice(feats, lo: int, hi: int):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys, vals, lens, ws = [], [], [], []
    for k, (lengths, values, w) in feats.items():
        offs = np.concatenate([[0], np.cumsum(lengths)])
        keys.append(k)
        lens.append(lengths[lo:hi])
        vals.append(values[offs[lo]:offs[hi]])
        if w is not None:
            ws.append(w[offs[lo]:offs[hi]])
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.from_numpy(np.concatenate(vals)), lengths=torch.from_numpy(np.concatenate(lens)),
        weights=torch.from_numpy(np.concatenate(ws)) if ws else None,
    )


class HeadModel(torch.nn.Module):
    """``sparse`` (KJT -> KeyedTensor) followed by ``Linear(in_dim, 1)``: a logit per row."""

    def __init__(self, sparse: torch.nn.Module, in_dim: int) -> None:
        super().__init__()
        self.sparse = sparse
        self.head = torch.nn.Linear(in_dim, 1)

    def forward(self, kjt) -> torch.Tensor:
        return self.head(self.sparse(kjt).values()).squeeze(1)
