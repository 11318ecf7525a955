"""The calibration's dense step: what the job's model adds to a step beyond its embedding tables.

The step-time model prices a plan as its embeddings' cost plus one fixed dense
step (forward, backward and optimizer of everything that is not a table, and
its gradient's all-reduce). That step is measured on the job's own model, built
by its factory around pooled vectors without tables, so a model of the user's
is priced as what it is, not as a DLRM of similar size. It is stepped by the
job's own :class:`~rayemb.train.worker.step.TrainStep`, in the job's precision
(``train.precision: bf16`` runs its forward and loss under bf16 autocast), with the job's dense optimizer
(``train.dense_optimizer``, ``train.weight_decay``): Adam keeps two states per parameter where Adagrad keeps one,
and the step times the optimizer too.
"""

from __future__ import annotations

import functools

from typing import Any, Callable, Sequence, Tuple


def dense_model_step(device: Any, local_batch: int, num_dense: int, num_sparse: int, dim: int,
                     bottom_mlp: Sequence[int], top_mlp: Sequence[int], model: Any = None,
                     schema: Any = None, precision: str = "fp32", dense_optimizer: str = "adagrad",
                     weight_decay: float = 0.0) -> Tuple[Callable[[], None], int]:
    """(one forward + backward + optimizer step of the model's dense part on the local batch, its parameters'
    bytes).

    With ``model`` (the job's :class:`~rayemb.contract.factory.ModelSpec`) and ``schema``, the job's own model
    from its factory, around pooled vectors without tables (:func:`_dense_part`); else a DLRM of the given
    MLPs (TorchRec's arches: what the built-in constants were measured on). ``precision``: the job's
    ``train.precision``, as its :class:`~rayemb.train.worker.step.TrainStep` runs it. ``dense_optimizer`` and
    ``weight_decay``: the job's ``train.dense_optimizer`` and ``train.weight_decay``."""
    import torch

    from rayemb.train.worker.optim import dense_optimizer as make_optimizer
    from rayemb.train.worker.step import StepBatch, TrainStep

    if model is not None and schema is not None:
        return _dense_part(device, local_batch, dim, model, schema, precision, dense_optimizer, weight_decay)
    from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch

    dense_arch = DenseArch(num_dense, list(bottom_mlp), device=device)
    inter = InteractionArch(num_sparse_features=num_sparse)
    over = OverArch(bottom_mlp[-1] + (num_sparse + 1) * num_sparse // 2, list(top_mlp), device=device)
    params = list(dense_arch.parameters()) + list(over.parameters())
    opt = make_optimizer(params, 0.01, dense_optimizer, weight_decay)
    x = torch.randn(local_batch, num_dense, device=device)
    emb = torch.randn(local_batch, num_sparse, dim, device=device, requires_grad=True)
    y = torch.rand(local_batch, device=device).round()
    step = TrainStep(lambda dense, pooled: over(inter(dense_arch(dense), pooled)).squeeze(-1), opt,
                     torch.nn.BCEWithLogitsLoss(), precision=precision)
    batch = StepBatch((x, emb), y)
    return functools.partial(step, batch), sum(p.numel() * p.element_size() for p in params)


def _dense_part(device: Any, local_batch: int, dim: int, spec: Any, schema: Any,
                precision: str = "fp32", dense_optimizer: str = "adagrad",
                weight_decay: float = 0.0) -> Tuple[Callable[[], None], int]:
    """The job's model from its factory, its pooled module replaced by fixed vectors (gradients still flow to
    them, as to an embedding's output): the step times what the model adds to the embeddings' cost."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

    from rayemb.contract.model import Embeddings
    from rayemb.train.worker.losses import job_loss
    from rayemb.train.worker.optim import dense_optimizer as make_optimizer
    from rayemb.train.worker.retrieval import item_feature_of
    from rayemb.train.worker.step import StepBatch, TrainStep

    features = list(schema.pooled_features)  # the order the pooled module returns them
    dims = list(schema.feature_dims(dim))  # a table's own embedding_dim, else the model's

    class _Vectors(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.values = torch.nn.Parameter(torch.randn(local_batch, sum(dims), device=device))

        def forward(self, kjt: Any) -> Any:
            return KeyedTensor(keys=features, length_per_key=dims, values=self.values)

    vectors = _Vectors()
    model, _ = spec.build(Embeddings(vectors, tuple(features), dim, device=device, dims=tuple(dims)), schema)
    model = model.to(device)
    params = [p for p in model.parameters() if p is not vectors.values]
    opt = make_optimizer(params, 0.01, dense_optimizer, weight_decay)
    x = torch.randn(local_batch, len(schema.dense), device=device)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=features, values=torch.zeros(0, dtype=torch.int64, device=device),
                                              lengths=torch.zeros(local_batch * len(features), dtype=torch.int32,
                                                                  device=device))
    tasks = len(schema.labels)
    y = torch.rand(local_batch if tasks == 1 else (local_batch, tasks), device=device).round()
    item = item_feature_of(model)  # a retrieval model: its in-batch softmax over this rank's rows
    loss_fn = job_loss(schema, user_loss=spec.loss, item_feature=item, gather=False)
    step = TrainStep(model, opt, loss_fn, precision=precision)
    batch = StepBatch((x, kjt), None if item else y)
    return functools.partial(step, batch), sum(p.numel() * p.element_size() for p in params)


__all__ = ["dense_model_step"]
