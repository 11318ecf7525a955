"""A real failure: a SIGKILLed worker, on a real local Ray, resumes from the last checkpoint.

The job runs one epoch of ``tiny_data`` (36,000 train rows / (2 ranks x 256) = 70 steps) with a
checkpoint every 20 steps; the worker process SIGKILLs itself. What the restarted group does with a
damaged newest checkpoint (it falls back to the previous intact one) is
tests/unit/test_checkpoint_retry.py; a node removed under an elastic job is
tests/cluster/test_elastic_node_loss.py.
"""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch

from rayemb.checkpoint.export import unsharded_state
from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EVERY = 20


def _cfg(tiny_data, out, *extra):
    return load_config("jobs/configs/synth_small.yaml", [
        f"data.path={tiny_data}", f"tracking.output_dir={out}", "data.batch_size=256", "train.epochs=1",
        "scaling.max_failures=2", "train.log_every_n_steps=10", f"train.checkpoint_every_n_steps={EVERY}",
        "planner.calibrate=false", "data.in_memory=true", *extra])


def _checkpoints(out):
    """step -> checkpoint directory, of every retained checkpoint under ``out``."""
    found = {}
    for meta in glob.glob(os.path.join(out, "ray_results", "*", "checkpoint_*", "meta.json")):
        found[json.load(open(meta))["step"]] = os.path.dirname(meta)
    return found


def _logged_steps(result):
    steps = [r["step"] for r in result.reports if "train_loss" in r]
    return {s: steps.count(s) for s in sorted(set(steps))}


def test_killed_worker_resumes_from_the_last_checkpoint_and_matches_a_clean_resume(ray_2_cpus, tiny_data, tmp_path,
                                                                                   monkeypatch):
    from rayemb.train.trainer import run_training

    marker = tmp_path / "killed"
    monkeypatch.setenv("RAYEMB_FAULT_INJECTION", f"50:{marker}:kill")
    out = str(tmp_path / "a")
    result = run_training(_cfg(tiny_data, out))
    assert marker.exists() and result.status == "FINISHED"
    # attempt 1 logged 10..40 and died at 50 (after the step-40 checkpoint); attempt 2 redid 41..50 only
    logged = _logged_steps(result)
    assert [logged.get(s) for s in (40, 50, 60, 70)] == [1, 1, 1, 1], logged
    end = [r for r in result.reports if r.get("epoch_end")]
    assert [(r["step"], r["resumed_at_step"]) for r in end] == [(70, 40)]
    redone = 50 - end[0]["resumed_at_step"]
    assert 0 < redone <= EVERY
    ckpts = _checkpoints(out)
    assert 40 in ckpts and 70 in ckpts, sorted(ckpts)

    # a clean job resumed from the same step-40 checkpoint ends with the same weights
    monkeypatch.delenv("RAYEMB_FAULT_INJECTION")
    clean = run_training(_cfg(tiny_data, str(tmp_path / "b"), f"train.resume_from={ckpts[40]}"))
    assert clean.status == "FINISHED"
    killed_state, clean_state = unsharded_state(result.last_checkpoint), unsharded_state(clean.last_checkpoint)
    assert killed_state["meta"]["step"] == clean_state["meta"]["step"] == 70
    for name, states in killed_state["tables"].items():
        for state, tensor in states.items():
            assert torch.equal(tensor, clean_state["tables"][name][state]), (name, state)
    for key, tensor in killed_state["dense"].items():
        assert torch.equal(tensor, clean_state["dense"][key]), key
