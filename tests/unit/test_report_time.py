"""A report's MLflow points carry the time the report was made, not the time the driver got to log it: reports
reach the driver's queue by two paths (rank 0's step metrics directly, checkpoint reports through Ray Train's
controller), so they can arrive out of step order, and MLflow's time axis must still follow the steps."""

from __future__ import annotations

import queue
import time

from mlflow import MlflowClient

from rayemb.tracking.callback import WALL_TIME_MS, QueueDrainer, stamped
from rayemb.tracking.run_logger import RunLogger


def test_points_keep_the_time_their_report_was_made_whatever_order_they_arrive_in(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rl = RunLogger(uri, "unit", spill_dir=str(tmp_path / "spill")).start()
    reports = queue.Queue()
    drainer = QueueDrainer(reports, rl, poll_s=0.05).start()
    made = []
    for step in (5, 10, 15):
        made.append(stamped({"step": step, "train_loss": 1.0 / step}))
        time.sleep(0.02)
    assert stamped(made[0])[WALL_TIME_MS] == made[0][WALL_TIME_MS]  # a stamp is never moved later
    for report in (made[1], made[0], made[2]):  # step 10's report (a checkpoint's, say) arrives first
        reports.put(dict(report))  # a copy, as the queue hands the driver
    kept = drainer.stop()
    assert rl.finish()
    history = MlflowClient(uri).get_metric_history(rl.run_id, "train_loss")
    assert [m.step for m in sorted(history, key=lambda m: m.timestamp)] == [5, 10, 15]
    assert sorted(m.timestamp for m in history) == [r[WALL_TIME_MS] for r in made]
    # the stamp is the points' time, not a metric: not in the kept reports, not logged
    assert [r["step"] for r in kept] == [10, 5, 15] and all(WALL_TIME_MS not in r for r in kept)
    assert WALL_TIME_MS not in MlflowClient(uri).get_run(rl.run_id).data.metrics
