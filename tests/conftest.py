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


#: ``make test`` runs the suite in three pytest-xdist workers (``-n 3 --dist loadgroup``) as streams:
#:
#: * ``cluster``: the tests that start clusters of their own (emulated nodes in network namespaces, a Ray head
#:   under a memory cgroup, the fake autoscaler, two Ray nodes on 127.0.0.1), one after another: each holds
#:   gigabytes and several Ray nodes, two at once would swap;
#: * ``jobs``: the tests that run jobs on the run's shared local Ray (``tests/ray``: Ray keeps state in the
#:   process, so they share one) and through ``ray job submit`` (``tests/e2e``), one after another;
#: * every other test (unit tests, gloo multi-process tests, the clean venv install) on whichever worker is free.
#:
#: A job spends much of its time waiting on processes it started (with one stream the CPUs sat a third idle,
#: with two a quarter), which the streams beside it fill. Each stream keeps the suite's own order. The files with
#: tests that assert wall-clock bounds (marked ``timing``, ``TIMING_FILES``) are the last unit of work, given to a
#: worker only once every other test has run, so they run alone as they always did.
STREAMS = {"cluster": ("tests/cluster/",), "jobs": ("tests/ray/", "tests/e2e/")}
TIMING_GROUP = "timing"
#: the files with ``timing`` tests (the whole file runs in the timing group, after everything else)
TIMING_FILES = ("tests/dist/test_calibrate.py", "tests/unit/test_bench_host_cpu.py",
                "tests/unit/test_tracking_logger.py", "tests/unit/test_worker_data.py",
                "tests/ray/test_tracking_outage_job.py", "tests/ray/test_data_starvation.py")


def stream_of(nodeid: str):
    """The unit of work the test ``nodeid`` (or its file's path, relative to the repo) belongs to: a stream's
    name, ``timing``, or None (a unit of its own, run on whichever worker is free)."""
    path = nodeid.split("::", 1)[0]
    if path in TIMING_FILES:
        return TIMING_GROUP
    return next((name for name, dirs in STREAMS.items() if path.startswith(dirs)), None)


def _order_key(item):
    """Where ``item`` runs in a one-process run (a sort key): the streams' tests first, in the suite's order,
    then the others, then the timing files."""
    stream = stream_of(item.nodeid)
    if item.get_closest_marker("timing") and stream != TIMING_GROUP:
        path = item.nodeid.split("::", 1)[0]
        raise pytest.UsageError(f"{item.nodeid} is marked timing: add {path} to TIMING_FILES in tests/conftest.py")
    return 2 if stream == TIMING_GROUP else 0 if stream else 1


def pytest_collection_modifyitems(config, items):
    """The streams' tests first, the others after, the timing files last (stable: each keeps its order)."""
    items[:] = sorted(items, key=_order_key)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the streams and the timing files as units of work of their own. (pytest-xdist 3.8
    marks its groups by renaming node ids, which pytest 9 ignores, so the units are named here, from each test's
    file.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class StreamScheduling(LoadScopeScheduling):
        """The streams go out first, one to a worker; the other tests as workers free up; the timing unit last,
        to one worker (the keeper: the first to run out of work when no other worker has any left) once every
        other worker has ended. A worker waiting for more work has at most one test pending: xdist runs a test
        once it knows the next."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.keeper = None

        def _split_scope(self, nodeid: str) -> str:
            return stream_of(nodeid) or nodeid

        def _working(self, node) -> bool:
            return not node.shutting_down and self._pending_of(self.assigned_work[node]) > 1

        def _assign_work_unit(self, node) -> None:
            if TIMING_GROUP in self.workqueue:
                self.workqueue.move_to_end(TIMING_GROUP)
            for name in STREAMS:  # a stream before single tests: it is the longest piece of work
                if name in self.workqueue:
                    self.workqueue.move_to_end(name, last=False)
                    break
            if next(iter(self.workqueue)) != TIMING_GROUP:
                return super()._assign_work_unit(node)
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            if self.keeper is None and not any(self._working(o) for o in self.nodes if o is not node):
                self.keeper = node
            if node is not self.keeper:
                node.shutdown()  # it runs its last test now, not beside the timing unit
            elif all(o is node for o in self.nodes):  # the others have ended: the timing unit, alone
                super()._assign_work_unit(node)

        def remove_node(self, node):
            crashed = super().remove_node(node)
            if node is self.keeper:
                self.keeper = None
            for other in self.nodes:  # the keeper waits for this one to end
                self._reschedule(other)
            return crashed

    return StreamScheduling(config, log)


def pytest_collectreport(report):
    if report.nodeid.endswith(".py") and (report.skipped or (report.passed and report.result)):
        _collected.FILES.add(report.nodeid)


def python_exe() -> str:
    return sys.executable
