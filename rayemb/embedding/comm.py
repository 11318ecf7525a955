"""Collective byte accounting: what the training step really sends, by collective and phase.

TorchRec's sharded modules call ``torch.distributed`` collectives from
Python (``dist.all_to_all_single`` for KJT/embedding all-to-alls,
``dist.reduce_scatter_tensor`` / ``dist.all_gather_into_tensor`` for row-wise
pooled outputs, ``dist.all_reduce``), so :class:`CommCounter` wraps those
module attributes while it is active and records each call's payload.
DDP's gradient all-reduce runs in the C++ reducer and never touches
those Python functions; :func:`instrument_ddp` therefore installs a counting
comm hook on every ``DistributedDataParallel`` inside a model (DMP's dense
wrapper and the DDP TorchRec puts around data-parallel embedding lookups).
When the DDP parameters carry in-backward optimizers (TorchRec
``apply_optimizer_in_backward``) DDP installs its own hook lazily; we run
that lazy setup ourselves with a counting wrapper around the hook factory.
A DDP that all-reduces in 16 bits (``train.comm_precision``, DDP's
``bf16_compress_hook`` / ``fp16_compress_hook``, or
:func:`~rayemb.embedding.qcomm.bf16_allreduce_hook`) already issues its
all-reduce from Python, on the 16-bit tensor: the wrapped
``dist.all_reduce`` counts it at its wire size, so it gets no counting hook.

Convention: bytes *sent off this rank*, the amount a bandwidth-optimal
algorithm puts on the wire (W = group size, N = bytes of the local tensor):

* all-to-all: the input chunks addressed to other ranks;
* all-reduce: 2·N·(W-1)/W (ring reduce-scatter + all-gather);
* reduce-scatter: N_in·(W-1)/W (input holds W output chunks);
* all-gather: N_out·(W-1)/W (output holds W input chunks).

Summing over ranks (:meth:`CommCounter.global_bytes`) gives the totals
:func:`rayemb.planner.traffic.predict_table_bytes` predicts. Phase is
``forward`` unless the call runs inside an autograd backward pass.

Example::

    >>> instrument_ddp(model)          # once, before the first forward
    >>> with CommCounter() as cc:
    ...     loss = model(batch).sum(); loss.backward()
    >>> cc.bytes()                     # {"all_to_all": 123456.0, "all_reduce": ...}
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from rayemb.embedding.qcomm import bf16_allreduce_hook

logger = logging.getLogger(__name__)

#: collective families reported (keys of :meth:`CommCounter.bytes`)
COLLECTIVES = ("all_to_all", "all_reduce", "reduce_scatter", "all_gather")
#: phases reported by :meth:`CommCounter.bytes_by_phase`
PHASES = ("forward", "backward")

_LOCK = threading.Lock()
_ACTIVE: List["CommCounter"] = []
_ORIGINALS: Dict[str, Callable[..., Any]] = {}
#: while >0, Python-level collectives are issued by our own DDP hook and already counted
_SUPPRESS = threading.local()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _group_size_rank(group: Any) -> tuple:
    if isinstance(group, str):
        from torch.distributed.distributed_c10d import _resolve_process_group

        group = _resolve_process_group(group)
    return dist.get_world_size(group), dist.get_rank(group)


def _phase() -> str:
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


def _record(name: str, nbytes: float) -> None:
    if getattr(_SUPPRESS, "depth", 0) > 0:
        return
    phase = _phase()
    for c in list(_ACTIVE):
        c._add(name, phase, nbytes)


def _a2a_single_bytes(input: torch.Tensor, input_split_sizes: Optional[Sequence[int]], group: Any) -> float:
    w, rank = _group_size_rank(group)
    if input.dim() == 0 or input.shape[0] == 0:
        return 0.0
    row = _nbytes(input) / input.shape[0]
    if input_split_sizes is None or len(input_split_sizes) == 0:
        return _nbytes(input) * (w - 1) / w
    splits = [int(x) for x in input_split_sizes]
    return float(sum(splits) - splits[rank]) * row


# -- wrappers: each records, then calls the original --


def _w_all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
    _record("all_to_all", _a2a_single_bytes(input, input_split_sizes, group))
    return _ORIGINALS["all_to_all_single"](output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)


def _w_all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    _, rank = _group_size_rank(group)
    _record("all_to_all", float(sum(_nbytes(t) for i, t in enumerate(input_tensor_list) if i != rank)))
    return _ORIGINALS["all_to_all"](output_tensor_list, input_tensor_list, group=group, async_op=async_op)


def _w_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    w, _ = _group_size_rank(group)
    _record("all_reduce", 2.0 * _nbytes(tensor) * (w - 1) / w)
    return _ORIGINALS["all_reduce"](tensor, op=op, group=group, async_op=async_op)


def _w_reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
    _, rank = _group_size_rank(group)
    _record("reduce_scatter", float(sum(_nbytes(t) for i, t in enumerate(input_list) if i != rank)))
    return _ORIGINALS["reduce_scatter"](output, input_list, op=op, group=group, async_op=async_op)


def _w_reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    w, _ = _group_size_rank(group)
    _record("reduce_scatter", _nbytes(input) * (w - 1) / w)
    return _ORIGINALS["reduce_scatter_tensor"](output, input, op=op, group=group, async_op=async_op)


def _w_all_gather(tensor_list, tensor, group=None, async_op=False):
    w, _ = _group_size_rank(group)
    _record("all_gather", float(_nbytes(tensor) * (w - 1)))
    return _ORIGINALS["all_gather"](tensor_list, tensor, group=group, async_op=async_op)


def _w_all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    w, _ = _group_size_rank(group)
    _record("all_gather", float(_nbytes(input_tensor) * (w - 1)))
    return _ORIGINALS["all_gather_into_tensor"](output_tensor, input_tensor, group=group, async_op=async_op)


def _w_funcol_all_to_all_single(self_, output_split_sizes, input_split_sizes, group, tag=""):
    _record("all_to_all", _a2a_single_bytes(self_, input_split_sizes, group))
    return _ORIGINALS["funcol.all_to_all_single"](self_, output_split_sizes, input_split_sizes, group, tag)


_WRAPPERS: Dict[str, Callable[..., Any]] = {
    "all_to_all_single": _w_all_to_all_single,
    "all_to_all": _w_all_to_all,
    "all_reduce": _w_all_reduce,
    "reduce_scatter": _w_reduce_scatter,
    "reduce_scatter_tensor": _w_reduce_scatter_tensor,
    "all_gather": _w_all_gather,
    "all_gather_into_tensor": _w_all_gather_into_tensor,
}


def _install() -> None:
    import torch.distributed._functional_collectives as funcol

    for name, fn in _WRAPPERS.items():
        _ORIGINALS[name] = getattr(dist, name)
        setattr(dist, name, fn)
    _ORIGINALS["funcol.all_to_all_single"] = funcol.all_to_all_single
    funcol.all_to_all_single = _w_funcol_all_to_all_single


def _uninstall() -> None:
    import torch.distributed._functional_collectives as funcol

    for name in _WRAPPERS:
        setattr(dist, name, _ORIGINALS.pop(name))
    funcol.all_to_all_single = _ORIGINALS.pop("funcol.all_to_all_single")


class CommCounter:
    """Context manager recording bytes this rank sends per collective and phase.

    Counters nest (each active one records every call). Per-step figures:
    call :meth:`reset` at the start of a step, read :meth:`bytes` at its end.
    """

    def __init__(self) -> None:
        self._bytes: Dict[str, Dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._calls: Dict[str, int] = defaultdict(int)

    def __enter__(self) -> "CommCounter":
        with _LOCK:
            if not _ACTIVE:
                _install()
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        with _LOCK:
            _ACTIVE.remove(self)
            if not _ACTIVE:
                _uninstall()

    def _add(self, name: str, phase: str, nbytes: float) -> None:
        self._bytes[phase][name] += float(nbytes)
        self._calls[name] += 1

    def reset(self) -> None:
        self._bytes.clear()
        self._calls.clear()

    def bytes(self) -> Dict[str, float]:
        """Bytes this rank sent per collective family (all families present, 0.0 if unused)."""
        return {c: sum(self._bytes[p].get(c, 0.0) for p in PHASES) for c in COLLECTIVES}

    def bytes_by_phase(self) -> Dict[str, Dict[str, float]]:
        """``{"forward": {collective: bytes}, "backward": {...}}``."""
        return {p: {c: self._bytes[p].get(c, 0.0) for c in COLLECTIVES} for p in PHASES}

    def calls(self) -> Dict[str, int]:
        return dict(self._calls)

    def total(self) -> float:
        return sum(self.bytes().values())

    def metrics(self, prefix: str = "bytes/") -> Dict[str, float]:
        """Flat metric dict for MLflow: ``bytes/all_to_all``, ..., ``bytes/forward/all_to_all``, ``bytes/total``."""
        out = {prefix + c: v for c, v in self.bytes().items()}
        for p, d in self.bytes_by_phase().items():
            out.update({f"{prefix}{p}/{c}": v for c, v in d.items()})
        out[prefix + "total"] = self.total()
        return out

    def global_bytes(self, group: Optional[dist.ProcessGroup] = None) -> Dict[str, float]:
        """:meth:`bytes` summed over the ranks of ``group`` (a collective every rank must call; not counted)."""
        vals = self.bytes()
        t = torch.tensor([vals[c] for c in COLLECTIVES], dtype=torch.float64)
        _SUPPRESS.depth = getattr(_SUPPRESS, "depth", 0) + 1
        try:
            dist.all_reduce(t, group=group)
        finally:
            _SUPPRESS.depth -= 1
        return {c: float(v) for c, v in zip(COLLECTIVES, t.tolist())}


# ---- DDP ---- #


def _counting(hook: Callable[..., Any], world_size: int) -> Callable[..., Any]:
    # No annotations: DDP's _check_comm_hook compares them to real types and
    # postponed (string) annotations would fail that check.
    def counted_hook(state, bucket):  # type: ignore[no-untyped-def]
        _record("all_reduce", 2.0 * _nbytes(bucket.buffer()) * (world_size - 1) / world_size)
        _SUPPRESS.depth = getattr(_SUPPRESS, "depth", 0) + 1
        try:
            return hook(state, bucket)
        finally:
            _SUPPRESS.depth -= 1

    return counted_hook


#: DDP comm hooks whose all-reduce is a ``dist.all_reduce`` call on the tensor that crosses the wire
_PYTHON_ALLREDUCE_HOOKS = (default_hooks.bf16_compress_hook, default_hooks.fp16_compress_hook, bf16_allreduce_hook)


def _find_ddps(model: nn.Module, ddp_type: type) -> List[tuple]:
    """Every DDP reachable from ``model``, including those TorchRec keeps in the
    plain-list ``_lookups`` attribute of sharded modules (invisible to ``named_modules``)."""
    found: List[tuple] = []
    seen: set = set()
    stack: List[tuple] = [("", model)]
    while stack:
        prefix, mod = stack.pop()
        for name, m in mod.named_modules(prefix=prefix):
            if id(m) in seen:
                continue
            seen.add(id(m))
            if isinstance(m, ddp_type):
                found.append((name, m))
            lookups = m.__dict__.get("_lookups")
            if isinstance(lookups, (list, tuple)):
                stack.extend((f"{name}._lookups.{i}", x) for i, x in enumerate(lookups) if isinstance(x, nn.Module))
    return found


def instrument_ddp(model: nn.Module) -> int:
    """Install byte-counting comm hooks on every DDP inside ``model``; returns how many.

    Call once per model, after ``DistributedModelParallel`` is built and
    before the first forward (DDP accepts one comm hook, registered before
    training starts). The hooks record into whichever :class:`CommCounter`
    is active and cost nothing otherwise. A DDP with a 16-bit compression
    hook is counted where its hook sends; other DDPs with a hook already
    registered are left alone (logged).
    """
    from torch.distributed.algorithms.ddp_comm_hooks import optimizer_overlap_hooks as ooh
    from torch.nn.parallel import DistributedDataParallel

    n = 0
    for name, m in _find_ddps(model, DistributedDataParallel):
        if getattr(m, "_rayemb_counted", False):
            continue
        w = m.process_group.size()
        if m._comm_hooks and all(h in _PYTHON_ALLREDUCE_HOOKS for h, _ in m._comm_hooks):
            m._rayemb_counted = True  # its dist.all_reduce of the compressed bucket is counted as it is sent
            n += 1
            continue
        if getattr(m, "_lazy_init_ran", False) or m._comm_hooks:
            logger.warning("DDP %r already initialised or hooked; its all-reduce is not counted", name)
            continue
        if any(hasattr(p, "_in_backward_optimizers") for p in m._module_parameters):
            original = ooh._apply_optim_in_backward_hook

            def factory(gradient_is_bucket_view: bool, _orig=original, _w=w):
                return _counting(_orig(gradient_is_bucket_view), _w)

            ooh._apply_optim_in_backward_hook = factory
            try:
                m._lazy_init()
            finally:
                ooh._apply_optim_in_backward_hook = original
        else:
            m.register_comm_hook(m.process_group, _counting(default_hooks.allreduce_hook, w))
        m._rayemb_counted = True
        n += 1
    return n


__all__ = ["COLLECTIVES", "PHASES", "CommCounter", "instrument_ddp"]
