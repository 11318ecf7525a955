"""Shared fixtures: tiny generated datasets and a local 2-CPU Ray bound to 127.0.0.1."""

from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A small one-hot synthetic dataset (8 tables) shared by every test of the run."""
    from rayemb.data.synthetic import SyntheticSpec, generate

    out = str(tmp_path_factory.mktemp("tiny_data"))
    generate(SyntheticSpec(rows=40_000, num_tables=8, seed=7, num_signal_tables=6), out)
    return out


class SharedRay:
    """One local 2-CPU Ray on 127.0.0.1 for the tests that run in-process jobs, started when first asked for.

    Starting a Ray costs seconds, and its pooled task workers (Ray Data's readers, the planner's task, with
    their imports done) serve the next job too, so tests share one. A test that starts a Ray of its own
    shuts this one down first (``ray.shutdown()``); the next test that asks for it starts it again.
    """

    ARGS = dict(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                logging_level="WARNING",
                runtime_env={"env_vars": {"PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}})

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


@pytest.fixture(scope="session")
def shared_ray():
    ray_handle = SharedRay()
    yield ray_handle
    ray_handle.stop()


@pytest.fixture
def ray_2_cpus(shared_ray):
    """The run's shared local Ray (:class:`SharedRay`), stopped by the handle that started it."""
    return shared_ray.ensure()


#: the folder whose tests keep the shared Ray up between them; elsewhere a test that does not ask for it
#: runs without it, so an idle Ray never runs beside the clusters and processes other tests start
SHARED_RAY_DIR = os.path.join(REPO, "tests", "ray")


@pytest.fixture(autouse=True)
def _shared_ray_only_where_asked(request, shared_ray):
    if "ray_2_cpus" not in request.fixturenames and not str(request.path).startswith(SHARED_RAY_DIR + os.sep):
        shared_ray.stop()
    yield


@pytest.fixture(scope="module")
def one_rank_group():
    """A one-rank gloo process group on 127.0.0.1, for code that needs ``torch.distributed`` without peers."""
    import torch.distributed as dist

    from rayemb.multiprocess import free_port

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def python_exe() -> str:
    return sys.executable
