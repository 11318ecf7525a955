"""The next batch's sparse input exchange, started before this batch's backward.

A sharded TorchRec module's forward is ``input_dist -> wait -> wait ->
compute_and_output_dist``: the ranks first exchange the split sizes of their
ids, then the lengths and values, and every rank waits for the slowest before
its lookup starts. TorchRec's ``TrainPipelineSparseDist`` moves the next
batch's ``input_dist`` off that path; it finds the sharded modules by
FX-tracing a model whose forward takes one batch object. rayemb's hybrid
module feeds its sharded children with parts of one KJT
(``KeyedJaggedTensor.split``), which such tracing cannot follow, so the module
names its children's inputs itself
(:meth:`~rayemb.embedding.hybrid.HybridEmbeddingBagCollection.sharded_inputs`)
and the training loop starts the exchange by hand::

    loss = loss_fn(model(dense_i, sparse_i), labels_i)
    prefetch.start(sparse_next)      # split sizes of batch i+1 sent, waited for; lengths and values sent
    loss.backward()                  # ... they travel during it
    optimizer.step()
    model(dense_next, sparse_next)   # the children find their input exchanged: lookup

This is TorchRec's pipeline order: the whole ``input_dist`` of batch ``i+1``
(split sizes, lengths, values) runs while batch ``i`` computes, and the next
forward starts with its lookup. Sending only the split sizes there and the
lengths and values in the next forward (``exchange="splits"``) leaves a
round trip per sharded child on the forward's path; on 2 gloo ranks the whole
exchange is the shorter step (``jobs/bench/step_profile.py --ab prefetch_full``,
docs/benchmarks.md). The split sizes are waited for before the backward:
waiting after it (the lengths and values then moving during the optimizer
step) was slower than no prefetch at all, because on CPU the exchange threads
then compete with the step for the same cores.

The numbers are exactly those of the plain forward (same calls, same inputs,
checked bit for bit in ``tests/dist/test_input_prefetch.py``); only when the
waiting happens changes (the order: ``tests/dist/test_prefetch_order.py``). A
forward on another KJT than the prefetched one (an evaluation, a skipped
batch) drops the prefetched exchange and runs plainly; every rank does the
same, so the collectives stay matched.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from torch import nn


#: how much of the next batch's input exchange starts before this batch's backward: its split sizes only (the
#: lengths and values follow in its own forward), or all of it (TorchRec's ``TrainPipelineSparseDist`` order)
EXCHANGES = ("splits", "full")
DEFAULT_EXCHANGE = "full"


def _is_sharded(module: nn.Module) -> bool:
    from torchrec.distributed.types import ShardedModule

    return isinstance(module, ShardedModule)


class InputDistPrefetch:
    """Prefetched ``input_dist`` of the sharded children of one module (see the module docstring).

    The owner (a hybrid embedding module) calls :meth:`lookup` for each sharded
    child in its forward; the training loop calls :meth:`start` (through :class:`StepPrefetch`).
    ``trace(event, child)``, when set, is called as the exchange moves on (tests read the order): ``"splits"``
    when a child's split sizes are sent, ``"tensors"`` when they have arrived and its lengths and values are
    sent, ``"arrived"`` when those have arrived (on the backend's thread, where it tells), ``"lookup"`` when the
    forward takes the exchanged input.
    """

    def __init__(self) -> None:
        self._key: Optional[Any] = None
        #: child name -> (context, awaitable: of the split sizes, or of the lengths and values once they are sent)
        self._pending: Dict[str, Tuple[Any, Any]] = {}
        #: the children whose pending awaitable is still the split sizes'
        self._at_splits: set = set()
        #: lookups that used a prefetched exchange / that found one started for another KJT and dropped it
        self.hits = self.dropped = 0
        self.trace: Optional[Callable[[str, str], None]] = None

    def start(self, key: Any, inputs: Sequence[Tuple[str, nn.Module, Any]],
              exchange: str = DEFAULT_EXCHANGE) -> None:
        """Starts ``input_dist`` of each sharded child on its input; ``key`` is the KJT the forward will get.

        ``exchange``: ``"splits"`` sends the split sizes only; ``"full"`` then waits for them and sends the
        lengths and values too (every child's split sizes are sent before the first is waited for)."""
        self.clear()  # one started and never used is dropped
        for name, module, kjt in inputs:
            if _is_sharded(module):
                ctx = module.create_context()
                self._pending[name] = (ctx, module.input_dist(ctx, kjt))
                self._at_splits.add(name)
                self._emit("splits", name)
        self._key = key
        if exchange == "full":
            for name in list(self._pending):
                self._send_tensors(name)

    def _emit(self, event: str, name: str) -> None:
        if self.trace is not None:
            self.trace(event, name)

    def _send_tensors(self, name: str) -> None:
        """Waits for ``name``'s split sizes, which sends its lengths and values."""
        ctx, splits = self._pending[name]
        tensors = splits.wait()
        self._pending[name] = (ctx, tensors)
        self._at_splits.discard(name)
        self._emit("tensors", name)
        if self.trace is not None:
            _on_arrival(tensors, lambda: self._emit("arrived", name))

    def lookup(self, key: Any, name: str, module: nn.Module, kjt: Any) -> Any:
        """``module(kjt)``, with the prefetched input exchange when ``key`` is the prefetched KJT."""
        if key is not self._key:
            self.clear()
        if name not in self._pending:
            return module(kjt)
        if name in self._at_splits:
            self._send_tensors(name)
        ctx, tensors = self._pending.pop(name)
        self.hits += 1
        features = tensors.wait()
        self._emit("lookup", name)
        return module.compute_and_output_dist(ctx, features)

    def finish(self) -> None:
        """Completes the pending exchanges and drops them: a started exchange left in flight when the process
        group goes away can abort the process (seen: SIGABRT of one calibration rank)."""
        for name, (_, awaitable) in self._pending.items():
            awaitable = awaitable.wait() if name in self._at_splits else awaitable
            awaitable.wait()
        self.clear()

    def clear(self) -> None:
        """Drops the pending exchanges (counted in :attr:`dropped`)."""
        self.dropped += len(self._pending)
        self._key, self._pending, self._at_splits = None, {}, set()


def _on_arrival(tensors: Any, callback: Callable[[], None]) -> None:
    """``callback()`` once every collective behind a (list of) KJT all-to-all awaitable(s) has completed, from the
    thread that completes the last; at once where there is none (a data-parallel child's input stays local)."""
    works = [w for a in getattr(tensors, "awaitables", [tensors]) for w in getattr(a, "_awaitables", [])]
    if not works:
        callback()
        return
    left = [len(works)]
    lock = threading.Lock()

    def done(_: Any) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            callback()

    for w in works:
        w.get_future().add_done_callback(done)


class StepPrefetch:
    """The training loop's handle: prefetches for every module of ``model`` that offers it (hybrid modules).

    ``enabled`` is False when no module has a sharded child (nothing to prefetch). ``exchange``: how much of the
    exchange :meth:`start` sends (:data:`EXCHANGES`).
    """

    def __init__(self, model: nn.Module, exchange: str = DEFAULT_EXCHANGE) -> None:
        if exchange not in EXCHANGES:
            raise ValueError(f"prefetch exchange {exchange!r}: expected one of {', '.join(EXCHANGES)}")
        self.exchange = exchange
        self.owners = [m for m in model.modules() if isinstance(getattr(m, "prefetch", None), InputDistPrefetch)]
        self.enabled = any(_is_sharded(c) for o in self.owners for c in o.modules())

    def start(self, sparse: Any) -> None:
        """Starts the input exchange of the batch whose (device) KJT ``sparse`` the next forward gets."""
        for owner in self.owners:
            owner.prefetch.start(sparse, owner.sharded_inputs(sparse), self.exchange)

    def set_trace(self, trace: Optional[Callable[[str, str], None]]) -> None:
        """``trace(event, child)`` on every owner's prefetch (:class:`InputDistPrefetch`; None: off)."""
        for owner in self.owners:
            owner.prefetch.trace = trace

    def finish(self) -> None:
        """Completes every pending exchange (:meth:`InputDistPrefetch.finish`); every rank calls it alike."""
        for owner in self.owners:
            owner.prefetch.finish()

    @property
    def hits(self) -> int:
        return sum(o.prefetch.hits for o in self.owners)

    @property
    def dropped(self) -> int:
        return sum(o.prefetch.dropped for o in self.owners)


__all__ = ["DEFAULT_EXCHANGE", "EXCHANGES", "InputDistPrefetch", "StepPrefetch"]
