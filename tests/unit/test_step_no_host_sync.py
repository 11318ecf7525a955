"""rayemb.train.worker.step: a training step reads nothing back to the host; a diverged window stops the job by name."""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch

from rayemb.errors import TrainingDivergedError
from rayemb.train.worker.step import LossWindow, StepBatch, StepTimer, TrainStep, check_finite_loss


def _step(timer=None) -> TrainStep:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 1), torch.nn.Flatten(0))
    # SGD: Adagrad reads its step count with item(), from host memory (no device sync), which the guard would catch
    return TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.BCEWithLogitsLoss(),
                     timer=timer)


def _batch(value: float = 1.0) -> StepBatch:
    return StepBatch((torch.full((8, 4), value),), torch.ones(8))


@contextlib.contextmanager
def no_host_reads():
    """Every way of reading a tensor's value back to Python raises inside."""

    def read(*_args, **_kwargs):
        raise AssertionError("a tensor was read back to the host")

    with contextlib.ExitStack() as stack:
        for name in ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__"):
            stack.enter_context(mock.patch.object(torch.Tensor, name, read))
        yield


def test_the_guard_catches_a_read():
    with no_host_reads(), pytest.raises(AssertionError, match="read back"):
        float(torch.ones(()))


def test_a_step_trains_and_reads_nothing_back():
    timer = StepTimer()
    step = _step(timer)
    before = [p.detach().clone() for p in step.model.parameters()]
    window = LossWindow(torch.device("cpu"), 1)
    with no_host_reads():
        loss = step(_batch(), _batch())
        losses = list(step.steps(iter([_batch(), _batch(2.0)])))
        for x in [loss, *losses]:
            window.add(x)
    assert not loss.requires_grad and loss.dim() == 0 and len(losses) == 2
    assert window.steps == 3 and window.sum.dtype == torch.float64
    assert torch.allclose(window.sum, sum(x.double() for x in [loss, *losses]))
    assert all(not torch.equal(a, b) for a, b in zip(before, step.model.parameters()))
    assert all(t > 0 for t in timer.totals.values())


def test_without_a_loss_function_the_output_is_the_loss_and_without_an_optimizer_nothing_steps():
    model = torch.nn.Linear(3, 1)
    weight = model.weight.detach().clone()
    x = torch.ones(3)
    loss = TrainStep(model)(StepBatch((x,)))
    assert torch.equal(loss, model(x).detach())
    assert torch.equal(model.weight, weight) and torch.equal(model.weight.grad, x.reshape(1, 3))


def test_a_nan_loss_stops_the_job_at_the_window_check_not_in_the_step():
    step = _step()
    window = LossWindow(torch.device("cpu"), 11)
    with no_host_reads():
        for value in (1.0, float("nan"), 1.0):
            window.add(step(_batch(value)))  # no check, no read: the steps go on
    with pytest.raises(TrainingDivergedError) as err:
        check_finite_loss(float(window.sum), window.first_step, 13, epoch=2)
    assert err.value.category == "non_finite_loss"
    msg = str(err.value)
    assert "training loss became nan between step 11 and step 13 (epoch 2)" in msg, msg
    assert "train.dense_lr" in msg and "train.embedding_lr" in msg


def test_a_finite_window_passes_and_one_step_is_named_alone():
    check_finite_loss(3.5, 1, 20, epoch=0)
    with pytest.raises(TrainingDivergedError, match=r"became inf at step 7 \(epoch 0\)"):
        check_finite_loss(float("inf"), 7, 7, epoch=0)


def test_the_window_resets():
    window = LossWindow(torch.device("cpu"), 1)
    window.add(torch.tensor(2.0))
    window.reset(5)
    window.add(torch.tensor(1.5))
    assert (window.steps, window.first_step, float(window.sum)) == (1, 5, 1.5)
