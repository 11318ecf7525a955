"""The TorchScript form of an exported DLRM: the model and its dense transforms in one scripted module.

``forward(dense, sparse)`` takes the dense batch already transformed, as
:class:`~rayemb.data.batching.BatchConverter` gives it (what the scripted form always took);
``forward_raw(dense, sparse)`` takes the raw dense values (nulls as 0) and applies the training
transforms first, with the parameters the job computed (buffers of ``dense_transform``);
``transform_dense(dense)`` is that transform alone.

Example::

    >>> import torchrec  # FBGEMM's ops, which the KJT code calls
    >>> m = torch.jit.load("models/criteo/model.torchscript.pt")
    >>> m.forward_raw(raw_dense, kjt)          # == m(m.transform_dense(raw_dense), kjt)
"""

from __future__ import annotations

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


class ScriptedRanker(torch.nn.Module):
    """``model`` (a DLRM: ``(dense, KJT) -> logits``) with ``dense_transform``
    (:class:`~rayemb.data.transform_module.DenseTransformModule`)."""

    def __init__(self, model: torch.nn.Module, dense_transform: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.dense_transform = dense_transform

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return self.model(dense, sparse)

    @torch.jit.export
    def transform_dense(self, dense: torch.Tensor) -> torch.Tensor:
        return self.dense_transform(dense)

    @torch.jit.export
    def forward_raw(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return self.model(self.dense_transform(dense), sparse)
