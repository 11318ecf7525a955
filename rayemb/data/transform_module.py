"""The dense transforms as a torch module (:meth:`rayemb.data.transforms.DenseTransforms.module`).

Apart from :mod:`rayemb.data.transforms` so that reading a schema never imports torch. The module scripts
(``torch.jit.script``); the TorchScript export carries it, its vectors as buffers.
"""

from __future__ import annotations

import numpy as np
import torch


class DenseTransformModule(torch.nn.Module):
    """``y = min(max(x, lo), hi); y = log1p(y) where log; (y - shift) * scale``, per column, on ``(B, C)``.

    Example::

        >>> m = torch.jit.script(DenseTransforms.of(schema).module())
        >>> m(torch.tensor([[3.0, -2.0]]))
        tensor([[ 1.3863, -0.8165]])
    """

    def __init__(self, lo: np.ndarray, hi: np.ndarray, log: np.ndarray, shift: np.ndarray,
                 scale: np.ndarray) -> None:
        super().__init__()
        for name, value in (("lo", lo), ("hi", hi), ("shift", shift), ("scale", scale)):
            self.register_buffer(name, torch.tensor(np.asarray(value, np.float32)))
        self.register_buffer("log", torch.tensor(np.asarray(log, bool)))

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        y = torch.minimum(torch.maximum(dense, self.lo), self.hi)
        # log1p of a column that is not log1p's may be NaN (below -1); where() takes the other branch there
        y = torch.where(self.log, torch.log1p(y), y)
        return (y - self.shift) * self.scale
