"""A training job on raw ids, end to end: ``run_training`` on the shared local Ray, then export and predict.

The dataset (tests/_raw_data.py) has raw int64 ids (random 64-bit values with Zipf frequencies) and raw string
ids, in tables smaller than their vocabularies, beside encoded tables; the plan places them hybrid (their heavy
hitters in fixed replicated rows, the rest of their capacity managed). One job of 2 gloo workers, streaming
its data, trains it to a validation AUC clearly above chance, logs the evictions of each raw table to MLflow
at its log points, and checkpoints the tables' ids and rows; a worker failing mid-epoch makes the group
restart and resume from the last step checkpoint. ``rayemb export`` makes the inference model of its best checkpoint;
``rayemb predict`` scores the validation split's raw ids (int64 and strings) with the AUC the job logged for
that checkpoint, and ids never seen in training score as missing ones (the zero row), inserted nowhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayemb.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


def test_a_raw_id_job_trains_logs_evictions_exports_and_predicts(ray_2_cpus, tmp_path, monkeypatch):
    from mlflow import MlflowClient
    from sklearn.metrics import roc_auc_score

    from rayemb.config import load_config
    from rayemb.constants import FAULT_INJECTION_ENV_VAR
    from rayemb.serve.model import InferenceModel
    from rayemb.train.driver.trainer import run_training
    from tests._raw_data import raw_id_dataset

    monkeypatch.chdir(tmp_path)  # nothing MLflow writes may land in the repository
    # 300 int64 ids in 128 rows and 40 strings in 32, over 2 ranks that each keep one row for unseen ids
    data = raw_id_dataset(str(tmp_path / "data"), rows=16_000, u1_capacity=128, s1_capacity=32)
    runs = tmp_path / "runs"
    # streamed (data.in_memory=false), a checkpoint every 20 steps, and a worker failing once at step 30 of the
    # 50 of epoch 1: the group restarts and resumes mid-epoch from step 20's checkpoint, raw-id tables included
    marker = tmp_path / "fault-injected"
    monkeypatch.setenv(FAULT_INJECTION_ENV_VAR, f"30:{marker}")
    cfg = load_config(str(REPO / "jobs" / "configs" / "synth_small.yaml"), [
        f"data.path={data}", f"tracking.output_dir={runs}", "data.batch_size=128", "train.epochs=2",
        "train.early_stopping_patience=null", "train.log_every_n_steps=10", "planner.calibrate=false",
        "model.embedding_dim=8", "model.bottom_mlp=[16,8]", "model.top_mlp=[16,1]", "train.embedding_lr=0.1",
        "tracking.experiment=raw-ids", "data.in_memory=false", "train.checkpoint_every_n_steps=20",
        "scaling.max_failures=1"])
    result = run_training(cfg)
    assert result.status == "FINISHED" and marker.exists()
    assert result.metrics["best_valid_auc"] > 0.65, result.metrics
    ends = [r for r in result.reports if r.get("epoch_end")]
    assert [(r["epoch"], r["step"], r["resumed_at_step"]) for r in ends] == [(0, 50, 20), (1, 100, 20)]
    steps = [r["step"] for r in result.reports if "train_loss" in r]
    assert [steps.count(s) for s in (10, 20, 30, 40, 100)] == [1, 1, 1, 1, 1]  # resumed after step 20, once

    client = MlflowClient(result.tracking_uri)
    for table in ("U1", "S1"):
        evictions = client.get_metric_history(result.run_id, f"evictions.{table}")
        assert len(evictions) >= 4 and evictions[-1].value > 0, (table, evictions)
        # counted since the worker group started: growing over the restarted group's log points
        after = [e.value for e in sorted(evictions, key=lambda e: e.step) if e.step > 20]
        assert after == sorted(after), (table, evictions)
    (plan_file,) = runs.glob("jobs/*/plan.json")
    plan = json.loads(plan_file.read_text())
    assert plan["raw_tables"] == ["U1", "S1"]
    # hybrid, as the split gives both hot ids: those in replicated rows, the rest of the capacity managed
    hot = {t: plan["tables"][t]["hot_rows"] for t in ("U1", "S1")}
    assert {plan["tables"][t]["placement"] for t in ("U1", "S1")} == {"hybrid"} and 0 < hot["U1"] <= 128 - 4
    meta = json.loads((Path(result.best_checkpoint) / "meta.json").read_text())
    assert meta["tables"]["U1"]["ids"] == "raw" and hot["U1"] < meta["tables"]["U1"]["held"] <= 128 - 2
    assert sorted(n for n in meta["files"] if n.startswith("raw_ids.")) == ["raw_ids.00000.npz", "raw_ids.00001.npz"]

    out = tmp_path / "model"
    assert main(["export", "--run-id", result.run_id, "--tracking-uri", result.tracking_uri, "--out", str(out)]) == 0
    info = json.loads((out / "model.json").read_text())
    auc_at_step = {m.step: m.value for m in client.get_metric_history(result.run_id, "valid_auc")}
    expected = auc_at_step[info["step"]]
    preds = tmp_path / "preds"
    assert main(["predict", "--model", str(out), "--data", os.path.join(data, "valid"), "--out", str(preds),
                 "--keep-columns", "U1,S1"]) == 0
    scored = pa.concat_tables([pq.read_table(f) for f in sorted(preds.glob("*.parquet"))])
    valid = pq.read_table(os.path.join(data, "valid"))
    assert scored.num_rows == valid.num_rows and scored.column("S1").equals(valid.column("S1"))
    assert roc_auc_score(scored.column("label").to_numpy(), scored.column("prediction").to_numpy()) == \
        pytest.approx(expected, abs=1e-4)

    # ids no training row had read the zero row: a row scores as if those features were missing
    model = InferenceModel.load(str(out))
    rows = valid.slice(0, 8)
    fresh = rows.set_column(rows.column_names.index("U1"), "U1", pa.array(np.arange(8, dtype=np.int64) + 7))
    fresh = fresh.set_column(fresh.column_names.index("S1"), "S1", pa.array([f"new_{i}" for i in range(8)]))
    missing = rows.set_column(rows.column_names.index("U1"), "U1", pa.nulls(8, pa.int64()))
    missing = missing.set_column(missing.column_names.index("S1"), "S1", pa.nulls(8, pa.string()))
    held = {t: len(v) for t, v in model.raw_rows.ids.items()}
    np.testing.assert_array_equal(model.predict(fresh), model.predict(missing))
    assert {t: len(v) for t, v in model.raw_rows.ids.items()} == held
