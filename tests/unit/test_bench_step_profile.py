"""jobs/bench/step_profile.py counts the operators one step runs from the torch profiler's events."""

from __future__ import annotations

import torch

from tests._bench import load_bench


def test_launches_per_step_counts_every_aten_call_and_the_top_level_ones():
    sp = load_bench("step_profile")
    a, w = torch.randn(8, 4), torch.randn(3, 4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):  # three "steps" of two top-level operators each
            torch.add(a, a)
            torch.nn.functional.linear(a, w)  # aten::linear, with the matmul it calls nested inside
    got = sp.launches_per_step(prof.events(), 3)
    assert got["top_level_aten_ops"] == 2.0
    assert got["aten_ops"] > got["top_level_aten_ops"]  # the nested calls count too
    assert got["device_kernels"] == 0.0
