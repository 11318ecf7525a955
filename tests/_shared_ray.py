"""The tests' shared local Ray (the ``shared_ray`` and ``ray_2_cpus`` fixtures of conftest.py)."""

from __future__ import annotations

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SharedRay:
    """One local 2-CPU Ray on 127.0.0.1 for the tests that run in-process jobs, started when first asked for.

    Starting a Ray costs seconds, and its pooled task workers (Ray Data's readers, the planner's task, with
    their imports done) serve the next job too, so tests share one. A test that starts a Ray of its own
    shuts this one down first (``ray.shutdown()``); the next test that asks for it starts it again.
    """

    ARGS = dict(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                logging_level="WARNING",
                runtime_env={"env_vars": {"PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}},
                # Idle workers stay for the next job: by default Ray keeps as many as it has CPUs for a second,
                # and every job started new ones (imports of pyarrow, Ray Data, TorchRec: seconds of CPU each)
                _system_config={"num_workers_soft_limit": 8, "idle_worker_killing_time_threshold_ms": 600_000})

    def __init__(self) -> None:
        self.gcs_address = None  # of the Ray this handle started

    def _current(self):
        import ray

        return ray.get_runtime_context().gcs_address if ray.is_initialized() else None

    def ensure(self):
        import ray

        if self._current() is None:
            ray.init(**self.ARGS)
            self.gcs_address = self._current()
        return ray

    def stop(self) -> None:
        import ray

        if self.gcs_address is not None and self._current() == self.gcs_address:
            ray.shutdown()
        self.gcs_address = None
