"""Validation scores every row of the valid split, on any world size.

Three parts make that hold:

* **the split** (:class:`ValidationDataConfig`): Ray Train hands every dataset
  out with ``streaming_split(equal=True)``, which drops up to ``world - 1``
  rows so that ranks get equal counts. The valid split is split with
  ``equal=False`` instead: no row is dropped, and ranks may get unequal
  shares (a small split can leave a rank none at all). A split small enough
  for the driver to hold (:mod:`rayemb.train.held_splits`) is sliced the same
  way by each rank: every row, shares within one row of each other.
* **the batches**: the valid split keeps each rank's last, partial batch
  (``RankBatches(drop_last=False)``), padded to the full local batch by the
  converter (:mod:`rayemb.data.batching`). The sharded model's input exchange
  assumes the same batch size on every rank, so a rank whose shard has run
  dry feeds padding-only batches until no rank has a batch left: every rank
  runs the same number of forward passes.
* **the metrics** (:func:`evaluate`): padding rows carry ``Batch.mask`` False
  and are dropped before the metrics are computed over every rank's rows
  together (:mod:`rayemb.train.worker.dist_metrics`: exact AUC and GAUC, each row's score
  sent once), so AUC, logloss, NE, calibration, GAUC and ``valid_rows`` are those of the
  real rows. GAUC needs each row's group: the valid split's converter keeps the schema's
  ``group`` column (``Batch.groups``), the train split's does not read it.

Training batches are unaffected: they stay full (``drop_last=True``) and the
train split keeps Ray Train's equal split.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
from ray.train import DataConfig

from rayemb.constants import VALID_SPLIT


def validates_mid_epoch(step: int, epoch_step: int, epoch_steps: int, eval_every: Optional[int]) -> bool:
    """Whether the training loop validates after global ``step``, the ``epoch_step``-th of its epoch's
    ``epoch_steps``: at every multiple of ``eval_every`` (``train.eval_every_n_steps``), except at an epoch's last
    step, where the end-of-epoch validation stands for it."""
    return bool(eval_every) and step % eval_every == 0 and epoch_step < epoch_steps


def validation_count(epochs: int, steps_per_epoch: int, eval_every: Optional[int]) -> int:
    """How many validations a job that trains all its epochs makes: one at each epoch's end and one at each step
    :func:`validates_mid_epoch` names."""
    mid = 0
    if eval_every:
        for epoch in range(epochs):
            base = epoch * steps_per_epoch
            mid += sum(validates_mid_epoch(base + k, k, steps_per_epoch, eval_every)
                       for k in range(eval_every - base % eval_every, steps_per_epoch + 1, eval_every))
    return epochs + mid


class ValidationDataConfig(DataConfig):
    """Ray Train's dataset sharding, except that the valid split is split without dropping rows."""

    def configure(self, datasets: Dict[str, Any], world_size: int, worker_handles: Any, worker_node_ids: Any,
                  **kwargs: Any) -> List[Dict[str, Any]]:
        others = {name: ds for name, ds in datasets.items() if name != VALID_SPLIT}
        out = super().configure(others, world_size, worker_handles, worker_node_ids, **kwargs)
        if VALID_SPLIT in datasets:
            ds = datasets[VALID_SPLIT]
            if ds.name is None:
                ds.set_name(VALID_SPLIT)
            ds = ds.copy(ds)
            ds.context.execution_options = self._resolve_execution_options(VALID_SPLIT)
            hints = worker_node_ids if self._enable_shard_locality else None
            for rank, split in enumerate(ds.streaming_split(world_size, equal=False, locality_hints=hints)):
                out[rank][VALID_SPLIT] = split
        return out


