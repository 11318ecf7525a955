"""One training step of a sharded model, written once for every place that steps one.

The job's loop (:mod:`rayemb.train.worker.loop`), the plan probe (the job's own model timed on synthetic batches
before training, :mod:`rayemb.train.calibration.plan_probe`) and the calibration's probes of tiny sharded modules
(:mod:`rayemb.train.calibration.probes`) all run the same step: forward and loss, the next batch's input
exchange started (:mod:`rayemb.embedding.prefetch`), backward (the fused embedding optimizer applies in it),
the other optimizers, the collectives' bytes counted. Here it is written once, so that the probes time
exactly what training runs and a faster step is made once for all of them.

The step reads nothing back to the host: on a GPU a read (say, of the loss for a finite check) waits for
the device's queue to drain, every step. The loop sums a window's losses on the device
(:class:`LossWindow`) and reads the sum when it logs the window, which is also where a non-finite loss
stops the job (:func:`check_finite_loss`).
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Iterable, Iterator, NamedTuple, Optional, Sequence, Tuple


class StepBatch(NamedTuple):
    """One step's tensors on the device: the model's positional ``inputs``, the loss's ``labels`` (unused
    when the step has no loss function: the model's output is the loss), and ``sparse``, the KJT whose input
    exchange a prefetch starts before the previous step's backward (None: nothing to prefetch)."""

    inputs: Tuple[Any, ...]
    labels: Any = None
    sparse: Any = None


class StepTimer:
    """Accumulates wall time per phase of a training step (data wait, forward, backward, optimizer)."""

    PHASES = ("data_wait", "forward", "backward", "optimizer")

    def __init__(self) -> None:
        self.totals = dict.fromkeys(self.PHASES, 0.0)
        self._t = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.totals[phase] += now - self._t
        self._t = now

    def reset(self) -> None:
        self.totals = dict.fromkeys(self.PHASES, 0.0)
        self._t = time.perf_counter()


