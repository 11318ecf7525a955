"""A sweep's trials keep their statistics and calibrations in the sweep's output folder, where each trial reads
what an earlier one (or a plain job with that output folder) kept."""

import os

from rayemb.sweep.trial import share_kept


def test_trials_read_and_write_the_sweeps_kept_folders(tmp_path):
    out = tmp_path / "runs"
    (out / "stats").mkdir(parents=True)
    (out / "stats" / "train-abc.json").write_text("{}")  # kept by a plain job on the same output folder
    first, second = out / "sweeps" / "s" / "t1", out / "sweeps" / "s" / "t2"
    share_kept(str(out), str(first))
    share_kept(str(out), str(first))  # a resumed trial: its links are there
    share_kept(str(out), str(second))
    assert sorted(os.listdir(first / "stats")) == ["train-abc.json"]
    (first / "calibrations" / "kept.json").write_text("{}")
    assert sorted(os.listdir(second / "calibrations")) == ["kept.json"]
    assert os.path.realpath(second / "calibrations") == str(out / "calibrations")


def test_a_remote_output_folder_is_left_alone(tmp_path):
    share_kept("s3://bucket/runs", str(tmp_path / "trial"))
    assert not (tmp_path / "trial").exists()
