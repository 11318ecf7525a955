"""Host batches onto the device one step ahead: pinned, copied on a side stream while the step before runs.

A step's input is a host batch (:class:`~rayemb.data.batching.Batch`, converted off the training thread by
:mod:`rayemb.train.worker.data_loader`). Copying it to a GPU from pageable memory blocks the host until the copy is
done, and on the step's own stream the copy would wait for the step before to finish. So, on CUDA:

* batches are pinned where they are converted (:func:`pinned`, on the loader's thread), so a copy can be
  asynchronous;
* :class:`DeviceFeed` issues batch ``k+1``'s copy on its own stream (``non_blocking``) when it hands out batch
  ``k``: the copy runs while step ``k``'s kernels do. Before batch ``k+1`` is used, the step's stream waits for
  that copy (an event on the device, not the host), and every tensor is marked as used by the step's stream
  (``record_stream``), so the caching allocator does not reuse its memory while the step still reads it.

This is the input half of TorchRec's ``TrainPipelineSparseDist`` (its other half, starting the next batch's
input exchange before the backward, is :mod:`rayemb.embedding.prefetch`). On a CPU device the feed keeps the
same order with plain moves, which is what the CPU tests check.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional


def _walk(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` applied to every tensor or KJT in a batch's fields, tuples and lists (others kept as they are)."""
    import torch

    if obj is None:
        return None
    if isinstance(obj, torch.Tensor) or hasattr(obj, "record_stream"):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        out = [_walk(o, fn) for o in obj]
        return type(obj)(*out) if hasattr(obj, "_fields") else type(obj)(out)
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.replace(obj, **{f: _walk(getattr(obj, f), fn) for f in obj.__dataclass_fields__})
    return obj


def pinned(convert: Callable[..., Any]) -> Callable[..., Any]:
    """``convert`` whose batches come back in page-locked memory (call it where the batches are converted)."""
    def convert_pinned(*args: Any, **kwargs: Any) -> Any:
        return _walk(convert(*args, **kwargs), lambda t: t.pin_memory())

    return convert_pinned


class DeviceFeed:
    """Device batches from ``host`` batches, each copied while the step before it runs (module docstring).

    ``move(host_batch, non_blocking=...)``: the batch's tensors on the device (a ``StepBatch``); ``trace(event,
    index)``: called with ``"copy"`` when batch ``index``'s copy is issued and ``"ready"`` when it is handed out
    (tests read the order).
    """

    def __init__(self, host: Iterable[Any], move: Callable[[Any, bool], Any], device: Any,
                 trace: Optional[Callable[[str, int], None]] = None) -> None:
        import torch

        self.host, self.move, self.device, self.trace = host, move, device, trace
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def _copy(self, batch: Any, index: int) -> Any:
        if self.trace is not None:
            self.trace("copy", index)
        if self.stream is None:
            return self.move(batch, non_blocking=False)
        import torch

        # the copy must not start before the step's stream is done with what it overwrites
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            return self.move(batch, non_blocking=True)

    def _ready(self, batch: Any, index: int) -> Any:
        if self.stream is not None:
            import torch

            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)  # on the device: the host does not wait
            _walk(batch, lambda t: t.record_stream(current))
        if self.trace is not None:
            self.trace("ready", index)
        return batch

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.host)
        nxt = next(it, None)
        pending = None if nxt is None else self._copy(nxt, 0)
        index = 0
        while pending is not None:
            ready = self._ready(pending, index)
            nxt = next(it, None)
            pending = None if nxt is None else self._copy(nxt, index + 1)
            yield ready
            index += 1


__all__ = ["DeviceFeed", "pinned"]
