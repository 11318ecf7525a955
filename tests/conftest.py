"""Shared fixtures: tiny generated datasets and a local 2-CPU Ray bound to 127.0.0.1."""

from __future__ import annotations

import os
import sys

import _collected
import pytest
from _datasets import synthetic_dataset
from _shared_ray import SharedRay

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A small one-hot synthetic dataset (8 tables) shared by every test of the run."""
    return synthetic_dataset(tmp_path_factory, "tiny_data", num_tables=8)


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


def pytest_collectreport(report):
    if report.nodeid.endswith(".py") and (report.skipped or (report.passed and report.result)):
        _collected.FILES.add(report.nodeid)


def python_exe() -> str:
    return sys.executable
