"""A real training job with compressed tables: QR (table-wise and data-parallel) and block.

The planner's pins (``planner.tables.<T>: {compression: ...}``) reach the
workers as ``TablePlan.storage``; the job's embedding module builds the
physical tables (``C1__q``/``C1__r``, ``C2__block`` + projection, and the
data-parallel QR-mult rows of C3 as replicated dense rows), TorchRec shards
them by the plan, the job trains and learns, and plan.json records the
storage of each table.
"""

import json
import os

import pytest

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PINS = ("{C1: {compression: qr}, C2: {compression: block, block_dim: 4}, "
        "C3: {compression: qr, combine: mult, sharding: data_parallel}}")


def test_job_trains_with_qr_and_block_tables(ray_2_cpus, tiny_data, tmp_path):
    from rayemb.train.trainer import run_training

    cfg = load_config("jobs/configs/synth_small.yaml", [
        f"data.path={tiny_data}", f"tracking.output_dir={tmp_path}", "data.batch_size=256", "train.epochs=1",
        f"planner.tables={PINS}", "model.embedding_dim=16",
        "planner.calibrate=false",  # pinned tables: nothing for the calibrated model to choose
    ])
    result = run_training(cfg)
    assert result.status == "FINISHED"
    tables = result.plan["tables"]
    assert tables["C1"]["storage"]["compression"] == "qr" and tables["C1"]["storage"]["buckets"] >= 1
    assert tables["C2"]["storage"]["compression"] == "block" and tables["C2"]["storage"]["block_dim"] == 4
    assert tables["C3"]["storage"]["compression"] == "qr" and tables["C3"]["placement"] == "data_parallel"
    assert "storage" not in tables["C4"]
    # plan.json, the file the export reads, says the same
    found = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f == "plan.json"]
    assert found, "no plan.json written"
    with open(found[0]) as fh:
        saved = json.load(fh)["tables"]
    assert saved["C1"]["storage"]["compression"] == "qr" and saved["C2"]["storage"]["block_dim"] == 4
    assert result.metrics["valid_auc"] > 0.65, result.metrics
    # the model really held the physical tables: the checkpoint has them, and says how they were stored
    with open(os.path.join(result.best_checkpoint, "meta.json")) as fh:
        meta = json.load(fh)
    assert {"C1__q", "C1__r", "C2__block", "C3__q", "C3__r", "C4"} <= set(meta["tables"]), sorted(meta["tables"])
    assert "C1" not in meta["tables"] and meta["tables"]["C2__block"]["dim"] == 4
    assert meta["compression"]["C1"]["compression"] == "qr" and meta["compression"]["C2"]["block_dim"] == 4
