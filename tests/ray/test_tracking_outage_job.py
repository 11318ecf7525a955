"""A whole training job survives its tracking server dying mid-run (tracking never hurts training).

The server is killed once the job has logged its first points and restarted a
few seconds later on the same port and store. The job must end FINISHED, every
metric point must be on the server at the end, and steps reported while the
server was away must not be slower than the others (the job's own per-step
timings, partitioned by when each point was logged).
"""

import statistics
import threading
import time

import pytest
from _servers import MlflowServer, free_port
from mlflow import MlflowClient

from rayemb.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.timing]


def _wait_for_points(client: MlflowClient, experiment: str, timeout_s: float = 300.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exp = client.get_experiment_by_name(experiment)
        if exp is not None:
            runs = client.search_runs([exp.experiment_id])
            if runs and len(client.get_metric_history(runs[0].info.run_id, "train_loss")) >= 3:
                return runs[0].info.run_id
        time.sleep(0.5)
    raise AssertionError("the job logged no training points within the time limit")


def test_job_finishes_and_loses_nothing_when_the_server_dies(ray_2_cpus, tiny_data, tmp_path):
    from rayemb.train.driver.trainer import run_training

    root = tmp_path / "server"
    root.mkdir()
    server = MlflowServer(root, free_port())
    server.start()
    try:
        server.wait_healthy()
        cfg = load_config("jobs/configs/synth_small.yaml", [
            f"data.path={tiny_data}", f"tracking.output_dir={tmp_path / 'out'}", f"tracking.tracking_uri={server.uri}",
            "tracking.experiment=outage", "data.batch_size=128", "train.epochs=3", "train.log_every_n_steps=2",
            "train.early_stopping_patience=null",  # every epoch runs: the test counts 3 valid_auc points
            "planner.calibrate=false",  # the outage is under test, not the plan
        ])
        box = {}
        job = threading.Thread(target=lambda: box.update(result=run_training(cfg)), daemon=True)
        job.start()
        client = MlflowClient(server.uri)
        run_id = _wait_for_points(client, "outage")

        t_down = time.time()
        server.kill()
        time.sleep(8)
        server.start()
        server.wait_healthy()
        t_up = time.time()
        job.join(timeout=600)
        assert not job.is_alive(), "the job did not end"

        result = box["result"]
        assert result.status == "FINISHED" and result.run_id == run_id
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"

        # every reported point reached the server, with its step
        reported = [r for r in result.reports if "train_loss" in r]
        history = client.get_metric_history(run_id, "train_loss")
        assert sorted(m.step for m in history) == sorted(r["step"] for r in reported)
        auc = client.get_metric_history(run_id, "valid_auc")
        assert len(auc) == 3

        # steps reported while the server was away were not slower than the others
        step_time = {}
        for phase in ("data_wait", "forward", "backward", "optimizer"):
            for m in client.get_metric_history(run_id, f"time_s.{phase}"):
                step_time.setdefault(m.step, [0.0, m.timestamp])[0] += m.value
        during = [t for t, ts in step_time.values() if t_down * 1000 <= ts <= t_up * 1000]
        outside = [t for t, ts in step_time.values() if not (t_down * 1000 <= ts <= t_up * 1000)]
        assert len(during) >= 3, f"only {len(during)} reports fell in the outage; lengthen it"
        med_during, med_outside = statistics.median(during), statistics.median(outside)
        print(f"step time median: {med_during * 1e3:.1f} ms during the outage ({len(during)} reports), "
              f"{med_outside * 1e3:.1f} ms otherwise ({len(outside)} reports)")
        assert med_during < 2.0 * med_outside + 0.005
    finally:
        server.kill()
