"""One real training job whose tables are pinned to every placement rayemb supports on CPU/gloo.

Eight tables, eight pins: data-parallel, table-wise, row-wise, column-wise,
table-row-wise, table-column-wise, hybrid, and one left to the cost model.
The job must plan exactly those placements, train, and learn.
"""

import pytest
from mlflow.tracking import MlflowClient

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PINS = {
    "C1": "hybrid",
    "C2": "table_wise",
    "C3": "row_wise",
    "C4": "column_wise",
    "C5": "table_row_wise",
    "C6": "table_column_wise",
    "C7": "data_parallel",
}


def test_job_trains_every_sharding_type(ray_2_cpus, tiny_data, tmp_path):
    from rayemb.train.trainer import run_training

    pins = "{" + ", ".join(f"{t}: {{sharding: {p}}}" for t, p in PINS.items()) + "}"
    cfg = load_config("jobs/configs/synth_small.yaml", [
        f"data.path={tiny_data}", f"tracking.output_dir={tmp_path}", "data.batch_size=256", "train.epochs=1",
        f"planner.tables={pins}", "model.embedding_dim=16",
    ])
    result = run_training(cfg)
    assert result.status == "FINISHED"
    tables = result.plan["tables"]
    for name, placement in PINS.items():
        assert tables[name]["placement"] == placement, (name, tables[name])
    assert tables["C1"]["hot_rows"] > 0 and tables["C1"]["hot_rows"] % 2 == 0
    assert result.metrics["valid_auc"] > 0.65, result.metrics
    # the model's collectives were counted: pooled all-to-alls and all-reduces both moved bytes
    run = MlflowClient(result.tracking_uri).get_run(result.run_id)
    assert run.data.metrics["bytes_per_step.all_to_all"] > 0
    assert run.data.metrics["bytes_per_step.all_reduce"] > 0


def test_bad_pin_is_a_plan_error_before_work_starts(ray_2_cpus, tiny_data, tmp_path):
    from rayemb.errors import PlanError
    from rayemb.train.trainer import run_training

    cfg = load_config("jobs/configs/synth_small.yaml", [
        f"data.path={tiny_data}", f"tracking.output_dir={tmp_path}", "planner.tables={C99: {sharding: row_wise}}",
    ])
    with pytest.raises(PlanError) as e:
        run_training(cfg)
    assert e.value.category == "invalid_pin" and "C99" in str(e.value)
