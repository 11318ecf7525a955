"""rayemb.train.calibration.probes.Interleaved: steps timed round-robin, slopes from differences within a round."""

import pytest

from rayemb.train.calibration import probes as calibrate_probes
from rayemb.train.calibration.probes import Interleaved


class _Clock:
    """A fake perf_counter: each step advances it by its own cost times the host's slowdown at that moment."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls = 0

    def __call__(self) -> float:
        return self.now


def _drifting(monkeypatch, costs, slow_from_call):
    """Steps of fixed ``costs``; from the ``slow_from_call``-th step on the host is 2x slower (a drift)."""
    clock = _Clock()
    monkeypatch.setattr(calibrate_probes.time, "perf_counter", clock)
    order = []

    def step(name):
        def run():
            order.append(name)
            clock.calls += 1
            clock.now += costs[name] * (2.0 if clock.calls > slow_from_call else 1.0) + (
                0.5 if clock.calls > slow_from_call else 0.0)  # and a stall added to every step
        return run

    return clock, order, step


def test_rounds_rotate_and_time_every_step_once_per_round(monkeypatch):
    _, order, step = _drifting(monkeypatch, {"a": 1.0, "b": 2.0, "c": 3.0}, slow_from_call=10**9)
    barriers = []
    iv = Interleaved(barrier=lambda: barriers.append(len(order)))
    for name in "abc":
        iv.add(name, step(name))
    iv.run(rounds=3, warmup=1)
    # every round runs each step once, starting one place later each round; a barrier before each step
    assert order == list("abc" "bca" "cab" "abc")
    assert barriers == list(range(12))
    assert {n: len(t) for n, t in iv.times.items()} == {"a": 3, "b": 3, "c": 3}  # the warm-up round untimed
    assert iv.median("c") == pytest.approx(3.0) and iv.difference("c", "a") == pytest.approx(2.0)


def test_a_slope_from_differences_within_a_round_ignores_a_stall_that_a_sequential_timing_would_not(monkeypatch):
    # 'hi' costs 1.0 more than 'lo'. Timed one after the other (all of lo's steps, then hi's), a stall of 0.5 s a
    # step that starts between them reads as part of hi's cost; interleaved, both see it in the same rounds.
    _, _, step = _drifting(monkeypatch, {"lo": 1.0, "hi": 2.0}, slow_from_call=6)
    iv = Interleaved()
    iv.add("lo", step("lo"))
    iv.add("hi", step("hi"))
    iv.run(rounds=10, warmup=0)
    # the later rounds ran on the 2x slower host, the slope doubled with it, and the added stall cancelled
    assert iv.difference("hi", "lo") == pytest.approx(2.0)
    assert iv.median("hi") - iv.median("lo") == pytest.approx(2.0)

    _, _, step = _drifting(monkeypatch, {"lo": 1.0, "hi": 2.0}, slow_from_call=6)
    seq = {}
    for name in ("lo", "hi"):
        one = Interleaved()
        one.add(name, step(name))
        one.run(rounds=6, warmup=0)
        seq[name] = one.median(name)
    assert seq["hi"] - seq["lo"] == pytest.approx(3.5)  # 2x the slope plus the stall, all charged to hi


def test_adding_a_step_twice_is_an_error():
    iv = Interleaved()
    iv.add("a", lambda: None)
    with pytest.raises(ValueError, match="added twice"):
        iv.add("a", lambda: None)


def test_finish_runs_once_after_the_last_round_untimed():
    calls = []
    iv = Interleaved()
    iv.add("a", lambda: calls.append("a"), finish=lambda: calls.append("finish"))
    iv.add("b", lambda: calls.append("b"))
    iv.run(rounds=2, warmup=1)
    assert calls == ["a", "b", "b", "a", "a", "b", "finish"] and len(iv.times["a"]) == 2
