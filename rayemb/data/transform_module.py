"""The dense transforms as a torch module (:meth:`rayemb.data.transforms.DenseTransforms.module`).

Apart from :mod:`rayemb.data.transforms` so that reading a schema never imports torch. The module scripts
(``torch.jit.script``); the TorchScript export carries it, its vectors as buffers.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


class DenseTransformModule(torch.nn.Module):
    """``y = min(max(x, lo), hi); y = log1p(y) where log; (y - shift) * scale``, per column, on ``(B, C)``;
    :meth:`bucketize` gives the bucketized columns' ids, ``searchsorted(boundaries, x, side='right')``.

    The boundaries of every bucketized column sit in one ``(nb, K)`` buffer padded with ``+inf`` (so one
    batched ``torch.searchsorted`` serves columns of different bucket counts), and ``bucket_max`` caps each
    column's ids at its own ``k`` (an ``x`` of ``+inf`` would otherwise count the padding).

    Example::

        >>> m = torch.jit.script(DenseTransforms.of(schema).module())
        >>> m(torch.tensor([[3.0, -2.0]]))
        tensor([[ 1.3863, -0.8165]])
    """

    def __init__(self, lo: np.ndarray, hi: np.ndarray, log: np.ndarray, shift: np.ndarray,
                 scale: np.ndarray, boundaries: Sequence[np.ndarray] = ()) -> None:
        super().__init__()
        for name, value in (("lo", lo), ("hi", hi), ("shift", shift), ("scale", scale)):
            self.register_buffer(name, torch.tensor(np.asarray(value, np.float32)))
        self.register_buffer("log", torch.tensor(np.asarray(log, bool)))
        width = max((len(b) for b in boundaries), default=0)
        padded = np.full((len(boundaries), width), np.inf, np.float32)
        for i, b in enumerate(boundaries):
            padded[i, :len(b)] = b
        self.register_buffer("boundaries", torch.from_numpy(padded))
        self.register_buffer("bucket_max", torch.tensor([len(b) for b in boundaries], dtype=torch.int64))

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        y = torch.minimum(torch.maximum(dense, self.lo), self.hi)
        # log1p of a column that is not log1p's may be NaN (below -1); where() takes the other branch there
        y = torch.where(self.log, torch.log1p(y), y)
        return (y - self.shift) * self.scale

    @torch.jit.export
    def bucketize(self, values: torch.Tensor) -> torch.Tensor:
        """``(B, nb)`` raw values of the bucketized columns (nulls as 0) -> their ``(B, nb)`` int64 bucket ids."""
        if self.boundaries.size(0) == 0:
            return torch.zeros(values.shape, dtype=torch.int64)
        ids = torch.searchsorted(self.boundaries, values.t().contiguous(), right=True)
        return torch.minimum(ids, self.bucket_max.unsqueeze(1)).t()
