"""The driver's metrics drainer stops when asked, not when its waiting ``get`` next times out: at every job's
end it used to wait out its poll interval."""

from __future__ import annotations

import time

import pytest


class Logged:
    """The RunLogger's one method the drainer calls, recording what reached it."""

    def __init__(self):
        self.points = []

    def log_metrics(self, metrics, step, timestamp_ms=None):
        self.points.append((step, dict(metrics)))


@pytest.mark.timeout(120)
def test_the_drainer_stops_at_once_and_keeps_every_report(ray_2_cpus):
    from ray.util.queue import Queue

    from rayemb.tracking.callback import QueueDrainer

    queue = Queue(actor_options={"num_cpus": 0})
    logged = Logged()
    # a poll interval longer than stop() waits for the thread: only a wake-up ends its get
    drainer = QueueDrainer(queue, logged, poll_s=60.0).start()
    try:
        for step in (1, 2, 3):
            queue.put({"step": step, "loss": 0.5 / step})
        for _ in range(600):  # the thread has them all, and goes on to wait in its next get
            if len(drainer.reports) == 3:
                break
            time.sleep(0.05)
        time.sleep(1.0)
        reports = drainer.stop()
        assert not drainer._thread.is_alive()
        assert [r["step"] for r in reports] == [1, 2, 3]
        assert [s for s, _ in logged.points] == [1, 2, 3]
    finally:
        ray_2_cpus.kill(queue.actor)