def _any_has(has_batch: bool, device: Any) -> bool:
    """Whether some rank still has a batch (every rank calls it alike)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if has_batch else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _longest_shard(data: Any, device: Any) -> Optional[int]:
    """For in-memory data: the most batches any rank holds, agreed once; None if streamed."""
    if data.needs_step_check:
        return None
    import torch
    import torch.distributed as dist

    n = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return int(n.item())


def eval_batches(data: Any, device: Any, padding: Callable[[], Any], max_steps: Optional[int] = None) -> Iterator[Any]:
    """This rank's validation batches, then padding-only ones while another rank still has a batch: every rank
    yields as many (``max_steps``: at most that many)."""
    it = data.epoch(0)
    agreed = _longest_shard(data, device)
    limit = agreed if max_steps is None else (max_steps if agreed is None else min(agreed, max_steps))
    filler = None
    steps = 0
    while limit is None or steps < limit:
        batch = next(it, None)
        if agreed is None and not _any_has(batch is not None, device):
            break
        if batch is None:  # this shard ran dry: padding keeps this rank in the others' collectives
            filler = batch = filler if filler is not None else padding()
        yield batch
        steps += 1


def evaluate(model: Any, data: Any, device: Any, padding: Callable[[], Any],
             max_steps: Optional[int] = None, tasks: Optional[Sequence[str]] = None,
             primary: Optional[str] = None, retrieval: Optional[Dict[str, Any]] = None,
             task_types: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """AUC, logloss, NE, calibration, GAUC (batches with ``Batch.groups``) and row count of ``model`` on every row
    of a split's :class:`RankBatches`, all ranks together.

    Args:
        data: this rank's batches, their last one padded (``Batch.mask``).
        padding: a batch of padding rows only (``BatchConverter.padding``), fed while this rank has no batch
            left and another rank has.
        max_steps: score at most this many batches per rank.
        tasks, primary: the label columns of a multi-task model and the one ``valid_auc`` reports
            (:func:`rayemb.train.worker.metrics.validation_metrics`).
        task_types: each task's ``binary`` or ``regression`` (None: every task binary); batches with
            ``Batch.weights`` (schema.yaml ``weight``) give weighted metrics.
        retrieval: for a retrieval model, :func:`rayemb.train.worker.retrieval.evaluate_retrieval`'s ``candidates``,
            ``num_items`` and ``batch_size``: hit rate@K over the catalogue instead of AUC.
    """
    import torch

    from rayemb.contract.model import model_inputs
    from rayemb.train.worker.dist_metrics import distributed_validation_metrics
    from rayemb.train.worker.retrieval import evaluate_retrieval

    model.eval()
    logits: List[np.ndarray] = []
    labels: List[np.ndarray] = []
    groups: List[np.ndarray] = []
    weights: List[np.ndarray] = []
    batches = eval_batches(data, device, padding, max_steps)
    with torch.no_grad():
        if retrieval is not None:
            out = evaluate_retrieval(model, batches, device, **retrieval)
            model.train()
            return out
        for batch in batches:
            out = model(*model_inputs(batch, device)).float().cpu().numpy()
            y = batch.labels.numpy()
            g = None if batch.groups is None else batch.groups.numpy()
            w = None if getattr(batch, "weights", None) is None else batch.weights.numpy()
            if batch.mask is not None:
                keep = batch.mask.numpy()
                out, y = out[keep], y[keep]
                g, w = None if g is None else g[keep], None if w is None else w[keep]
            logits.append(out)
            labels.append(y)
            if g is not None:
                groups.append(g)
            if w is not None:
                weights.append(w)
    model.train()
    z = np.concatenate(logits) if logits else np.zeros(0, np.float32)
    y = np.concatenate(labels) if labels else np.zeros(0, np.float32)
    # every rank runs as many batches (padding ones keep groups too): all ranks pass groups or none does
    g = np.concatenate(groups) if groups else None
    w = np.concatenate(weights) if weights else None  # likewise: a weight column reaches every batch or none
    return distributed_validation_metrics(y, z, tasks, primary, groups=g, task_types=task_types,
                                          weights=w)  # exact, each row's score sent once


__all__ = ["ValidationDataConfig", "evaluate", "eval_batches"]
