"""Retrieval models: the in-batch sampled softmax they train with, and hit rate@K over the whole catalogue.

A retrieval model (``rayemb.models.two_tower``, or a user's) names the pooled
sparse feature that holds a row's item in ``model.item_feature`` and returns
``(query, candidate)``, two ``(B, d)`` tensors whose dot product is the pair's
score; the candidate must depend on the item feature alone, so that the
catalogue's vectors can be computed from item ids.

**Loss** (:class:`InBatchSoftmax`): every row's candidate is its positive and
the candidates of every other row of the global batch (all ranks' rows,
gathered with their gradients) are its negatives. A popular item is a
negative more often than a rare one, which a plain softmax over such samples
learns as a penalty on popularity; the logQ correction subtracts each
candidate's log sampling probability ``log q(item)`` from its logits (Yi et
al., RecSys 2019). ``q`` is the item's share of the train split's rows, read
from the statistics pass (:func:`item_log_q`). A negative that is the row's
own item (the same item twice in a batch) is masked out.

**Validation** (:func:`evaluate_retrieval`): the item tower scores every id of
the item table (the catalogue, split across the ranks and gathered); each
validation row's query is scored against all of it, and the row is a hit at
``K`` when fewer than ``K`` items score above its own item. With one held-out
item per row, hit rate@K is also recall@K. ``valid_hit_rate_at_50`` is what
early stopping and the best checkpoint follow.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from rayemb.batch_shape import BatchShape
from rayemb.errors import ConfigError

#: the cut-offs validation reports hit rate at
HIT_RATE_KS = (10, 50, 100)
#: the metric a retrieval job's early stopping and best checkpoint follow
RETRIEVAL_METRIC = "valid_hit_rate_at_50"


def item_feature_of(model: Any) -> Optional[str]:
    """The item feature of a retrieval model (its ``item_feature``), None for a ranking model; ``model`` may
    be wrapped by ``DistributedModelParallel``."""
    inner = getattr(model, "module", model) if type(model).__name__ == "DistributedModelParallel" else model
    item = getattr(inner, "item_feature", None)
    return item if isinstance(item, str) else None


def item_log_q(table: Any, num_embeddings: int) -> np.ndarray:
    """``log q(id)`` for every id of a table: its share of the table's values in the train split.

    ``table``: the item column's :class:`~rayemb.data.stats_types.TableStats`, its own counts even where a history
    column reads the same table (the sampling is of the item column's ids). Ids among its heavy hitters get their
    counted share (exact when the table has no more distinct ids than the statistics kept counters, as with
    MovieLens); the ids not listed share the rest of the values equally (which of them were seen is not
    known); when the listed ids hold every value, the others get half the smallest share (they never are
    in-batch candidates, so the value only keeps the logits finite).
    """
    counts = np.zeros(num_embeddings, dtype=np.float64)
    hh = np.asarray(table.heavy_hitters).reshape(-1, 2)
    hh = hh[(hh[:, 0] >= 0) & (hh[:, 0] < num_embeddings)]
    counts[hh[:, 0]] = hh[:, 1]
    listed = float(counts.sum())
    total = max(float(table.values), listed, 1.0)
    others = int(table.distinct) - len(hh)
    unlisted = counts == 0
    if total > listed and others > 0 and unlisted.any():  # which unlisted ids were seen is not known: all share
        counts[unlisted] = (total - listed) / int(unlisted.sum())
    positive = counts[counts > 0]
    counts = np.maximum(counts, 0.5 * positive.min() if positive.size else 1.0)
    return np.log(counts / total).astype(np.float32)


def towers(output: Any) -> Tuple[Any, Any]:
    """``(query, candidate)`` of a retrieval model's output, else ConfigError ``bad_model_output``."""
    if not (isinstance(output, (tuple, list)) and len(output) == 2 and all(o.dim() == 2 for o in output)
            and output[0].shape == output[1].shape):
        shapes = [tuple(o.shape) for o in output] if isinstance(output, (tuple, list)) else type(output).__name__
        raise ConfigError(f"A retrieval model (one with item_feature) returns (query, candidate), two (B, d) "
                          f"tensors; this one returned {shapes}.", "bad_model_output")
    return output[0], output[1]


def _gather_rows(x: Any) -> Any:
    """Every rank's ``x`` (equal shapes), concatenated by rank, with gradients: the backward sums each rank's
    gradient of the gathered rows and keeps this rank's slice. (An all-reduce: gloo has no reduce-scatter,
    and torch's own autograd all-gather is deprecated.)"""
    import torch
    import torch.distributed as dist

    class _Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, local: Any) -> Any:
            parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, local.contiguous())
            ctx.rows = local.shape[0]
            return torch.cat(parts)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            grad = grad.contiguous()
            dist.all_reduce(grad)
            start = dist.get_rank() * ctx.rows
            return grad[start: start + ctx.rows]

    return _Gather.apply(x)


