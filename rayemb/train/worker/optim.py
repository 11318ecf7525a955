"""Optimizers of the training loop's embedding rows: fused in the backward for sharded tables, multi-tensor for
replicated ones.

Replicated embedding rows (data-parallel tables, hybrid hot halves) are dense parameters, one per table.
TorchRec's ``RowWiseAdagrad`` updates them one parameter at a time, about ten small ops each: a launch-bound
cost per table that grows with the replicated tables and that no calibration probe sees the same way.
:class:`MultiTensorRowWiseAdagrad` takes the same step for all of them at once: one concatenated row mean per
embedding width (small tables; large ones in place), then ``torch._foreach_*`` ops. Same state (``sum``
``[rows, 1]``, ``step``), same ``state_dict``, the same values bit for bit (``tests/unit/test_optim.py``).

fp16 rows (``model.embedding_dtype: fp16``) keep fp32 optimizer state and take their step in fp32, rounded to
the nearest fp16 on write, as FBGEMM's CPU kernels update fp16 tables: in fp16, Adagrad's ``eps`` (1e-10)
rounds to 0 and a row without gradient becomes 0/0 = NaN, and small gradients' squares underflow.

Adam (``adam``, ``rowwise_adam``) is FBGEMM's ``ADAM`` / ``PARTIAL_ROWWISE_ADAM`` on sharded tables, which
FBGEMM 1.8.0 runs on CUDA only (:mod:`rayemb.embedding.kernels` refuses the CPU placement before the model is
built). Replicated rows take the same math here: ``torch.optim.Adam`` (bias-corrected, ``eps`` outside the
square root, FBGEMM's defaults) and :class:`RowWiseAdam` (FBGEMM's partial row-wise Adam: first moment per
element, second moment per row, the row's mean square gradient). One difference is the kernels' and stays: a
fused kernel updates only the rows of the batch, while a replicated table's optimizer steps every row, so a row
without gradient keeps moving by its decaying first moment.

Example::

    >>> import torch
    >>> p = torch.nn.Parameter(torch.ones(4, 2))
    >>> opt = MultiTensorRowWiseAdagrad([p], lr=0.1)
    >>> p.grad = torch.ones(4, 2)
    >>> _ = opt.step()
    >>> round(float(p[0, 0]), 4)
    0.9
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
from torchrec.optim import RowWiseAdagrad


#: tables of up to this many rows share one concatenated row mean; larger ones (whose own ops outweigh a launch)
#: take theirs in place: copying a large table's gradient into the concatenation costs more than it saves
BATCHED_MAX_ROWS = 4096


def _closure_loss(closure: Any) -> Any:
    """What ``torch.optim.Optimizer.step(closure)`` returns: the closure's loss, computed with gradients on."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def fp32_state(optimizer: torch.optim.Optimizer) -> None:
    """Casts the floating state of the optimizer's low-precision parameters to fp32 (module docstring)."""
    for p, state in optimizer.state.items():
        if p.dtype != torch.float32:
            for k, v in state.items():
                if k != "step" and torch.is_tensor(v) and v.is_floating_point():
                    state[k] = v.float()


class MultiTensorRowWiseAdagrad(RowWiseAdagrad):
    """``torchrec.optim.RowWiseAdagrad`` with its step taken for every parameter at once (module docstring).

    Falls back to TorchRec's per-parameter step where the group asks for what the fast path does not do
    (weight decay, lr decay, maximize, complex or sparse gradients).
    """

    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        fp32_state(self)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = _closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad.float() for p in params]  # fp32 rows: the gradient itself, no copy
            if (group["weight_decay"] or group["lr_decay"] or group["maximize"]
                    or any(g.is_sparse or g.is_complex() or g.dim() != 2 for g in grads)):
                self._step_group_per_param(group)
                continue
            states = [self.state[p] for p in params]
            torch._foreach_add_([s["step"] for s in states], 1)
            sums = [s["sum"] for s in states]
            by_width: Dict[int, List[int]] = {}
            for i, g in enumerate(grads):
                if g.shape[0] > BATCHED_MAX_ROWS:  # large: its own ops cost more than their launch; no copy
                    sums[i].add_(g.pow(2).mean(dim=1, keepdim=True))
                else:
                    by_width.setdefault(g.shape[1], []).append(i)
            for idx in by_width.values():
                # the rows' mean square of every small table of this width in one op; mean over dim 1 row by
                # row, as RowWiseAdagrad's grad.pow(2).mean(axis=1)
                square = torch.cat([grads[i] for i in idx]).pow(2).mean(dim=1, keepdim=True)
                torch._foreach_add_([sums[i] for i in idx],
                                    list(square.split([grads[i].shape[0] for i in idx])))
            std = torch._foreach_sqrt(sums)
            torch._foreach_add_(std, group["eps"])
            weights = [p.float() for p in params]  # fp16 rows: stepped in fp32, written back rounded
            torch._foreach_addcdiv_(weights, grads, std, value=-group["lr"])
            half = [i for i, p in enumerate(params) if p.dtype != torch.float32]
            if half:
                torch._foreach_copy_([params[i] for i in half], [weights[i] for i in half])
        return loss

    def _step_group_per_param(self, group: Dict[str, Any]) -> None:
        """TorchRec's own step for one parameter group."""
        saved = self.param_groups
        self.param_groups = [group]
        try:
            RowWiseAdagrad.step(self)
        finally:
            self.param_groups = saved


