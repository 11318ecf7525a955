"""A real job on a schema with a table of its own dim and a table two features read.

schema.yaml gives C1 ``embedding_dim: 32`` (the model's is 16) and C3 ``table: C2``. A DCN-v2 job on the shared
local Ray (2 gloo workers, calibrated and probed on its own model) plans one table for C2 and C3 from the
statistics pass's union of their ids, trains, and checkpoints every table once with its own dim. The same
data with the DLRM stops before any work, naming the features whose widths its dot interaction cannot take.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def table_dims_data(tmp_path_factory) -> str:
    from rayemb.data.synthetic import SyntheticSpec, generate

    out = str(tmp_path_factory.mktemp("table_dims_data"))
    generate(SyntheticSpec(rows=12_000, num_tables=6, seed=7, num_signal_tables=4,
                           cardinalities=[200, 150, 150, 100, 80, 60]), out)
    path = Path(out) / "schema.yaml"
    doc = yaml.safe_load(path.read_text())
    for entry in doc["sparse"]:
        if entry["name"] == "C1":
            entry["embedding_dim"] = 32
        if entry["name"] == "C3":
            entry["table"] = "C2"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def _config(data: str, out: Path, *more: str):
    return load_config("jobs/configs/synth_small.yaml", [
        f"data.path={data}", f"tracking.output_dir={out}", "data.batch_size=128", "train.epochs=1",
        "train.log_every_n_steps=10", "tracking.experiment=table-dims", *more])


def test_a_dcn_v2_job_trains_each_table_with_its_dim_and_the_shared_one_once(shared_ray, table_dims_data,
                                                                                tmp_path):
    from rayemb.train.driver.trainer import run_training

    shared_ray.ensure()
    result = run_training(_config(table_dims_data, tmp_path, "model.name=dcn_v2",
                                  "model.args={cross_layers: 2, bottom_mlp: [32, 16], deep_mlp: [32, 16]}",
                                  "planner.tables={C2: {sharding: hybrid}}"))
    assert result.status == "FINISHED"
    assert sorted(result.plan["tables"]) == ["C1", "C2", "C4", "C5", "C6"]  # C3 reads C2's table
    assert result.plan["tables"]["C2"]["placement"] == "hybrid" and result.plan["tables"]["C2"]["hot_rows"] > 0
    assert result.metrics["valid_auc"] > 0.6, result.metrics
    meta = json.loads((Path(result.last_checkpoint) / "meta.json").read_text())
    dims = {t: (e["num_embeddings"], e["dim"]) for t, e in meta["tables"].items()}
    assert dims == {"C1": (200, 32), "C2": (150, 16), "C4": (100, 16), "C5": (80, 16), "C6": (60, 16)}


def test_a_dlrm_job_on_unequal_dims_stops_before_any_work_naming_the_features(table_dims_data, tmp_path):
    from rayemb.errors import ConfigError
    from rayemb.train.driver.trainer import check_inputs

    with pytest.raises(ConfigError) as e:
        check_inputs(_config(table_dims_data, tmp_path))
    assert e.value.category == "bad_model_factory"
    assert "'C1': 32" in str(e.value) and "dcn_v2" in str(e.value) and "'C2'" not in str(e.value)
    assert not (tmp_path / "mlflow.db").exists()
