"""``train.compile: dense``: ``torch.compile`` of the model's dense part, each piece falling back to eager alone.

On a GPU the step is launch-bound: many small kernels, each launched from Python. Compiling fuses the dense
layers' kernels and, with ``mode="reduce-overhead"``, replays them as CUDA graphs. The embedding modules stay
eager: their sharded lookups and input exchanges vary in shape from batch to batch, and FBGEMM's kernels are
already fused. So :func:`compile_dense` compiles, in place, the largest submodules of the model that hold
parameters and no embedding module (the DLRM's bottom and top MLPs; a model of one's own, its dense children),
looking through ``DistributedModelParallel`` and its DDP wrapper. Parameter names, checkpoints and the
optimizers are unchanged: the same modules, only their calls go through the compiled code.

A compile error surfaces at the module's first call (and at a recompile). Each compiled module falls back to
its eager call on its own: the error is logged once as a warning naming the module, the call is rerun eagerly,
and the module stays eager from then on (an error of the module itself then comes from its eager call, as
without compiling). The backward is compiled together with the forward, so that its errors surface there too.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Tuple

from rayemb.config import COMPILE_MODES

logger = logging.getLogger(__name__)

#: where rayemb's own embedding modules live (hybrid, compressed, raw-id tables): each holds table rows
_RAYEMB_EMBEDDING_PACKAGE = "rayemb.embedding"
#: TorchRec's sharded modules and their lookups, and its managed-collision modules
_TORCHREC_EMBEDDING_PACKAGES = ("torchrec.distributed.", "torchrec.modules.mc_")


def _wrapper_types() -> Tuple[type, ...]:
    """Parallel wrappers looked through: they hold the model, they are not part of it."""
    from torch.nn.parallel import DistributedDataParallel
    from torchrec.distributed.model_parallel import DistributedModelParallel

    return DistributedModelParallel, DistributedDataParallel


def _embedding_types() -> Tuple[type, ...]:
    from torch import nn
    from torchrec.distributed.types import ShardedModule
    from torchrec.modules.embedding_modules import EmbeddingBagCollectionInterface, EmbeddingCollectionInterface

    return nn.Embedding, nn.EmbeddingBag, EmbeddingBagCollectionInterface, EmbeddingCollectionInterface, ShardedModule


def is_embedding_module(module: Any, types: Optional[Tuple[type, ...]] = None) -> bool:
    """An embedding module (a table, a sharded lookup, rayemb's hybrid or compressed collection) or a piece of one."""
    if isinstance(module, types or _embedding_types()):
        return True
    cls_module = type(module).__module__
    if cls_module.startswith(_TORCHREC_EMBEDDING_PACKAGES):
        return True
    # rayemb's embedding modules hold table rows (parameters or buffers); its stateless history tower is dense
    return (cls_module == _RAYEMB_EMBEDDING_PACKAGE or cls_module.startswith(_RAYEMB_EMBEDDING_PACKAGE + ".")) and \
        (next(module.parameters(), None) is not None or next(module.buffers(), None) is not None)


def dense_subtrees(model: Any) -> List[Tuple[str, Any]]:
    """``(name, module)`` of the largest submodules of ``model`` that hold parameters and no embedding module, in
    module order; names are relative to the model inside the parallel wrappers (``dense_arch``, ``over_arch``)."""
    wrappers, embedding = _wrapper_types(), _embedding_types()
    found: List[Tuple[str, Any]] = []
    seen = set()

    def visit(module: Any, name: str) -> None:
        if id(module) in seen:  # a module held at two paths is compiled once, under its first name
            return
        seen.add(id(module))
        if isinstance(module, wrappers):
            for child in module.children():
                visit(child, name)
            return
        if is_embedding_module(module, embedding):
            return
        if not any(is_embedding_module(m, embedding) for m in module.modules()):
            if next(module.parameters(), None) is not None:
                found.append((name, module))
            return
        for child_name, child in module.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name)

    visit(model, "")
    return found