class InBatchSoftmax:
    """``loss((query, candidate), item_ids)``: sampled softmax over the global batch's candidates, logQ-corrected.

    ``log_q``: :func:`item_log_q` of the item table (None: no correction). ``item_ids`` (the rows' item ids,
    before any hybrid remap) may be None (then neither the correction nor the same-item mask apply: the plan
    probe's synthetic batches). Runs on one process or over the default process group (``gather=False``:
    this rank's rows only, for a measurement that runs on one rank).
    """

    def __init__(self, log_q: Optional[np.ndarray] = None, gather: bool = True) -> None:
        self._log_q, self._gather = log_q, gather
        self._on_device: Dict[Any, Any] = {}

    def _log_q_on(self, device: Any) -> Any:
        import torch

        if device not in self._on_device:
            self._on_device[device] = torch.from_numpy(np.asarray(self._log_q)).to(device)
        return self._on_device[device]

    def __call__(self, output: Any, item_ids: Any = None) -> Any:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        query, candidate = towers(output)
        rows = query.shape[0]
        offset, candidates, ids = 0, candidate, item_ids
        if self._gather and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # every rank's candidates are negatives here; their gradients flow back to the rank that made them
            candidates = _gather_rows(candidate)
            offset = dist.get_rank() * rows
            if item_ids is not None:
                parts = [torch.empty_like(item_ids) for _ in range(dist.get_world_size())]
                dist.all_gather(parts, item_ids.contiguous())
                ids = torch.cat(parts)
        logits = query @ candidates.t()  # (B, world * B)
        own = torch.arange(rows, device=logits.device) + offset
        if ids is not None:
            if self._log_q is not None:
                logits = logits - self._log_q_on(logits.device)[ids].to(logits.dtype)
            same = ids.unsqueeze(0) == item_ids.unsqueeze(1)
            same[torch.arange(rows, device=logits.device), own] = False
            logits = logits.masked_fill(same, float("-inf"))
        return F.cross_entropy(logits, own)


def catalogue_vectors(model: Any, candidates: Callable[..., Any], num_items: int, batch_size: int,
                      device: Any) -> Any:
    """``(num_items, d)``: the model's candidate vector of every item id, on every rank.

    The ids are dealt to the ranks in rounds of ``batch_size`` per rank (the last ones padded: every rank runs
    the same forwards), each round's vectors all-gathered. ``candidates(ids, pad_to)`` makes a batch whose
    item feature holds ``ids`` and every other input is empty (``BatchConverter.candidates``).
    """
    import torch
    import torch.distributed as dist

    from rayemb.contract.model import model_inputs

    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    per_round = BatchShape(batch_size, world).global_size
    out = []
    for start in range(0, num_items, per_round):
        lo = min(num_items, start + rank * batch_size)
        ids = np.arange(lo, min(num_items, lo + batch_size), dtype=np.int64)
        _, vectors = model(*model_inputs(candidates(ids, pad_to=batch_size), device))
        if world > 1:
            parts = [torch.empty_like(vectors) for _ in range(world)]
            dist.all_gather(parts, vectors.contiguous())
            vectors = torch.cat(parts)
        out.append(vectors[: min(per_round, num_items - start)])
    return torch.cat(out)


def evaluate_retrieval(model: Any, batches: Any, device: Any, candidates: Callable[..., Any], num_items: int,
                       batch_size: int, ks: Sequence[int] = HIT_RATE_KS) -> Dict[str, float]:
    """Hit rate@K of every validation row (``batches``: :func:`rayemb.train.worker.validation.eval_batches`) against
    the whole catalogue of ``num_items`` ids, all ranks together."""
    import torch
    import torch.distributed as dist

    from rayemb.contract.model import model_inputs

    catalogue = catalogue_vectors(model, candidates, num_items, batch_size, device)
    cut = torch.tensor(list(ks), device=device)
    hits = torch.zeros(len(ks), dtype=torch.float64, device=device)
    rows = torch.zeros(1, dtype=torch.float64, device=device)
    for batch in batches:
        query, _ = model(*model_inputs(batch, device))
        scores = query @ catalogue.t()  # (B, num_items)
        ids = batch.ids.to(device)
        keep = ids >= 0 if batch.mask is None else batch.mask.to(device)
        own = scores.gather(1, ids.clamp(min=0).unsqueeze(1))
        above = (scores > own).sum(dim=1)  # items scored higher than the row's own: its rank, 0-based
        hits += ((above.unsqueeze(1) < cut.unsqueeze(0)) & keep.unsqueeze(1)).sum(dim=0).double()
        rows += keep.sum().double()
    if dist.is_initialized():
        dist.all_reduce(hits)
        dist.all_reduce(rows)
    n = float(rows.item())
    out = {f"valid_hit_rate_at_{k}": float(h) / n if n else float("nan") for k, h in zip(ks, hits.tolist())}
    out["valid_rows"] = n
    out["catalogue_items"] = float(num_items)
    return out


__all__ = ["InBatchSoftmax", "towers", "item_log_q", "item_feature_of", "catalogue_vectors",
           "evaluate_retrieval", "HIT_RATE_KS", "RETRIEVAL_METRIC"]
