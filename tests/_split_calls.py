"""A fixture counting the frequent-category splits a run makes, through the real rule (not a stand-in)."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture
def split_calls(monkeypatch):
    """(world size, global batch, calling function) of every split the run makes, by the real rule."""
    from rayemb.planner.split import HugeCTRSplitRule

    calls = []
    real = HugeCTRSplitRule.split

    def counted(rule, stats):
        calls.append((rule.world_size, rule.global_batch_size, sys._getframe(1).f_code.co_name))
        return real(rule, stats)

    monkeypatch.setattr(HugeCTRSplitRule, "split", counted)
    return calls
