"""From a finished job to a registered model and batch predictions, and the errors on the way.

The slow test takes the tiny job the end-to-end tests trained on a local
2-CPU Ray (``e2e_job``), exports its best checkpoint by run id, registers
it, scores the validation split with ``rayemb predict`` (Ray Data) from the
registry URI, and checks that the AUC of
the prediction files is the ``valid_auc`` the run logged for that checkpoint;
that the logged model has a signature and an input example; and that
``mlflow.pyfunc.load_model(...).predict(df)`` in a fresh process gives the
prediction files' numbers. The other tests feed bad input and check the error
and that nothing was written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayemb.cli import main

REPO = Path(__file__).resolve().parents[2]
REGISTERED = "rayemb-tiny"


def _fresh_process_predict(uri: str, model_uri: str, parquet: str, rows: int) -> list:
    """``mlflow.pyfunc.load_model(model_uri).predict(df)`` in a new Python process (nothing cached)."""
    code = (
        "import json, sys, mlflow, pyarrow.parquet as pq\n"
        "mlflow.set_tracking_uri(sys.argv[1])\n"
        "df = pq.read_table(sys.argv[3]).slice(0, int(sys.argv[4])).to_pandas()\n"
        "out = mlflow.pyfunc.load_model(sys.argv[2]).predict(df)\n"
        "print('PRED=' + json.dumps(out['prediction'].tolist()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    p = subprocess.run([sys.executable, "-c", code, uri, model_uri, parquet, str(rows)], capture_output=True,
                       text=True, timeout=300, env=env, cwd=os.path.dirname(parquet))
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("PRED=")][-1]
    return json.loads(line[len("PRED="):])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_trained_job_to_registered_model_and_batch_predictions(ray_2_cpus, e2e_job, tiny_data, tmp_path, monkeypatch, capsys):
    import mlflow
    from mlflow import MlflowClient
    from sklearn.metrics import roc_auc_score

    monkeypatch.chdir(tmp_path)
    _, result, _ = e2e_job  # 2 epochs; its evaluation scores all 4,000 validation rows
    assert result.status == "FINISHED"
    uri = result.tracking_uri
    client = MlflowClient(uri)
    valid_rows = [m.value for m in client.get_metric_history(result.run_id, "valid_rows")]
    assert valid_rows == [4000.0, 4000.0], valid_rows

    # export the best checkpoint by run id, and register it
    out = tmp_path / "model"
    assert main(["export", "--run-id", result.run_id, "--tracking-uri", uri, "--out", str(out),
                 "--register", REGISTERED]) == 0
    info = json.loads((out / "model.json").read_text())
    best_meta = json.loads((Path(result.best_checkpoint) / "meta.json").read_text())
    assert info["source"]["checkpoint"] == result.best_checkpoint and info["step"] == best_meta["step"]
    # the valid_auc that belongs to the exported checkpoint: the one logged at its step
    auc_at_step = {m.step: m.value for m in client.get_metric_history(result.run_id, "valid_auc")}
    expected_auc = auc_at_step[best_meta["step"]]
    assert info["metrics"]["valid_auc"] == pytest.approx(expected_auc, abs=1e-12)
    assert expected_auc == pytest.approx(result.metrics["best_valid_auc"], abs=1e-12) and expected_auc > 0.7

    # the registry has a version, tagged with the AUCs; the logged model has a signature and an input example
    version = client.get_model_version(REGISTERED, "1")
    assert float(version.tags["valid_auc"]) == pytest.approx(expected_auc, abs=1e-12)
    assert float(version.tags["best_valid_auc"]) == pytest.approx(result.metrics["best_valid_auc"], abs=1e-12)
    mlflow.set_tracking_uri(uri)
    try:
        model_info = mlflow.models.get_model_info(f"models:/{REGISTERED}/1")
        local = mlflow.artifacts.download_artifacts(f"runs:/{result.run_id}/model", dst_path=str(tmp_path / "dl"))
    finally:
        mlflow.set_tracking_uri("")
    assert model_info.signature is not None
    assert [c.name for c in model_info.signature.outputs.inputs] == ["prediction"]
    assert {c.name for c in model_info.signature.inputs.inputs} == {f"I{i}" for i in range(1, 14)} | {
        f"C{i}" for i in range(1, 9)}
    assert model_info.saved_input_example_info is not None
    example = json.loads((Path(local) / model_info.saved_input_example_info["artifact_path"]).read_text())
    assert len(example["data"]) == 5

    # batch predictions of the validation split from the registry URI
    preds = tmp_path / "preds"
    assert main(["predict", "--model", f"models:/{REGISTERED}/1", "--tracking-uri", uri, "--data",
                 os.path.join(tiny_data, "valid"), "--out", str(preds), "--keep-columns", "C1"]) == 0
    files = sorted(preds.glob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f) for f in files])
    assert table.num_rows == 4000 and table.column_names == ["prediction", "label", "C1"]
    y, p = table.column("label").to_numpy(), table.column("prediction").to_numpy()
    assert roc_auc_score(y, p) == pytest.approx(expected_auc, abs=1e-4)

    # rows come out in input order: the kept column matches the input; a fresh process scores them alike
    valid_file = sorted(Path(tiny_data, "valid").glob("*.parquet"))[0]
    first = pq.read_table(valid_file).slice(0, 5)
    assert table.column("C1").to_pylist()[:5] == first.column("C1").to_pylist()
    fresh = _fresh_process_predict(uri, f"models:/{REGISTERED}/1", str(valid_file), 5)
    # float32 scores of a 5-row batch vs a 4,000-row one: equal up to BLAS summation order
    np.testing.assert_allclose(fresh, p[:5], rtol=0, atol=1e-6)

    # an error a scoring actor finds (an id outside its table under id_policy: error) comes back as itself
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = pq.read_table(valid_file).slice(0, 10)
    ids = bad.column("C2").to_pylist()
    ids[3] = 10**9
    pq.write_table(bad.set_column(bad.column_names.index("C2"), "C2", pa.array(ids, pa.int64())),
                   bad_dir / "part.parquet")
    capsys.readouterr()
    assert main(["predict", "--model", str(out), "--data", str(bad_dir), "--out", str(tmp_path / "bad_preds")]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # Ray Data logs the actor's traceback above; rayemb's paragraph ends it
    assert last.startswith("rayemb: error: Sparse column 'C2'") and "id_policy" in last
    assert not (tmp_path / "bad_preds").exists() and not list(tmp_path.glob("bad_preds.partial*"))


# ---- BAD INPUT: a clear error, exit code 2, nothing under --out ---- #


def _store(tmp_path) -> str:
    from rayemb.tracking.store import ensure_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ensure_store(uri)
    return uri


def test_unknown_run_id_is_a_clear_error(tmp_path, capsys):
    uri = _store(tmp_path)
    out = tmp_path / "model"
    assert main(["export", "--run-id", "0123456789abcdef", "--tracking-uri", uri, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "0123456789abcdef" in err and "does not exist" in err and "--tracking-uri" in err
    assert not out.exists() and not list(tmp_path.glob("model.partial*"))


def test_run_without_checkpoint_tags_is_a_clear_error(tmp_path, capsys):
    from mlflow import MlflowClient

    uri = _store(tmp_path)
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("x", artifact_location=(tmp_path / "art").as_uri()))
    client.set_terminated(run.info.run_id, "FAILED")
    out = tmp_path / "model"
    assert main(["export", "--run-id", run.info.run_id, "--tracking-uri", uri, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "rayemb.best_checkpoint" in err and "--checkpoint PATH --config" in err
    assert not out.exists()

    from rayemb.errors import TrackingError
    from rayemb.serve.export import source_from_run

    with pytest.raises(TrackingError) as e:
        source_from_run(run.info.run_id, uri, "last")
    assert e.value.category == "no_checkpoint"


def _random_model(directory: Path):
    """An exported-format model of a small schema with untrained weights (no training needed to test inputs)."""
    import torch

    from rayemb.data.schema import DatasetSchema, SparseFeature
    from rayemb.serve.model import InferenceModel, build_dlrm

    schema = DatasetSchema(label="label", dense=("I1", "I2", "I3"),
                           sparse=(SparseFeature("C1", 10), SparseFeature("C2", 7, multi_hot=True)))
    mcfg = {"embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1]}
    torch.manual_seed(0)
    model = InferenceModel.from_state(build_dlrm(schema, mcfg).state_dict(), schema, mcfg)
    model.save(str(directory), torchscript=False)
    return model


def test_missing_columns_are_a_clear_error_before_work(tmp_path, capsys):
    model = _random_model(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    good = {"label": [0, 1, 1], "I1": [1.0, 2.0, None], "I2": [0.0, 5.0, 3.0], "I3": [1.0, 1.0, 1.0],
            "C1": [1, 9, None], "C2": [[1, 2], [], [6]]}
    pq.write_table(pa.table(good), data / "a.parquet")
    pq.write_table(pa.table({k: v for k, v in good.items() if k not in ("I3", "C2")}), data / "b.parquet")
    out = tmp_path / "preds"
    assert main(["predict", "--model", str(tmp_path / "model"), "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "b.parquet" in err and "'I3'" in err and "'C2'" in err and "schema.yaml" in err
    assert not out.exists() and not list(tmp_path.glob("preds.partial*"))
    # the same in the library: pandas input without a feature column
    from rayemb.errors import DataError

    with pytest.raises(DataError) as e:
        model.predict(pa.table(good).drop_columns(["C1"]).to_pandas())
    assert e.value.category == "missing_columns" and "'C1'" in str(e.value)
    # scoring needs no label; nulls and empty bags are read as in training
    p = model.predict(pa.table(good).drop_columns(["label"]))
    assert p.shape == (3,) and np.all((p > 0) & (p < 1))


def test_out_of_range_id_fails_under_the_error_policy(tmp_path):
    from rayemb.errors import DataError

    model = _random_model(tmp_path / "model")
    bad = pa.table({"I1": [1.0], "I2": [1.0], "I3": [1.0], "C1": [10], "C2": [[1]]})
    with pytest.raises(DataError) as e:
        model.predict(bad)
    assert "'C1'" in str(e.value) and "id_policy" in str(e.value)


def test_export_refuses_a_non_empty_out(tmp_path, capsys):
    out = tmp_path / "model"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", "--checkpoint", str(tmp_path / "ckpt"), "--config", "x.yaml", "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err and os.listdir(out) == ["keep.txt"]
