"""The order a training step runs its collectives in: TorchRec's pipeline order, recorded event by event.

Two gloo ranks step test_logical_checkpoint's plan A (hybrid tables with row-, column- and table-wise cold
halves beside plain table-, column-, row-wise and data-parallel tables) with the job's
:class:`~rayemb.train.worker.step.TrainStep`. A recorder takes, in one sequence: the step's phase ends (the
step's timer), the prefetched exchange's progress (:attr:`~rayemb.embedding.prefetch.InputDistPrefetch.trace`:
split sizes sent, lengths and values sent, their arrival on gloo's thread, the lookup that takes them), every
collective call (a :class:`~rayemb.embedding.comm.CommCounter` that records calls in place of bytes; DDP's
all-reduce is recorded where its comm hook fires) and the completion of each pooled all-to-all's backward (a
hook on its autograd node).

What must hold, for every step k but the last: batch k+1's exchange is sent after batch k's forward and before
its backward, and has arrived before batch k+1's lookup; with the whole exchange prefetched its lengths and
values are sent before the backward's first collective too (with the split sizes alone, that check fails).
DDP's all-reduce of the replicated gradients fires while the pooled all-to-all's backward is still to complete
(from the second step on: DDP orders its buckets by the first backward's gradients). Run without prefetch, the
same check fails.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch
from _sparse import checkpoint_batch
from test_logical_checkpoint import PLAN_A, TABLES, _build

from rayemb.multiprocess import run_multiprocess

LOCAL_BATCH = 6
STEPS = 4
#: the pooled all-to-all's backward: its autograd node waits for the gradients' exchange
POOLED_A2A_WAIT = "All2All_Pooled_ReqBackward"


class _Recorder:
    """Events in the order they happen, from any thread: (sequence number, event, detail)."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self.events: List[Tuple[int, str, str]] = []

    def add(self, event: str, detail: str = "") -> None:
        self.events.append((next(self._seq), event, detail))  # count and append: atomic under the GIL

    # the step's timer (rayemb.train.worker.step.StepTimer's interface)
    def lap(self, phase: str) -> None:
        self.add("phase", phase)


def _collective_recorder(rec: _Recorder) -> Any:
    from rayemb.embedding.comm import CommCounter

    class Calls(CommCounter):
        def _add(self, name: str, phase: str, nbytes: float) -> None:
            rec.add("collective", f"{name}/{phase}")

    return Calls()


