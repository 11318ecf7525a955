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


@pytest.fixture(autouse=True)
def _socket_interface_left_as_found():
    """A test that pins the collectives' interface in this process undoes it: every later process group of the
    process would bind to that interface (an emulated cluster's bridge, gone by then, failed a whole run)."""
    names = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    before = {v: os.environ.get(v) for v in names}
    yield
    after = {v: os.environ.get(v) for v in names}
    assert after == before, f"the test left {after} (found {before}): set it through monkeypatch.setenv"


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


#: ``make test`` runs the suite in two pytest-xdist workers (``-n 2 --dist loadgroup``). One worker runs, one
#: after another, the tests that start Ray clusters, Ray jobs or whole-job subprocesses, and the files with tests
#: that assert wall-clock bounds (marked ``timing``); the other worker runs every other test beside them. A job
#: spends much of its time waiting on processes it started (with one stream the CPUs sat a third idle), which the
#: second stream fills. The serial stream keeps the suite's own order, as one process ran it before (its tests
#: share one process, and Ray keeps state in it), except that the ``timing`` tests run last, after the other
#: stream is over.
SERIAL_GROUP = "serial"
SERIAL_DIRS = ("tests/cluster/", "tests/ray/", "tests/e2e/")
#: files outside SERIAL_DIRS with ``timing`` tests: the whole file runs in the serial stream
SERIAL_FILES = ("tests/dist/test_calibrate.py", "tests/unit/test_bench_host_cpu.py",
                "tests/unit/test_tracking_logger.py", "tests/unit/test_worker_data.py")


def _serial_file(nodeid: str) -> bool:
    """Whether the test ``nodeid`` (or its file's path, relative to the repo) is in the serial stream."""
    path = nodeid.split("::", 1)[0]
    return path.startswith(SERIAL_DIRS) or path in SERIAL_FILES


def _serial_rank(item):
    """Where ``item`` runs in the serial stream (a sort key), or None when it runs in the other stream."""
    if item.get_closest_marker("timing"):
        path = item.nodeid.split("::", 1)[0]
        if not _serial_file(path):
            raise pytest.UsageError(f"{item.nodeid} is marked timing: add {path} to SERIAL_FILES in tests/conftest.py")
        return 1
    if _serial_file(item.nodeid):
        return 0
    return None


def pytest_collection_modifyitems(config, items):
    """The serial stream's tests first, in the order they run; the others after, as collected."""
    ranks = [_serial_rank(item) for item in items]
    serial = sorted((r, i) for i, r in enumerate(ranks) if r is not None)
    items[:] = [items[i] for _, i in serial] + [item for item, r in zip(items, ranks) if r is None]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the serial stream as one group. (pytest-xdist 3.8 marks its groups by renaming
    node ids, which pytest 9 ignores, so the group is named here, from each test's file.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SerialStreamScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SERIAL_GROUP if _serial_file(nodeid) else nodeid

    return SerialStreamScheduling(config, log)


def pytest_collectreport(report):
    if report.nodeid.endswith(".py") and (report.skipped or (report.passed and report.result)):
        _collected.FILES.add(report.nodeid)


def python_exe() -> str:
    return sys.executable
