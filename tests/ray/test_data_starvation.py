"""Workers that leave Ray Data no CPU: a warning at submit, then a clear error within the timeout, no retries."""

import time

import pytest
from mlflow.tracking import MlflowClient

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.timing]


def test_starved_workers_fail_fast_with_the_cause(ray_2_cpus, tiny_data, tmp_path, capsys, monkeypatch):
    from rayemb.errors import DataError
    from rayemb.train.driver import outputs
    from rayemb.train.driver.trainer import run_training

    monkeypatch.setattr(outputs, "SMALL_SPLIT_MAX_ROWS", 0)  # Ray Data's read tasks, as for a large dataset
    # ... streamed (an in-memory shard is read by its rank, with no Ray Data task to starve)

    # 2 workers x 1 CPU on a 2-CPU cluster: nothing left for Ray Data's read tasks. max_failures=2 would
    # restart the group twice on the same starvation; a user error must end the run at once instead.
    cfg = load_config("jobs/configs/synth_small.yaml", [
        f"data.path={tiny_data}", f"tracking.output_dir={tmp_path}", "data.batch_size=256", "train.epochs=1",
        "scaling.cpus_per_worker=1.0", "scaling.max_failures=2", "data.first_batch_timeout_s=5",
        "planner.calibrate=false", "data.in_memory=false",
    ])
    t0 = time.monotonic()
    with pytest.raises(DataError) as e:
        run_training(cfg)
    took = time.monotonic() - t0
    assert e.value.category == "data_starved"
    assert "0 of 2 CPUs free" in e.value.message and "scaling.cpus_per_worker (now 1)" in e.value.message
    assert took < 120, f"the starved job took {took:.0f}s to fail"
    out = capsys.readouterr().out
    assert "WARNING: after placing 2 workers x 1 CPU" in out  # said before any worker started
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name(cfg.tracking.experiment).experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert "received no batch" in runs[0].data.tags.get("rayemb.failure_reason", "")
