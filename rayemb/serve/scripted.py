"""The TorchScript form of an exported DLRM: the model and its dense transforms in one scripted module.

``forward(dense, sparse)`` takes the dense batch already transformed, as
:class:`~rayemb.data.batching.BatchConverter` gives it (what the scripted form always took);
``forward_raw(dense, sparse)`` takes the raw dense values (nulls as 0) and applies the training
transforms first, with the parameters the job computed (buffers of ``dense_transform``);
``transform_dense(dense)`` is that transform alone. A schema with bucketized columns (``bucketize``,
:mod:`rayemb.data.transforms`) gives ``forward_raw`` their raw values too, as the last columns of ``dense``
(``bucket_keys`` order), and leaves their features out of ``sparse``: their bucket ids are computed here
and their bags (one id per row) appended to the KJT, where the model's feature order has them, last.

Example::

    >>> import torchrec  # FBGEMM's ops, which the KJT code calls
    >>> m = torch.jit.load("models/criteo/model.torchscript.pt")
    >>> m.forward_raw(raw_dense, kjt)          # == m(m.transform_dense(raw_dense), kjt)
"""

from __future__ import annotations

from typing import List, Sequence

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


class ScriptedRanker(torch.nn.Module):
    """``model`` (a DLRM: ``(dense, KJT) -> logits``) with ``dense_transform``
    (:class:`~rayemb.data.transform_module.DenseTransformModule`) and the bucketized columns' feature names,
    ``bucket_keys``."""

    # a real type, not the string `from __future__ import annotations` makes: TorchScript reads it to type the
    # list, which may be empty
    __annotations__ = {"bucket_keys": List[str]}

    def __init__(self, model: torch.nn.Module, dense_transform: torch.nn.Module,
                 bucket_keys: Sequence[str] = ()) -> None:
        super().__init__()
        self.model = model
        self.dense_transform = dense_transform
        self.bucket_keys = list(bucket_keys)
        self.num_dense = int(dense_transform.lo.numel())

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return self.model(dense, sparse)

    @torch.jit.export
    def transform_dense(self, dense: torch.Tensor) -> torch.Tensor:
        return self.dense_transform(dense)

    @torch.jit.export
    def forward_raw(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        if len(self.bucket_keys) == 0:
            return self.model(self.dense_transform(dense), sparse)
        ids = self.dense_transform.bucketize(dense[:, self.num_dense:])
        # key-major: every row's id of the first bucketized feature, then the second's
        sparse = KeyedJaggedTensor(
            keys=sparse.keys() + self.bucket_keys,
            values=torch.cat([sparse.values(), ids.t().reshape(-1).to(sparse.values().dtype)]),
            lengths=torch.cat([sparse.lengths(), torch.ones(ids.numel(), dtype=sparse.lengths().dtype)]))
        return self.model(self.dense_transform(dense[:, :self.num_dense]), sparse)
