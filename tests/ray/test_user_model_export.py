"""A model of one's own from a finished job to a registered model, scored where its code is not installed.

The DeepFM job of ``user_model_jobs`` (``model.factory: examples.deepfm:deepfm``, 2 gloo ranks, a hybrid table)
is exported by run id and registered. A fresh Python process, in an empty directory and without PYTHONPATH, so
that ``examples`` cannot be imported there, loads the registered pyfunc model and scores every validation row:
the factory's module comes with the model. Its scores equal the unsharded DeepFM that the factory builds with
the checkpoint's tables and dense weights (to 1e-5), and their AUC is the ``valid_auc`` the job logged for that
checkpoint, computed by the sharded model (to 1e-4). ``rayemb predict`` scores the same rows from the export.
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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REGISTERED = "rayemb-deepfm"
#: the pyfunc model scored in a new process: prints whether ``examples`` is importable there, where the factory's
#: module was loaded from, and the predictions
FRESH = """
import importlib.util, json, sys
import mlflow, pyarrow.parquet as pq
importable = importlib.util.find_spec("examples") is not None
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
df = pq.read_table(sys.argv[3:]).to_pandas()
out = model.predict(df)
print("RESULT=" + json.dumps({"importable_before": importable, "module": sys.modules["examples.deepfm"].__file__,
                              "prediction": out["prediction"].tolist()}))
"""


def _fresh_process(uri: str, model_uri: str, files: list, cwd: Path) -> dict:
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    p = subprocess.run([sys.executable, "-c", FRESH, uri, model_uri, *files], capture_output=True, text=True,
                       timeout=600, env=env, cwd=str(cwd))
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT=")][-1]
    return json.loads(line[len("RESULT="):])


def _unsharded_logits(checkpoint: str, schema, args: dict, rows) -> np.ndarray:
    """DeepFM as its factory builds it over a plain EBC, the checkpoint's logical tables and dense weights
    copied in by name, on ``rows`` converted as training converts them."""
    import torch
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from examples.deepfm import deepfm
    from rayemb.checkpoint.export import unsharded_state
    from rayemb.data.batching import BatchConverter
    from rayemb.contract.model import Embeddings
    from rayemb.contract.tables import table_configs

    state = unsharded_state(checkpoint)
    dim = int(state["tables"][schema.sparse_names[0]]["weight"].shape[1])
    ebc = EmbeddingBagCollection(table_configs(schema, dim))
    model = deepfm(Embeddings(pooled=ebc, features=tuple(schema.sparse_names), dim=dim), schema, **args)
    dense = {}
    for key, value in state["dense"].items():
        while key.startswith(("_dmp_wrapped_module.", "module.")):  # DistributedModelParallel / DDP wrappers
            key = key.split(".", 1)[1]
        dense[key] = value
    with torch.no_grad():
        for name, table in ebc.embedding_bags.items():
            table.weight.copy_(state["tables"][name]["weight"])
        for key, value in model.state_dict().items():
            if not key.startswith("embedding."):
                value.copy_(dense[key])
        b = BatchConverter(schema, "error")(rows)
        return model.eval()(b.dense, b.sparse).numpy()


def test_a_model_of_ones_own_exports_registers_and_scores_without_its_repository(
        ray_2_cpus, user_model_jobs, tiny_data, tmp_path, monkeypatch):
    from mlflow import MlflowClient
    from sklearn.metrics import roc_auc_score

    from rayemb.data.schema import DatasetSchema, parquet_files
    from rayemb.serve.model import sigmoid

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading the export puts its code/ on the path
    first, _ = user_model_jobs
    assert first.status == "FINISHED"
    uri = first.tracking_uri
    client = MlflowClient(uri)

    out = tmp_path / "model"
    assert main(["export", "--run-id", first.run_id, "--tracking-uri", uri, "--out", str(out),
                 "--register", REGISTERED]) == 0
    info = json.loads((out / "model.json").read_text())
    best_meta = json.loads((Path(first.best_checkpoint) / "meta.json").read_text())
    assert info["source"]["checkpoint"] == first.best_checkpoint and info["step"] == best_meta["step"]
    assert info["model"]["factory"] == "examples.deepfm:deepfm" and info["model"]["args"] == {"hidden": [32, 16]}
    assert info["code"]["files"] == ["examples/deepfm.py"] and (out / "code" / "examples" / "deepfm.py").is_file()
    assert info["torchscript"] is None and info["torchscript_skipped"]
    expected_auc = {m.step: m.value for m in client.get_metric_history(first.run_id, "valid_auc")}[best_meta["step"]]
    assert float(client.get_model_version(REGISTERED, "1").tags["valid_auc"]) == pytest.approx(expected_auc, abs=1e-12)

    # a fresh process where examples/ is not importable: the registered model brings the factory's module
    files = [str(f) for f in parquet_files(tiny_data, "valid")]
    fresh = _fresh_process(uri, f"models:/{REGISTERED}/1", files, tmp_path / "elsewhere")
    assert fresh["importable_before"] is False
    assert not fresh["module"].startswith(str(Path(__file__).resolve().parents[2]) + os.sep), fresh["module"]
    assert fresh["module"].endswith(os.path.join("code", "examples", "deepfm.py"))
    scores = np.asarray(fresh["prediction"])

    valid = pq.read_table(files)
    schema = DatasetSchema.load(tiny_data)
    reference = sigmoid(_unsharded_logits(first.best_checkpoint, schema, {"hidden": [32, 16]}, valid))
    assert scores.shape == (valid.num_rows,) == (4000,)
    np.testing.assert_allclose(scores, reference, rtol=0, atol=1e-5)
    labels = valid.column(schema.label).to_numpy()
    assert roc_auc_score(labels, scores) == pytest.approx(expected_auc, abs=1e-4) and expected_auc > 0.7

    # batch predictions from the export directory
    preds = tmp_path / "preds"
    assert main(["predict", "--model", str(out), "--data", os.path.join(tiny_data, "valid"), "--out",
                 str(preds)]) == 0
    table = pa.concat_tables([pq.read_table(f) for f in sorted(preds.glob("*.parquet"))])
    assert table.column_names == ["prediction", "label"] and table.num_rows == valid.num_rows
    np.testing.assert_allclose(table.column("prediction").to_numpy(), scores, rtol=0, atol=1e-6)
