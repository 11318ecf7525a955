"""CLI error paths: one paragraph naming the input and the fix, non-zero exit, no traceback."""

import os
import subprocess
import sys

import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "rayemb.cli", *args], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def _job(*args):
    return subprocess.run(
        [sys.executable, os.path.join(REPO, "jobs", "train.py"), *args], capture_output=True, text=True,
        timeout=120, cwd=REPO,
    )


def _assert_user_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    assert p.stderr.startswith("rayemb: error: ")
    for n in needles:
        assert n in p.stderr, p.stderr


def test_help_lists_commands_with_examples():
    p = _cli("--help")
    assert p.returncode == 0
    for cmd in ["gen-data", "stats", "plan", "train", "compare"]:
        assert cmd in p.stdout
    p = _cli("gen-data", "--help")
    assert p.returncode == 0 and "example:" in p.stdout


def test_missing_config_file():
    _assert_user_error(_job("--config", "nope.yaml"), "nope.yaml", "does not exist")


def test_bad_config_value(tmp_path):
    cfg = os.path.join(REPO, "jobs", "configs", "synth_small.yaml")
    _assert_user_error(_job("--config", cfg, "--set", "data.batch_size=-3"), "data.batch_size", "positive")


def test_missing_data_path(tmp_path):
    cfg = os.path.join(REPO, "jobs", "configs", "synth_small.yaml")
    p = _job("--config", cfg, "--set", f"data.path={tmp_path}/absent")
    _assert_user_error(p, f"{tmp_path}/absent", "rayemb gen-data")


def test_dataset_missing_a_configured_column(tmp_path, tiny_data):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_data, broken)
    part = next((broken / "train").glob("*.parquet"))
    pq.write_table(pq.read_table(part).drop(["C3"]), part)
    cfg = os.path.join(REPO, "jobs", "configs", "synth_small.yaml")
    p = _job("--config", cfg, "--set", f"data.path={broken}", "--set", f"tracking.output_dir={tmp_path}/out")
    _assert_user_error(p, "C3", "missing")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_gen_data_bad_rows(tmp_path):
    _assert_user_error(_cli("gen-data", "--out", str(tmp_path / "d"), "--rows", "1"), "rows=1")


def test_bad_table_pin_names_the_table(tmp_path, tiny_data):
    cfg = os.path.join(REPO, "jobs", "configs", "synth_small.yaml")
    p = _job("--config", cfg, "--set", f"data.path={tiny_data}", "--set", f"tracking.output_dir={tmp_path}/out",
             "--set", "planner.tables={C2: {sharding: diagonal}}")
    _assert_user_error(p, "C2", "diagonal", "row_wise")
    assert not (tmp_path / "out").exists()
