"""`rayemb compare --sweep`: a sweep's trials read back from a real MLflow sqlite store, tables and charts."""

from __future__ import annotations

import csv

import pytest
from _png import assert_png
from mlflow import MlflowClient

from rayemb.cli import main
from rayemb.tracking import ensure_store
from rayemb.tracking.store import artifact_location

KEYS = ("train.dense_lr", "model.embedding_dim", "train.dense_optimizer")
T0 = 1_800_000_000_000  # ms; every run's start and end are set, so wall seconds are exact

#: name -> (lr, dim, optimizer, status, valid_auc per validation at steps 10, 20, ..., last train_loss step, wall s)
TRIALS = {
    "t0": ("0.0001", "8", "adagrad", "FINISHED", [0.60, 0.65, 0.66], 30, 120.0),
    "t1": ("0.001", "16", "adam", "FINISHED", [0.70, 0.74, 0.72], 30, 118.5),  # its best is not its last
    "t2": ("0.01", "32", "adam", "KILLED", [0.55], 10, 41.0),
    "t3": ("0.1", "8", "adagrad", "FAILED", [0.80], 14, 50.25),  # best value, but it failed
    "t4": ("0.003", "32", "adagrad", "FINISHED", [0.68, 0.71, 0.73], 30, 130.0),
    "t5": ("0.03", "16", "adam", "FAILED", [], 3, 5.0),
}
#: best first: finished and stopped trials by AUC, then the failed one with an AUC, then the one without
ORDER = ["t1", "t4", "t0", "t2", "t3", "t5"]
BEST_AUC = {"t0": 0.66, "t1": 0.74, "t2": 0.55, "t3": 0.80, "t4": 0.73}


def _client_and_experiment(uri, name):
    ensure_store(uri)
    client = MlflowClient(uri)
    return client, client.create_experiment(name, artifact_location=artifact_location(uri, name))


def make_sweep(client, exp_id, trials, metric="valid_auc", mode="max", keys=KEYS):
    """A parent run in the layout of `rayemb sweep` and one child per trial; returns (parent id, {name: run id})."""
    parent = client.create_run(exp_id, run_name="sweep", start_time=T0,
                               tags={"rayemb.kind": "sweep"}).info.run_id
    for k, v in {"sweep.keys": ",".join(keys), "sweep.metric": metric, "sweep.mode": mode, "sweep.search": "random",
                 "sweep.scheduler": "asha", "sweep.num_samples": str(len(trials))}.items():
        client.log_param(parent, k, v)
    ids = {}
    for i, (name, (lr, dim, opt, status, aucs, last_step, wall)) in enumerate(trials.items()):
        start = T0 + 1000 * i
        tags = {"mlflow.parentRunId": parent, "rayemb.sweep.trial_id": f"trial_{name}", "rayemb.kind": "train"}
        if status == "KILLED":
            tags["rayemb.stopped_reason"] = "asha: below the median at step 10"
        run = client.create_run(exp_id, run_name=name, start_time=start, tags=tags).info.run_id
        for k, v in zip(keys, (lr, dim, opt)):
            client.log_param(run, k, v)
        for step in range(0, last_step + 1):
            client.log_metric(run, "train_loss", 0.7 - step / 100, timestamp=start + step, step=step)
        for j, auc in enumerate(aucs):
            client.log_metric(run, metric, auc, timestamp=start + j, step=10 * (j + 1))
        client.set_terminated(run, status, end_time=start + int(wall * 1000))
        ids[name] = run
    client.set_tag(parent, "rayemb.sweep.best_run_id", ids[ORDER[0]] if ORDER[0] in ids else "")
    client.set_terminated(parent, "FINISHED", end_time=T0 + 10**6)
    return parent, ids


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep_cmp")
    uri = f"sqlite:///{root.resolve()}/mlflow.db"
    client, exp_id = _client_and_experiment(uri, "sweep-cmp")
    parent, ids = make_sweep(client, exp_id, TRIALS)
    lone = client.create_run(exp_id, run_name="lone", tags={"rayemb.kind": "train"}).info.run_id
    empty = client.create_run(exp_id, run_name="empty", tags={"rayemb.kind": "sweep"}).info.run_id
    for k, v in {"sweep.keys": "train.dense_lr", "sweep.metric": "valid_auc", "sweep.mode": "max"}.items():
        client.log_param(empty, k, v)
    return {"uri": uri, "parent": parent, "ids": ids, "lone": lone, "empty": empty}