class _EagerOnFailure:
    """A module's compiled call; on an error it warns once, puts the module back to its eager call and reruns
    the call there."""

    def __init__(self, name: str, module: Any, compiled: Callable[..., Any]) -> None:
        self.name, self.module, self.compiled = name, module, compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch._functorch.config as functorch_config

        lazy = functorch_config.force_non_lazy_backward_lowering
        # the backward is otherwise compiled at the first backward, where a failure would stop the step
        functorch_config.force_non_lazy_backward_lowering = True
        try:
            return self.compiled(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any failure of the compiled call: the eager call decides
            logger.warning("train.compile: the compiled %s failed (%s: %s); it runs eagerly from now on",
                           self.name, type(e).__name__, _first_line(e))
            self.module._compiled_call_impl = None
            return self.module._call_impl(*args, **kwargs)
        finally:
            functorch_config.force_non_lazy_backward_lowering = lazy


def _first_line(e: BaseException) -> str:
    """The error's message up to its first blank line, on one line (Dynamo puts the compiler's own error on the
    second line and advice after a blank one)."""
    lines = []
    for line in str(e).strip().splitlines():
        if not line.strip():
            break
        lines.append(line.strip())
    text = " ".join(lines)
    return text if len(text) <= 400 else text[:397] + "..."


def _compiled_call(name: str, module: Any, mode: Optional[str], backend: Any) -> Callable[..., Any]:
    """``torch.compile`` of the module's call, under a code object of its own."""
    import torch

    def call(*args: Any, **kwargs: Any) -> Any:
        return module._call_impl(*args, **kwargs)

    # Dynamo caches compiled code per code object, with a recompile limit each: one code object per module keeps
    # one module's recompiles from using up another's. A call compiled from here (not nn.Module.compile, which
    # compiles the module's _call_impl) is also traced for torch.nn's own modules (an nn.Sequential tower),
    # whose _call_impl frame Dynamo skips.
    label = "compiled_" + "".join(c if c.isalnum() else "_" for c in name or "model")
    call.__code__ = call.__code__.replace(co_name=label, co_qualname=label)
    options = {"backend": backend} if backend is not None else {"mode": mode}
    return torch.compile(call, **options)


def compile_dense(model: Any, mode: str = "default", backend: Any = None) -> List[str]:
    """Compiles, in place, each of :func:`dense_subtrees`; returns their names (``[]`` where torch.compile is
    unavailable: the model stays eager, with a warning).

    ``mode``: torch.compile's mode (:data:`~rayemb.config.COMPILE_MODES`); ``backend``: a torch.compile
    backend in place of inductor and ``mode`` (tests: ``"aot_eager"``).
    """
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode {mode!r} is unknown; use one of {COMPILE_MODES}")
    done: List[Tuple[str, Any]] = []
    for name, module in dense_subtrees(model):
        label = name or type(module).__name__
        try:
            compiled = _compiled_call(label, module, mode, backend)
        except Exception as e:  # noqa: BLE001 - no torch.compile here (platform, Python version): train eagerly
            logger.warning("train.compile: torch.compile is unavailable (%s: %s); the model runs eagerly",
                           type(e).__name__, _first_line(e))
            for _, m in done:
                m._compiled_call_impl = None
            return []
        module._compiled_call_impl = _EagerOnFailure(label, module, compiled)
        done.append((label, module))
    return [label for label, _ in done]


def compiled_names(model: Any) -> List[str]:
    """The submodules of ``model`` whose calls currently run compiled (a fallen-back one is not among them)."""
    return [name or type(m).__name__ for name, m in dense_subtrees(model)
            if isinstance(getattr(m, "_compiled_call_impl", None), _EagerOnFailure)]


def apply_train_compile(model: Any, train_cfg: Any, log: bool) -> List[str]:
    """The job's ``train.compile``: :func:`compile_dense` of ``model`` when it is ``dense`` (logged when
    ``log``: rank 0), else nothing."""
    if train_cfg.compile != "dense":
        return []
    names = compile_dense(model, train_cfg.compile_mode)
    if log:
        logger.info("train.compile: dense, mode %s: compiled %s (the embedding modules stay eager)",
                    train_cfg.compile_mode, ", ".join(names) or "nothing")
    return names


__all__ = ["apply_train_compile", "compile_dense", "compiled_names",
           "dense_subtrees", "is_embedding_module"]
