"""rayemb.train.worker.device_feed: batch k+1's copy to the device is issued before step k runs, every batch arrives once
and in order, and nothing in the feed or the step reads a value back to the host."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from rayemb.data.batching import BatchConverter
from rayemb.data.schema import DatasetSchema, SparseFeature
from rayemb.train.worker.device_feed import DeviceFeed, _walk
from rayemb.train.worker.step import StepBatch, TrainStep
from test_step_no_host_sync import no_host_reads

N = 6


class _Traced(torch.nn.Module):
    """A linear model that writes ("forward", k) and, from its output's gradient hook, ("backward", k)."""

    def __init__(self, events):
        super().__init__()
        self.linear, self.events, self.k = torch.nn.Linear(4, 1), events, 0

    def forward(self, x):
        k, self.k = self.k, self.k + 1
        self.events.append(("forward", k))
        out = self.linear(x).flatten()
        out.register_hook(lambda g: self.events.append(("backward", k)) or g)
        return out


def _host(i: int) -> StepBatch:
    return StepBatch((torch.full((8, 4), float(i)),), torch.full((8,), float(i % 2)))


def _move(batch: StepBatch, non_blocking: bool) -> StepBatch:
    assert non_blocking is False  # a CPU device: plain moves
    return StepBatch(tuple(t.to("cpu") for t in batch.inputs), batch.labels.to("cpu"))


def test_the_next_batch_is_copied_before_the_step_runs_and_nothing_is_read_back():
    events = []
    model = _Traced(events)
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.BCEWithLogitsLoss())
    feed = DeviceFeed((_host(i) for i in range(N)), _move, torch.device("cpu"),
                      trace=lambda event, i: events.append((event, i)))
    with no_host_reads():
        losses = list(step.steps(feed))
    assert len(losses) == N and model.k == N
    at = {e: i for i, e in enumerate(events)}
    for k in range(N):
        assert at[("copy", k)] < at[("ready", k)] < at[("forward", k)] < at[("backward", k)]
        if k + 1 < N:
            # batch k+1's copy is issued when batch k is handed out: before step k's forward and backward
            assert at[("ready", k)] < at[("copy", k + 1)] < at[("forward", k)]
    assert ("copy", N) not in at and [e for e, _ in events].count("copy") == N


def test_each_batch_once_in_order_and_an_empty_feed():
    feed = DeviceFeed((_host(i) for i in range(N)), _move, torch.device("cpu"))
    got = [int(b.inputs[0][0, 0]) for b in feed]
    assert got == list(range(N))
    assert list(DeviceFeed(iter([]), _move, torch.device("cpu"))) == []


def test_every_tensor_and_kjt_of_a_batch_is_visited():
    schema = DatasetSchema(label="label", dense=["I1"], sparse=[SparseFeature("C1", 10),
                                                                SparseFeature("C2", 10, multi_hot=True)])
    conv = BatchConverter(schema, keep_ids="C1")
    table = pa.table({"label": [0, 1, 1], "I1": np.array([1.0, 2.0, 3.0], np.float32), "C1": [1, 2, 3],
                      "C2": [[1], [], [4, 5]]})
    batch = conv(table, pad_to=4)  # padding: a mask too
    seen = []
    out = _walk(batch, lambda t: seen.append(type(t).__name__) or t)
    assert sorted(seen) == ["KeyedJaggedTensor", "Tensor", "Tensor", "Tensor", "Tensor"]  # dense, labels, mask, ids
    assert out.sparse is batch.sparse and torch.equal(out.dense, batch.dense)
    step_batch = StepBatch((batch.dense, batch.sparse), batch.labels, batch.sparse)
    seen.clear()
    assert isinstance(_walk(step_batch, lambda t: seen.append(1) or t), StepBatch) and len(seen) == 4