@pytest.mark.timeout(120)
def test_the_table_lists_every_trial_best_first_with_its_best_metric(sweep, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compare", "--sweep", sweep["parent"], "--out", str(out), "--tracking-uri", sweep["uri"]]) == 0
    with open(out / "sweep.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["run_id", "trial", "status", *KEYS, "valid_auc", "steps", "wall_s"]
    want = []
    for name in ORDER:
        lr, dim, opt, status, aucs, last_step, wall = TRIALS[name]
        auc = repr(BEST_AUC[name]) if name in BEST_AUC else "-"
        want.append([sweep["ids"][name], f"trial_{name}", status, lr, dim, opt, auc,
                     str(max(last_step, 10 * len(aucs))), repr(wall)])
    assert rows[1:] == want

    md = (out / "sweep.md").read_text().splitlines()
    assert md[2] == "| " + " | ".join(rows[0]) + " |"
    assert md[4].split(" | ")[:7] == [f"| {sweep['ids']['t1']}", "trial_t1", "FINISHED", "0.001", "16", "adam",
                                      "0.7400"]
    assert len([ln for ln in md if ln.startswith("| ")]) == 1 + len(TRIALS)

    charts = ["sweep_train.dense_lr.png", "sweep_model.embedding_dim.png", "sweep_train.dense_optimizer.png",
              "sweep_parallel.png"]
    for name in charts:
        assert_png(str(out / name))
    printed = capsys.readouterr().out
    assert f"best 0.7400 by run {sweep['ids']['t1']}" in printed
    for name in ["sweep.csv", "sweep.md", *charts]:
        assert f"wrote {out / name}" in printed


def test_axes_log_for_two_decades_categories_for_strings():
    from rayemb.tracking.plots import _param_axis

    lrs = [TRIALS[n][0] for n in TRIALS]
    assert _param_axis(lrs) == ("log", [])
    assert _param_axis(["8", "16", "32"]) == ("linear", [])  # four-fold: even spacing reads better
    assert _param_axis(["adam", "adagrad", "adam"]) == ("category", ["adagrad", "adam"])
    assert _param_axis(["True", "False"]) == ("category", ["False", "True"])


def test_a_min_sweep_ranks_the_lowest_first(sweep, tmp_path):
    from rayemb.tracking.sweep_report import load_sweep

    client, exp_id = _client_and_experiment(f"sqlite:///{(tmp_path / 'min.db').resolve()}", "min")
    trials = {n: TRIALS[n] for n in ("t0", "t1", "t2")}
    parent, ids = make_sweep(client, exp_id, trials, metric="valid_logloss", mode="min")
    report = load_sweep(client, parent)
    assert [(t.run_id, t.metric) for t in report.trials] == [(ids["t2"], 0.55), (ids["t0"], 0.60),
                                                             (ids["t1"], 0.70)]
    assert report.best.run_id == ids["t2"]  # stopped early, still a candidate


@pytest.mark.parametrize("case, words", [
    ("missing", "does not exist"),
    ("lone", "is not a sweep's parent run"),
    ("child", "is a child of run"),
    ("empty", "has no trial runs"),
])
def test_bad_sweeps_exit_2_with_one_message(sweep, case, words, tmp_path, capsys):
    run_id = {"missing": "0" * 32, "lone": sweep["lone"], "child": sweep["ids"]["t0"], "empty": sweep["empty"]}[case]
    out = tmp_path / "out"
    assert main(["compare", "--sweep", run_id, "--out", str(out), "--tracking-uri", sweep["uri"]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rayemb: error: ") and words in err[0], err
    assert not out.exists()


def test_experiment_options_are_refused_with_a_sweep(sweep, capsys):
    assert main(["compare", "--sweep", sweep["parent"], "--metric", "auc", "--tracking-uri", sweep["uri"]]) == 2
    assert "--metric do(es) not apply to --sweep" in capsys.readouterr().err


def test_the_best_trial_is_the_best_finished_or_stopped_one(sweep):
    from rayemb.sweep.best import best_trial

    assert best_trial(sweep["parent"], sweep["uri"]) == sweep["ids"]["t1"]  # not t3: it failed
