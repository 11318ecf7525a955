"""A job start takes its train split's fingerprint once: the kept statistics' name, their check and keeping
them all use that one (it lists and stats every file: a request each on an object store)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayemb.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "jobs" / "configs" / "synth_small.yaml")


@pytest.fixture
def fingerprints(monkeypatch):
    """The splits whose fingerprint is taken (the real function, counted wherever the driver's path calls it)."""
    import rayemb.data.fingerprint as fingerprint
    import rayemb.data.stats as stats
    import rayemb.data.stats_io as stats_io

    calls = []
    real = fingerprint.dataset_fingerprint

    def counted(data_dir, split="train"):
        calls.append(split)
        return real(data_dir, split)

    for module in (fingerprint, stats, stats_io):
        monkeypatch.setattr(module, "dataset_fingerprint", counted)
    return calls


@pytest.fixture
def passes(monkeypatch):
    import rayemb.data.stats_io as stats_io

    calls = []
    real = stats_io.compute_stats

    def counted(data_dir, *args, **kwargs):
        calls.append(kwargs.get("split", "train"))
        return real(data_dir, *args, **kwargs)

    monkeypatch.setattr(stats_io, "compute_stats", counted)
    return calls


def _job_start(cfg):
    """The driver's statistics stage and the keeping of them that its tracking stage does."""
    from rayemb.data.stats_io import keep_stats
    from rayemb.train.driver.trainer import check_inputs, compute_statistics

    inputs = check_inputs(cfg)
    stats = compute_statistics(inputs)
    return stats, keep_stats(stats, inputs.out_dir, inputs.data_dir)


def test_a_job_start_fingerprints_its_train_split_once_cold_and_warm(tiny_data, tmp_path, fingerprints, passes):
    cfg = load_config(CONFIG, [f"data.path={tiny_data}", f"tracking.output_dir={tmp_path / 'runs'}"])

    cold, kept = _job_start(cfg)
    assert passes == ["train"]
    assert fingerprints.count("train") == 1
    assert cold.fingerprint and kept.endswith(f"train-{cold.fingerprint.split(':', 1)[1]}.json")

    del fingerprints[:]
    warm, kept_again = _job_start(cfg)
    assert passes == ["train"]  # the kept statistics, no second pass
    assert fingerprints.count("train") == 1
    assert kept_again == kept and warm.to_dict() == cold.to_dict()
