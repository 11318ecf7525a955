"""A job keeps the statistics of the files it trained on in its output folder; the next job on the same files
reads them instead of a statistics pass, and a changed file makes it count again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rayemb.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "jobs" / "configs" / "synth_small.yaml")


@pytest.fixture
def passes(monkeypatch):
    """The train split's statistics passes the driver runs (the real pass, counted)."""
    import rayemb.data.stats_io as stats_io

    calls = []
    real = stats_io.compute_stats

    def counted(data_dir, *args, **kwargs):
        calls.append(kwargs.get("split", "train"))
        return real(data_dir, *args, **kwargs)

    monkeypatch.setattr(stats_io, "compute_stats", counted)
    return calls


def test_the_next_job_on_the_same_files_reads_the_kept_statistics(tiny_data, tmp_path, passes):
    from rayemb.data.stats_io import keep_stats, kept_stats_path
    from rayemb.train.driver.trainer import check_inputs, compute_statistics

    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    out = tmp_path / "runs"
    cfg = load_config(CONFIG, [f"data.path={data}", f"tracking.output_dir={out}"])
    inputs = check_inputs(cfg)
    first = compute_statistics(inputs)
    assert passes == ["train"]
    assert not out.exists() or not any(out.iterdir())  # kept once outputs start (start_tracking), not before
    kept = keep_stats(first, inputs.out_dir, inputs.data_dir)
    assert kept == kept_stats_path(str(out), str(data)) and os.path.isfile(kept)

    again = compute_statistics(check_inputs(cfg))
    assert passes == ["train"]  # no second pass
    assert again.to_dict() == first.to_dict()

    # a rewritten file is other data: counted again, kept under another name
    part = next(p for p in sorted((data / "train").iterdir()) if p.suffix == ".parquet")
    stat = part.stat()
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert kept_stats_path(str(out), str(data)) != kept
    compute_statistics(check_inputs(cfg))
    assert passes == ["train", "train"]


def test_a_given_stats_file_wins_and_nothing_is_kept_beside_it(tiny_data, tmp_path, passes):
    from rayemb.data.stats_io import kept_stats_path, write_stats_json
    from rayemb.train.driver.trainer import check_inputs, compute_statistics

    out = tmp_path / "runs"
    cfg = load_config(CONFIG, [f"data.path={tiny_data}", f"tracking.output_dir={out}"])
    stats = compute_statistics(check_inputs(cfg))
    given = write_stats_json(stats, str(tmp_path / "stats.json"))
    cfg = load_config(CONFIG, [f"data.path={tiny_data}", f"tracking.output_dir={out}", f"data.stats_path={given}"])
    compute_statistics(check_inputs(cfg))
    assert passes == ["train"]
    assert not os.path.exists(kept_stats_path(str(out), str(tiny_data)))
