"""jobs/bench/default_tuning.py's judging: held-out rows apart from the selection rows, a config's rows per epoch,
and the goal held on every seed (not on the median)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests._bench import load_bench as _load

dt = _load("default_tuning")


def _reports(*aucs):
    return [{"step": 10 * (i + 1), "valid_auc": a, "epoch_end": 1} for i, a in enumerate(aucs)]


def _row(seed, config, best, last, test):
    return {"seed": seed, "config": config, "best": best, "last": last, "gap": best - last, "test": test}


def test_the_valid_rows_are_cut_into_a_selection_half_and_a_held_out_half(tmp_path):
    data = tmp_path / "data"
    (data / "valid").mkdir(parents=True)
    (data / "train").mkdir()
    pq.write_table(pa.table({"label": list(range(11))}), data / "valid" / "part-00000.parquet")
    (data / "schema.yaml").write_text("label: label\n")
    view = dt.split_view(str(data), str(tmp_path / "view"))
    valid = pq.read_table(os.path.join(view, "valid"))["label"].to_pylist()
    test = pq.read_table(os.path.join(view, "test"))["label"].to_pylist()
    assert valid == list(range(5)) and test == list(range(5, 11))  # disjoint, every row in one of them
    assert os.path.realpath(os.path.join(view, "train")) == str(data / "train")
    assert open(os.path.join(view, "schema.yaml")).read() == "label: label\n"


def test_a_constant_rate_job_gives_a_row_per_epoch_count_with_that_epochs_checkpoint_scored():
    rows = dt.run_rows("today", _reports(0.91, 0.89, 0.87), {0: 0.905, 1: 0.88, 2: 0.86}, constant=True)
    assert [(r["config"], r["epochs"], r["best"], r["last"], r["test"]) for r in rows] == [
        ("today@1ep", 1, 0.91, 0.91, 0.905), ("today@2ep", 2, 0.91, 0.89, 0.88), ("today", 3, 0.91, 0.87, 0.86)]
    # a decaying schedule depends on the job's length: only the whole job is a row
    (only,) = dt.run_rows("cosine_2ep", _reports(0.91, 0.909), {0: 0.9, 1: 0.907}, constant=False)
    assert (only["config"], only["last"], only["test"]) == ("cosine_2ep", 0.909, 0.907)
    assert only["gap"] == pytest.approx(0.001)


def test_the_goal_holds_on_every_seed_and_the_best_median_test_auc_among_those_meeting_it_is_chosen():
    seeds = [0, 1, 2]
    today = [_row(s, "today", 0.91, 0.87, 0.86) for s in seeds]
    good = [_row(s, "good", 0.912, 0.911, 0.905) for s in seeds]
    # best median test AUC, but its gap is 0.003 on one seed of three
    gappy = [_row(0, "gappy", 0.92, 0.919, 0.91), _row(1, "gappy", 0.92, 0.917, 0.91),
             _row(2, "gappy", 0.92, 0.919, 0.91)]
    # no gap, but its best epoch is below today's on seed 2
    low = [_row(0, "low", 0.92, 0.92, 0.909), _row(1, "low", 0.92, 0.92, 0.909), _row(2, "low", 0.909, 0.909, 0.9)]
    short = [_row(0, "short", 0.93, 0.93, 0.92)]  # a seed missing
    goal = {r["config"]: r["goal"] for r in dt.summarize(today + good + gappy + low + short, seeds)}
    assert goal == {"today": "no", "good": "yes", "gappy": "no", "low": "no", "short": "no"}
    failed = {"seed": 1, "config": "good", "error": "RayTaskError: worker died"}
    rows = dt.summarize(today + good[::2] + [failed] + gappy, seeds)
    assert {r["config"]: r["goal"] for r in rows}["good"] == "no"  # a failed run is a missing seed
