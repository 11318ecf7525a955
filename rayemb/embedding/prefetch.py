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
    prefetch.start(sparse_next)      # split sizes of batch i+1 sent; they arrive during the backward
    loss.backward()
    optimizer.step()
    model(dense_next, sparse_next)   # the children find their split sizes in: lengths/values, lookup

The step is shorter this way (``jobs/bench/step_profile.py --ab prefetch`` compares).
The wait for the split sizes stays before the backward: waiting after it (so that
lengths and values move during the optimizer step) is slower than no prefetch at
all, because on CPU the exchange threads then compete with the step for the same
cores.

The numbers are exactly those of the plain forward (same calls, same inputs,
checked bit for bit in ``tests/dist/test_input_prefetch.py``); only when the
waiting happens changes. A forward on another KJT than the prefetched one (an
evaluation, a skipped batch) drops the prefetched exchange and runs plainly;
every rank does the same, so the collectives stay matched.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from torch import nn


def _is_sharded(module: nn.Module) -> bool:
    from torchrec.distributed.types import ShardedModule

    return isinstance(module, ShardedModule)


class InputDistPrefetch:
    """Prefetched ``input_dist`` of the sharded children of one module (see the module docstring).

    The owner (a hybrid embedding module) calls :meth:`lookup` for each sharded
    child in its forward; the training loop calls :meth:`start` (through :class:`StepPrefetch`).
    """

    def __init__(self) -> None:
        self._key: Optional[Any] = None
        #: child name -> (context, awaitable of the split sizes)
        self._pending: Dict[str, Tuple[Any, Any]] = {}
        #: lookups that used a prefetched exchange / that found one started for another KJT and dropped it
        self.hits = self.dropped = 0

    def start(self, key: Any, inputs: Sequence[Tuple[str, nn.Module, Any]]) -> None:
        """Starts ``input_dist`` of each sharded child on its input; ``key`` is the KJT the forward will get."""
        self.clear()  # one started and never used is dropped
        for name, module, kjt in inputs:
            if _is_sharded(module):
                ctx = module.create_context()
                self._pending[name] = (ctx, module.input_dist(ctx, kjt))
        self._key = key

    def lookup(self, key: Any, name: str, module: nn.Module, kjt: Any) -> Any:
        """``module(kjt)``, with the prefetched input exchange when ``key`` is the prefetched KJT."""
        if key is not self._key:
            self.clear()
        entry = self._pending.pop(name, None)
        if entry is None:
            return module(kjt)
        self.hits += 1
        ctx, splits = entry
        return module.compute_and_output_dist(ctx, splits.wait().wait())

    def finish(self) -> None:
        """Completes the pending exchanges and drops them: a started exchange left in flight when the process
        group goes away can abort the process (seen: SIGABRT of one calibration rank)."""
        for _, splits in self._pending.values():
            splits.wait().wait()
        self.clear()

    def clear(self) -> None:
        """Drops the pending exchanges (counted in :attr:`dropped`)."""
        self.dropped += len(self._pending)
        self._key, self._pending = None, {}


class StepPrefetch:
    """The training loop's handle: prefetches for every module of ``model`` that offers it (hybrid modules).

    ``enabled`` is False when no module has a sharded child (nothing to prefetch).
    """

    def __init__(self, model: nn.Module) -> None:
        self.owners = [m for m in model.modules() if isinstance(getattr(m, "prefetch", None), InputDistPrefetch)]
        self.enabled = any(_is_sharded(c) for o in self.owners for c in o.modules())

    def start(self, sparse: Any) -> None:
        """Starts the input exchange of the batch whose (device) KJT ``sparse`` the next forward gets."""
        for owner in self.owners:
            owner.prefetch.start(sparse, owner.sharded_inputs(sparse))

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


__all__ = ["InputDistPrefetch", "StepPrefetch"]
