"""jobs/bench/sweep.py's judging: trials read back from MLflow runs, the store's completeness, a trial's fixed
cost against the bare TorchTrainer, and the verdicts (a missing figure is a FAIL, never a pass)."""

from __future__ import annotations

import pytest

from tests._bench import load_bench as _load

sw = _load("sweep")


def _run(run_id, status, start, dim, lr, aucs, phases=None, params=None, stopped_at=None):
    return {"stopped_reason": None if stopped_at is None else
            f"asha: valid_auc=0.8 below the median of the trials at validation {stopped_at} (epoch 1)","run_id": run_id, "trial_id": f"t{run_id}", "status": status, "start_ms": start,
            "end_ms": start + 30_000,
            "params": params if params is not None else {"model.embedding_dim": str(dim), "train.dense_lr": str(lr)},
            "metrics": {f"phase_s.{k}": v for k, v in (phases or {}).items()}, "valid_auc_history": aucs}


def _trials():
    return sw.trial_rows([
        # the run's history lacks the second validation it reported to Tune
        _run("b", "KILLED", 2_000, 8, 0.01, [0.80], stopped_at=2),
        _run("a", "FINISHED", 1_000, 16, 0.002, [0.85, 0.91, 0.90], {"wall": 60.0, "steps": 10.0}),
        _run("c", "FINISHED", 3_000, 32, 0.004, [0.86, 0.905], {"wall": 30.0, "steps": 10.0}),
        _run("d", "FINISHED", 4_000, 32, 0.001, [0.84, 0.90], {"wall": 34.0, "steps": 10.0}),
    ], sw.KEYS)


def test_trials_are_in_start_order_with_their_values_read_back_as_numbers_and_best_and_last_auc():
    rows = _trials()
    assert [r["run_id"] for r in rows] == ["a", "b", "c", "d"]
    a = rows[0]
    assert (a["model.embedding_dim"], a["train.dense_lr"]) == (16, 0.002)
    assert (a["best_valid_auc"], a["last_valid_auc"], a["validations"], a["run_wall_s"]) == (0.91, 0.90, 3, 30.0)
    assert a["phases"] == {"wall": 60.0, "steps": 10.0} and rows[1]["phases"] == {}
    assert (a["stopped_at_validation"], rows[1]["stopped_at_validation"]) == (None, 2)


def test_the_store_is_complete_only_with_one_parent_every_child_and_every_swept_param():
    children = [_run(str(i), "FINISHED", i, 8, 0.01, [0.9]) for i in range(3)]
    assert sw.mlflow_check(1, children, sw.KEYS, 3)["complete"]
    assert not sw.mlflow_check(2, children, sw.KEYS, 3)["complete"]
    assert not sw.mlflow_check(1, children[:2], sw.KEYS, 3)["complete"]
    lacking = [*children[:2], _run("x", "KILLED", 9, 8, 0.01, [0.9], params={"model.embedding_dim": "8"})]
    check = sw.mlflow_check(1, lacking, sw.KEYS, 3)
    assert not check["complete"] and check["children_missing_params"] == {"x": ["train.dense_lr"]}


def test_fixed_cost_is_wall_minus_steps_minus_the_median_bare_wall_first_trial_and_new_shapes_apart_from_warm_ones():
    fixed = sw.fixed_minus_ray(_trials(), [12.0, 14.0, 13.0])
    assert fixed["bare_s"] == 13.0
    assert fixed["first"] == pytest.approx(37.0)
    # the stopped trial has no epoch's steps: no row, not a zero
    assert fixed["per_trial"][1] is None
    # the first trial of dim 32 probes its plan; the second one of dim 32 reads it
    assert fixed["first_of_shape"]["n"] == 1 and fixed["first_of_shape"]["median"] == pytest.approx(7.0)
    assert fixed["warm"]["n"] == 1 and fixed["warm"]["median"] == pytest.approx(11.0)
    assert fixed["later"]["n"] == 2 and fixed["later"]["median"] == pytest.approx(9.0)
    assert sw.fixed_minus_ray(_trials(), [])["first"] is None