class TrainStep:
    """One training step of a sharded model: forward and loss, the next batch's input exchange started
    before the backward, backward (fused embedding optimizer applied in it), the other optimizers.

    ``optimizer``: stepped after the backward (None: every parameter updates in the backward);
    ``precision``: ``bf16`` runs the forward and the loss under ``torch.autocast`` (bfloat16 matmuls; the
    parameters, their gradients and the backward stay fp32);
    ``loss_fn(output, labels)`` (None: the model's output is the loss); ``prefetch``: a
    :class:`~rayemb.embedding.prefetch.StepPrefetch`, started on the next batch's ``sparse``; ``counter``: a
    :class:`~rayemb.embedding.comm.CommCounter`, on during forward and backward; ``timer``: a
    :class:`StepTimer` lapped after each phase; ``lr_schedule``: a :class:`~rayemb.train.worker.schedule.LrSchedule`
    that sets every learning rate before each step's forward (the fused embedding optimizer's rate goes with it);
    ``clip_params``, ``clip_norm``: the dense parameters whose gradient norm is clipped to ``clip_norm`` after the
    backward (their gradients all-reduced: every rank clips alike), before the optimizers step.

    Nothing is read back to the host: a step returns the detached loss, still on the device.
    """

    def __init__(self, model: Any, optimizer: Any = None, loss_fn: Any = None, *, prefetch: Any = None,
                 counter: Any = None, timer: Optional[StepTimer] = None, precision: str = "fp32",
                 lr_schedule: Any = None, clip_params: Sequence[Any] = (), clip_norm: Optional[float] = None) -> None:
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.prefetch, self.timer, self.precision = prefetch, timer, precision
        self.lr_schedule = lr_schedule
        self.clip_params = list(clip_params) if clip_norm is not None else []
        self.clip_norm = clip_norm
        self._counted = counter if counter is not None else contextlib.nullcontext()

    def _autocast(self, batch: StepBatch) -> Any:
        if self.precision != "bf16":
            return contextlib.nullcontext()
        import torch

        device = next((t.device for t in batch.inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    def _lap(self, phase: str) -> None:
        if self.timer is not None:
            self.timer.lap(phase)

    def forward(self, batch: StepBatch) -> Any:
        """The loss of ``batch`` (with its graph, for :meth:`backward`)."""
        if self.lr_schedule is not None:
            # FBGEMM's lookup takes the kernel's rate with it in the forward, for the backward's update; the fused
            # optimizer hands its param group's rate to the kernel at zero_grad
            self.lr_schedule.apply()
            if self.optimizer is not None:
                self.optimizer.zero_grad()
        with self._counted, self._autocast(batch):  # bytes of the model's own collectives only
            out = self.model(*batch.inputs)
            loss = out if self.loss_fn is None else self.loss_fn(out, batch.labels)
        loss = loss.float()  # autocast may leave it bf16: summed and checked in fp32
        self._lap("forward")
        return loss

    def backward(self, loss: Any, next_batch: Optional[StepBatch] = None) -> None:
        """Starts ``next_batch``'s input exchange, then backward and the optimizers."""
        with self._counted:
            if self.prefetch is not None and next_batch is not None and next_batch.sparse is not None:
                self.prefetch.start(next_batch.sparse)  # its ids travel during this backward
            if self.optimizer is not None:
                self.optimizer.zero_grad()
            loss.backward()  # also applies the fused embedding optimizer
            self._lap("backward")
        if self.clip_params:
            import torch

            # the scale is applied on the device: no read of the norm
            torch.nn.utils.clip_grad_norm_(self.clip_params, self.clip_norm)
        if self.optimizer is not None:
            self.optimizer.step()
        self._lap("optimizer")

    def __call__(self, batch: StepBatch, next_batch: Optional[StepBatch] = None) -> Any:
        """One step of ``batch``, ``next_batch`` (when given) prefetched; returns the detached loss."""
        loss = self.forward(batch)
        self.backward(loss, next_batch)
        return loss.detach()

    def steps(self, batches: Iterable[Optional[StepBatch]]) -> Iterator[Any]:
        """Steps ``batches`` until they end (or give None), yielding each step's detached loss. Each next batch
        is drawn between the forward and the backward of the one before, so that its input exchange can start
        before that backward; drawing it is timed as ``data_wait``."""
        it = iter(batches)
        nxt = next(it, None)
        while nxt is not None:
            self._lap("data_wait")
            loss = self.forward(nxt)
            nxt = next(it, None)
            self._lap("data_wait")
            self.backward(loss, nxt)
            yield loss.detach()

    def finish(self) -> None:
        """Completes a prefetched input exchange still in flight (every rank calls it alike)."""
        if self.prefetch is not None:
            self.prefetch.finish()


class LossWindow:
    """The losses of the steps since the last log point, summed on the device: read only when logged."""

    def __init__(self, device: Any, first_step: int) -> None:
        import torch

        self.sum = torch.zeros((), dtype=torch.float64, device=device)
        self.steps, self.first_step = 0, first_step

    def add(self, loss: Any) -> None:
        self.sum += loss.detach()
        self.steps += 1

    def reset(self, first_step: int) -> None:
        self.sum.zero_()
        self.steps, self.first_step = 0, first_step


def check_finite_loss(loss: float, first_step: int, last_step: int, epoch: int) -> None:
    """Stops the job with a clear error when ``loss``, read from the window of steps ``first_step`` to
    ``last_step`` (their sum or mean, over the ranks), is NaN or infinite: training diverged in that window."""
    if not math.isfinite(loss):
        from rayemb.errors import TrainingDivergedError

        where = f"at step {last_step}" if first_step >= last_step else \
            f"between step {first_step} and step {last_step}"
        raise TrainingDivergedError(
            f"The training loss became {loss} {where} (epoch {epoch}): training diverged. "
            "Lower train.dense_lr / train.embedding_lr, or check the data for extreme dense values; "
            "the MLflow run is marked FAILED.",
            category="non_finite_loss",
        )


__all__ = ["StepBatch", "StepTimer", "TrainStep", "LossWindow", "check_finite_loss"]