class RowWiseAdam(torch.optim.Optimizer):
    """FBGEMM's ``PARTIAL_ROWWISE_ADAM`` for dense 2-D rows: ``exp_avg`` ``[rows, D]``, ``exp_avg_sq`` ``[rows, 1]``
    (the row's mean square gradient), bias-corrected as ``torch.optim.Adam``; fp32 state for fp16 rows."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: Any = (0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps})
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p].update(step=torch.zeros((), dtype=torch.float32),
                                     exp_avg=torch.zeros(p.shape, dtype=torch.float32, device=p.device),
                                     exp_avg_sq=torch.zeros((p.shape[0], 1), dtype=torch.float32, device=p.device))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = _closure_loss(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.float()
                state = self.state[p]
                state["step"] += 1
                t = float(state["step"])
                state["exp_avg"].mul_(beta1).add_(g, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).add_(g.pow(2).mean(dim=1, keepdim=True), alpha=1 - beta2)
                denom = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
                w = p.float()
                w.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / (1 - beta1 ** t))
                if w is not p:
                    p.copy_(w)
        return loss


class Fp32StateAdam(torch.optim.Adam):
    """``torch.optim.Adam`` with its state made at construction, fp32 for fp16 rows (as :class:`Fp32StateAdagrad`):
    torch makes it at the first step, and a checkpoint loaded before that step finds no state to load into."""

    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        for group in self.param_groups:
            for p in group["params"]:
                # torch's own first-step state for a CPU, non-capturable, non-fused group, in fp32
                self.state[p].update(step=torch.zeros((), dtype=torch.float32),
                                     exp_avg=torch.zeros(p.shape, dtype=torch.float32, device=p.device),
                                     exp_avg_sq=torch.zeros(p.shape, dtype=torch.float32, device=p.device))
        if any(p.dtype != torch.float32 for g in self.param_groups for p in g["params"]):
            for g in self.param_groups:
                g["foreach"] = False


class Fp32StateAdagrad(torch.optim.Adagrad):
    """``torch.optim.Adagrad`` whose state is fp32 for fp16 rows; its per-tensor step promotes each update to
    fp32 and rounds it into the fp16 row (module docstring)."""

    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        fp32_state(self)
        if any(p.dtype != torch.float32 for g in self.param_groups for p in g["params"]):
            for g in self.param_groups:  # the multi-tensor step (CUDA's default) wants one dtype per param and state
                g["foreach"] = False


def embedding_optimizer(name: str, replicated: bool = False) -> Any:
    """The optimizer class of ``train.embedding_optimizer``: for sharded tables (TorchRec maps the class onto
    FBGEMM's fused optimizer) or, ``replicated``, for replicated embedding rows."""
    from torchrec.optim import Adam, PartialRowWiseAdam

    if name == "rowwise_adagrad":
        return MultiTensorRowWiseAdagrad if replicated else RowWiseAdagrad
    if name == "adam":
        return Fp32StateAdam if replicated else Adam
    if name == "rowwise_adam":
        return RowWiseAdam if replicated else PartialRowWiseAdam
    return {"adagrad": Fp32StateAdagrad if replicated else torch.optim.Adagrad, "sgd": torch.optim.SGD}[name]


def dense_optimizer(params: Any, lr: float, name: str = "adagrad", weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The dense parameters' optimizer of ``train.dense_optimizer``, fused where torch has a fused kernel: one
    kernel steps every parameter (torch's default on a CPU loops over them, about ten operators each, and reads
    each step count back with ``item()``). ``weight_decay``: AdamW's decoupled decay, the others' L2 term."""
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=weight_decay, fused=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, fused=True)
    raise ValueError(f"unknown dense optimizer {name!r}")


__all__ = ["Fp32StateAdagrad", "Fp32StateAdam", "MultiTensorRowWiseAdagrad", "RowWiseAdam", "dense_optimizer",
           "embedding_optimizer", "fp32_state"]