def _summary(trials, **kw):
    args = dict(sweep_wall=100.0, sequential_walls=[60.0] * 4, expected_trials=4, default_auc=0.9085,
                mlflow={"complete": True}, fixed=sw.fixed_minus_ray(trials, [13.0]))
    args.update(kw)
    return sw.summarize(trials, **args)


def test_the_figures_and_verdicts_of_a_sweep():
    s = _summary(_trials())
    assert s["stopped_early_fraction"] == 0.25 and s["stopped_at_last_validation"] == 0
    assert s["sweep_over_sequential"] == pytest.approx(100 / 240)
    assert s["best_trial"]["run_id"] == "a" and s["best_minus_default_auc"] == pytest.approx(0.0015)
    v = sw.verdicts(s)
    assert v == {"stopped_early_fraction": "FAIL", "sweep_over_sequential": "PASS", "best_minus_default_auc": "PASS",
                 "mlflow_complete": "PASS", "rayemb_fixed_minus_ray_s.first": "FAIL",
                 "rayemb_fixed_minus_ray_s.warm": "FAIL"}


def test_a_trial_stopped_at_the_last_validation_was_not_stopped_early():
    trials = [*_trials(), *sw.trial_rows([_run("e", "KILLED", 5_000, 8, 0.003, [0.8, 0.85, 0.86], stopped_at=3)],
                                         sw.KEYS)]
    s = _summary(trials, expected_trials=5, sequential_walls=[60.0] * 5)
    assert (s["stopped_early"], s["stopped_at_last_validation"], s["stopped_early_fraction"]) == (1, 1, 0.2)


def test_a_missing_figure_fails_its_target():
    trials = _trials()
    # a sequential run failed: no wall of the whole to compare with
    s = _summary(trials, sequential_walls=[60.0] * 3)
    assert s["sequential_wall_s"] is None and sw.verdicts(s)["sweep_over_sequential"] == "FAIL"
    # fewer trials than asked: the stopped fraction is not judged on what is left
    s = _summary(trials[:3])
    assert s["stopped_early_fraction"] is None and sw.verdicts(s)["stopped_early_fraction"] == "FAIL"
    # the default job failed; no bare run
    s = _summary(trials, default_auc=None, fixed=sw.fixed_minus_ray(trials, []))
    v = sw.verdicts(s)
    assert v["best_minus_default_auc"] == "FAIL" and v["rayemb_fixed_minus_ray_s.first"] == "FAIL"
    assert v["rayemb_fixed_minus_ray_s.warm"] == "FAIL"
    # a best trial only counts when it did not fail
    failed = [{**t, "status": "FAILED"} for t in trials]
    assert _summary(failed)["best_trial"] is None



def test_an_interrupted_benchmark_is_judged_on_the_runs_it_made(tmp_path):
    import json

    doc = {"space": {"model.embedding_dim": {"grid": [8, 16, 32]}, "train.dense_lr": {"loguniform": [1e-3, 1e-2]}},
           "num_samples": 1, "host": {"cpu_count": 2, "load_avg_1m": [1.0, 3.0]}, "interrupted": "after 4 run(s)",
           "runs": [{"kind": "bare", "wall_s": 13.0}, {"kind": "sweep", "wall_s": 120.0},
                    {"kind": "default", "wall_s": 50.0, "valid_auc": 0.9},
                    {"kind": "sequential", "wall_s": 60.0}, {"kind": "sequential", "wall_s": 70.0, "error": "x"}],
           "trials": _trials()[:3], "mlflow": {"complete": True}}
    out = tmp_path / "sweep.json"
    assert sw.finish(doc, str(out)) == 0
    written = json.loads(out.read_text())
    s = written["summary"]
    assert (s["sweep_wall_s"], s["sequential_runs"], s["sequential_wall_s"]) == (120.0, 1, None)
    assert s["best_minus_default_auc"] == pytest.approx(0.01)
    assert written["target"]["verdict"]["sweep_over_sequential"] == "FAIL"
    assert written["host_note"].startswith("1-min load average 1.0-3.0")