def _hook_pooled_backward(loss: torch.Tensor, rec: _Recorder) -> int:
    """Records each pooled all-to-all backward's completion (a hook on its node in ``loss``'s graph); how many."""
    seen, stack, n = set(), [loss.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.name() == POOLED_A2A_WAIT:
            node.register_hook(lambda grad_in, grad_out: rec.add("pooled_a2a_backward_done"))
            n += 1
        stack.extend(nxt for nxt, _ in node.next_functions)
    return n


def _steps(rank: int, world_size: int, exchange: Optional[str]) -> List[Tuple[int, str, str]]:
    """The events of STEPS steps (``exchange``: the prefetch's, None: no prefetch)."""
    from rayemb.embedding.comm import instrument_ddp
    from rayemb.embedding.prefetch import StepPrefetch
    from rayemb.train.worker.step import StepBatch, TrainStep

    dmp, opt, remapper = _build(world_size, PLAN_A, seed=0)
    instrument_ddp(dmp)
    rec = _Recorder()
    pre = None
    if exchange is not None:
        pre = StepPrefetch(dmp, exchange=exchange)
        pre.set_trace(rec.add)
    hooked: List[int] = []

    def loss_fn(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out, labels)
        hooked.append(_hook_pooled_backward(loss, rec))
        return loss

    step = TrainStep(dmp, opt, loss_fn, prefetch=pre, counter=_collective_recorder(rec), timer=rec)
    batches = []
    for s in range(STEPS):
        kjt, labels = checkpoint_batch(remapper, TABLES, LOCAL_BATCH, s, rank, world_size)
        batches.append(StepBatch((kjt,), labels, kjt))
    for _ in step.steps(batches):
        pass
    step.finish()
    assert all(hooked), hooked  # every step's graph holds pooled all-to-alls
    return sorted(rec.events)


def _by_step(events: List[Tuple[int, str, str]]) -> List[Dict[str, Any]]:
    """Per step: the sequence numbers of its phase ends and the prefetch and collective events between them."""
    ends = [seq for seq, ev, d in events if ev == "phase" and d == "optimizer"]
    out, begin = [], -1
    for end in ends:
        mine = [(seq, ev, d) for seq, ev, d in events if begin < seq <= end]
        phase = {d: seq for seq, ev, d in mine if ev == "phase" and d != "data_wait"}
        out.append({"forward": phase["forward"], "backward": phase["backward"], "optimizer": end, "events": mine})
        begin = end
    return out


def pipeline_violations(events: List[Tuple[int, str, str]], full: bool) -> List[str]:
    """What breaks TorchRec's pipeline order in a run's ``events`` (module docstring); empty when it holds."""
    steps, bad = _by_step(events), []
    for k in range(len(steps) - 1):
        s, nxt = steps[k], steps[k + 1]
        sent = {d: seq for seq, ev, d in s["events"] if ev == "splits"}
        if not sent:
            bad.append(f"step {k}: batch {k + 1}'s exchange not started during step {k}")
            continue
        if not all(s["forward"] < seq < s["backward"] for seq in sent.values()):
            bad.append(f"step {k}: batch {k + 1}'s split sizes not sent between forward and backward")
        backward_collectives = [seq for seq, ev, d in s["events"] if ev == "collective" and d.endswith("/backward")]
        if full:
            tensors = {d: seq for seq, ev, d in s["events"] if ev == "tensors"}
            if set(tensors) != set(sent):
                bad.append(f"step {k}: lengths and values sent for {sorted(tensors)}, split sizes for {sorted(sent)}")
            elif max(tensors.values()) > min(backward_collectives):
                bad.append(f"step {k}: lengths and values sent after the backward's first collective")
        lookups = {d: seq for seq, ev, d in nxt["events"] if ev == "lookup"}
        for child in sent:
            arrived = [seq for seq, ev, d in events if ev == "arrived" and d == child and seq > sent[child]]
            if child not in lookups:
                bad.append(f"step {k + 1}: {child} did not take the prefetched input")
            elif not arrived or min(arrived) > lookups[child]:
                bad.append(f"step {k + 1}: {child}'s input not arrived before its lookup")
    for k, s in enumerate(steps[1:], start=1):  # DDP orders its buckets by the first backward's gradients
        fired = [seq for seq, ev, d in s["events"] if ev == "collective" and d == "all_reduce/backward"]
        done = [seq for seq, ev, d in s["events"] if ev == "pooled_a2a_backward_done"]
        if not fired or not done or min(fired) > max(done):
            bad.append(f"step {k}: DDP's all-reduce fired after every pooled all-to-all's backward completed")
    return bad


@pytest.mark.parametrize("exchange", ["splits", "full"])
def test_next_exchange_runs_in_torchrec_pipeline_order(exchange):
    per_rank = run_multiprocess(_steps, 2, exchange=exchange)
    for rank, events in enumerate(per_rank):
        assert pipeline_violations(events, full=exchange == "full") == [], (rank, exchange)
        if exchange == "splits":  # the lengths and values then move in the next forward, which the check sees
            assert any("lengths and values" in b for b in pipeline_violations(events, full=True)), rank


def test_without_prefetch_the_order_check_fails():
    per_rank = run_multiprocess(_steps, 2, exchange=None)
    for events in per_rank:
        bad = pipeline_violations(events, full=False)
        assert any("not started" in b for b in bad), bad
