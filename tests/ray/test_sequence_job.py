"""The training job with a sequence feature, through ``jobs/bench/sequence_auc.py`` at a tiny size.

Whether the user-history tower helps is the benchmark's question, answered at full size
(docs/sequence.md); here it runs one tiny attention job on a real local Ray with 2 gloo
workers, so that the benchmark keeps working, the sequence collection is in the job's
TorchRec plan (plan.json) and its table in the checkpoint.
"""

import json
from pathlib import Path

import pytest
import yaml
from _bench import load_bench
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_sequence_auc_benchmark_trains_the_history_tower(ray_2_cpus, tmp_path):
    data, out = tmp_path / "hist", tmp_path / "sequence_auc.json"
    rc = load_bench("sequence_auc").main([
        "--data", str(data), "--rows", "20000", "--sequence-length", "8", "--towers", "attention", "--seeds", "0",
        "--set", f"tracking.output_dir={tmp_path / 'runs'}", "--set", "data.batch_size=128",
        "--set", "train.epochs=1", "--set", "train.max_steps_per_epoch=12", "--set", "planner.calibrate=false",
        "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] and doc["towers"] == ["attention"] and doc["paired"] == {"attention": {
        "seeds": [], "best_valid_auc_diff": [], "mean": None, "min": None, "max": None}}
    (run,) = doc["results"]
    assert run["tower"] == "attention" and run["seed"] == 0 and 0.5 < run["best_valid_auc"] <= 1.0
    # the sequence collection is in the plan (TorchRec types only), and its table in the checkpoint
    (placement,) = run["sequence_plan"].items()
    assert placement[0] == "H1" and placement[1].split()[0] in ("table_wise", "row_wise", "column_wise")
    runs = tmp_path / "runs"
    (plan_file,) = runs.glob("jobs/*/plan.json")
    plan = json.loads(plan_file.read_text())
    assert plan["sequence"]["tower"] == "attention" and list(plan["sequence"]["tables"]) == ["H1"]
    assert len(plan["sequence"]["tables"]["H1"]["shard_widths"]) == 1
    best = MlflowClient(f"sqlite:///{runs}/mlflow.db").get_run(run["run_id"]).data.tags["rayemb.best_checkpoint"]
    h1 = next(t for t in yaml.safe_load((data / "schema.yaml").read_text())["sparse"] if t["name"] == "H1")
    assert h1["sequence"] is True
    assert json.loads((Path(best) / "meta.json").read_text())["tables"]["H1"] == {
        "num_embeddings": h1["num_embeddings"], "dim": 16, "dtype": "fp32"}
