"""`rayemb compare` and the PNG charts, against a real MLflow sqlite store."""

from __future__ import annotations

import argparse
import csv

import pytest
from mlflow import MlflowClient
from _png import assert_png as _assert_png

from rayemb.errors import RayembError, TrackingError
from rayemb.tracking import plots
from rayemb.cli.compare import add_compare_arguments, compare_main
from rayemb.tracking import TAG_KIND, RunLogger, ensure_store

EXPERIMENT = "cmp"


def _final_auc(dim: int) -> float:
    return 0.70 + dim / 1000


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two finished runs that differ only in model.embedding_dim (8 vs 16)."""
    root = tmp_path_factory.mktemp("cmp")
    uri = f"sqlite:///{root.resolve()}/mlflow.db"
    ensure_store(uri)
    run_ids = {}
    for dim in (8, 16):
        rl = RunLogger(uri, EXPERIMENT, run_name=f"dim{dim}", flush_interval_s=0.05,
                       system_metrics_interval_s=None, spill_dir=str(root / "spill")).start()
        rl.log_params({"model": {"embedding_dim": dim, "top_mlp": [64, 1]}, "train": {"epochs": 2}})
        for step in range(10):
            rl.log_metrics({"loss": 0.7 - step * dim / 1000, "valid/auc": 0.5 + (_final_auc(dim) - 0.5) * step / 9},
                           step=step)
        assert rl.finish() is True
        run_ids[dim] = rl.run_id
    return uri, run_ids


def _args(*argv: str) -> argparse.Namespace:
    return add_compare_arguments(argparse.ArgumentParser(prog="rayemb compare")).parse_args(list(argv))


@pytest.mark.timeout(120)
def test_compare_two_runs_names_the_differing_param_and_writes_charts(store, tmp_path, capsys):
    uri, run_ids = store
    out = tmp_path / "out"
    rc = compare_main(_args("--experiment", EXPERIMENT, "--metric", "auc", "loss", "--out", str(out),
                            "--tracking-uri", uri, "--log-run"))
    assert rc == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.startswith("run "))
    assert header.split() == ["run", "run_id", "status", "model.embedding_dim", "valid/auc", "loss"]
    assert "train.epochs" not in printed and "model.top_mlp" not in printed  # equal params are not shown
    assert "1 params differ, 2 are equal" in printed
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if line.startswith("dim")}
    assert rows["dim8"][3:] == ["8", f"{_final_auc(8):.4f}", f"{0.7 - 9 * 8 / 1000:.4f}"]
    assert rows["dim16"][3:] == ["16", f"{_final_auc(16):.4f}", f"{0.7 - 9 * 16 / 1000:.4f}"]

    with open(out / "compare.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["run"] for r in table] == ["dim8", "dim16"]  # oldest first
    assert [r["run_id"] for r in table] == [run_ids[8], run_ids[16]]
    assert [float(r["valid/auc"]) for r in table] == pytest.approx([_final_auc(8), _final_auc(16)])
    md = (out / "compare.md").read_text()
    assert "| run | run_id | status | model.embedding_dim | valid/auc | loss |" in md
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["curves_loss.png", "curves_valid_auc.png", "final_loss_vs_model.embedding_dim.png",
                    "final_valid_auc_vs_model.embedding_dim.png"]
    for name in pngs:
        _assert_png(str(out / name))

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    logged = client.search_runs([exp.experiment_id], f"tags.`{TAG_KIND}` = 'comparison'")
    assert len(logged) == 1 and logged[0].info.run_name == "comparison"
    assert logged[0].info.status == "FINISHED"
    assert sorted(a.path for a in client.list_artifacts(logged[0].info.run_id)) == sorted(
        ["compare.csv", "compare.md"] + pngs)

    # the comparison run is bookkeeping: a second compare still sees the two training runs only
    rc = compare_main(_args("--experiment", EXPERIMENT, "--out", str(tmp_path / "again"), "--tracking-uri", uri,
                            "--filter", "params.`model.embedding_dim` = '16'"))
    assert rc == 0
    with open(tmp_path / "again" / "compare.csv", newline="") as f:
        assert [r["run_id"] for r in csv.DictReader(f)] == [run_ids[16]]


@pytest.mark.timeout(60)
def test_compare_user_errors_have_categories(store, tmp_path, monkeypatch):
    uri, _ = store
    out = str(tmp_path / "o")
    with pytest.raises(TrackingError) as e:
        compare_main(_args("--experiment", "nope", "--out", out, "--tracking-uri", uri))
    assert e.value.category == "not_found" and "'nope'" in str(e.value) and EXPERIMENT in str(e.value)
    with pytest.raises(TrackingError) as e:
        compare_main(_args("--experiment", EXPERIMENT, "--out", out, "--tracking-uri", uri, "--filter", "params.x >>"))
    assert e.value.category == "invalid_filter"
    with pytest.raises(TrackingError) as e:
        compare_main(_args("--experiment", EXPERIMENT, "--out", out, "--tracking-uri", uri,
                           "--filter", "metrics.loss > 100"))
    assert e.value.category == "no_runs"
    with pytest.raises(TrackingError) as e:
        compare_main(_args("--experiment", EXPERIMENT, "--out", out, "--tracking-uri", uri, "--param", "model.dim"))
    assert e.value.category == "invalid_input" and "model.embedding_dim" in str(e.value)
    missing = tmp_path / "absent" / "mlflow.db"
    with pytest.raises(TrackingError) as e:
        compare_main(_args("--experiment", EXPERIMENT, "--out", out, "--tracking-uri", f"sqlite:///{missing}"))
    assert e.value.category == "not_found" and not missing.exists()  # no empty store created by mistake
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("RAYEMB_WORKSPACE", str(tmp_path / "empty_workspace"))
    with pytest.raises(RayembError) as e:
        compare_main(_args("--experiment", EXPERIMENT, "--out", out))
    assert e.value.category == "no_store"


@pytest.mark.timeout(60)
def test_compare_accepts_a_db_path_and_env_uri(store, tmp_path, monkeypatch):
    uri, run_ids = store
    db_path = uri[len("sqlite:///"):]
    assert compare_main(_args("--experiment", EXPERIMENT, "--out", str(tmp_path / "a"), "--tracking-uri", db_path)) == 0
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert compare_main(_args("--experiment", EXPERIMENT, "--out", str(tmp_path / "b"))) == 0
    assert (tmp_path / "b" / "compare.csv").read_text().count("\n") == 3  # header + 2 runs
    # neither given: the embedded store of the default output folder runs/ of the workspace
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    workspace = tmp_path / "workspace"
    (workspace / "runs").mkdir(parents=True)
    (workspace / "runs" / "mlflow.db").symlink_to(db_path)
    monkeypatch.setenv("RAYEMB_WORKSPACE", str(workspace))
    assert compare_main(_args("--experiment", EXPERIMENT, "--out", str(tmp_path / "c"))) == 0
    assert (tmp_path / "c" / "compare.csv").read_text().count("\n") == 3


def test_plots_are_valid_pngs(tmp_path):
    hist = {"train/loss": [(s, 0.7 - s / 100) for s in range(30)], "valid/auc": [(s, 0.5 + s / 100) for s in range(30)]}
    p = plots.plot_training_curves(hist, str(tmp_path / "sub" / "curves.png"))
    assert p == str(tmp_path / "sub" / "curves.png")
    _assert_png(p)
    _assert_png(plots.plot_memory_per_rank([3 * 2**30, 2.5 * 2**30, 1 * 2**30], str(tmp_path / "mem.png"),
                                           capacity_bytes=4 * 2**30))
    _assert_png(plots.plot_final_vs_param([("rowwise", 0.71, "a"), ("table", 0.69, "b")], str(tmp_path / "cat.png"),
                                          param="sharding", metric="auc"))
