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


#: ``make test`` runs the suite in two pytest-xdist workers (``-n 2 --dist loadgroup``), in three parts:
#:
#: * the job stream: one worker runs, one after another, the tests that start Ray clusters, Ray jobs or whole-job
#:   subprocesses (SERIAL_DIRS), in the suite's own order (its tests share one process, and Ray keeps state in it);
#: * the other worker runs every other test beside it, then LATE_FILES: Ray job tests of ``tests/ray`` that need
#:   nothing the job stream's tests set up (their own jobs on the tiny data, no package fixture), in a Ray of that
#:   worker's own. A job spends much of its time waiting on processes it started (the CPUs sit about a fifth
#:   idle beside one job stream), which a second stream of jobs fills once the other tests are done;
#: * last, alone, the files with tests that assert wall-clock bounds (marked ``timing``: TIMING_FILES): the
#:   scheduler gives them to a worker only once the other worker has run its last test and stopped.
SERIAL_GROUP = "serial"
LATE_GROUP = "late"
TIMING_GROUP = "timing"
SERIAL_DIRS = ("tests/cluster/", "tests/ray/", "tests/e2e/")
#: files with ``timing`` tests: the whole file runs last, alone
TIMING_FILES = ("tests/dist/test_calibrate.py", "tests/unit/test_bench_host_cpu.py",
                "tests/unit/test_tracking_logger.py", "tests/unit/test_worker_data.py",
                "tests/ray/test_data_starvation.py", "tests/ray/test_tracking_outage_job.py")
#: job tests the second worker runs after the other tests (above)
LATE_FILES = tuple(f"tests/ray/{name}.py" for name in (
    "test_api_user_callback", "test_bucketize_job", "test_calibration_reuse", "test_convert_ray",
    "test_convert_train", "test_dense_transforms_job", "test_group_gauc_job", "test_materialize",
    "test_movielens_rating_job", "test_multitask_job", "test_python_api", "test_raw_id_training_job",
    "test_resume_dense_params_job", "test_schema_infer_job", "test_sequence_job", "test_table_dims_train",
    "test_task_export_predict", "test_two_tower_job"))
#: the order the parts are collected in, and so handed out (None: the other tests, each a unit of its own)
_ORDER = {SERIAL_GROUP: 0, None: 1, LATE_GROUP: 2, TIMING_GROUP: 3}


def _group(nodeid: str):
    """The part the test ``nodeid`` (or its file's path, relative to the repo) runs in; None for the other tests."""
    path = nodeid.split("::", 1)[0]
    if path in TIMING_FILES:
        return TIMING_GROUP
    if path in LATE_FILES:
        return LATE_GROUP
    if path.startswith(SERIAL_DIRS):
        return SERIAL_GROUP
    return None


def pytest_collection_modifyitems(config, items):
    """The job stream first, then the other tests, the late jobs and the timing files, each as collected."""
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("timing") and path not in TIMING_FILES:
            raise pytest.UsageError(f"{item.nodeid} is marked timing: add {path} to TIMING_FILES in tests/conftest.py")
    order = [(_ORDER[_group(item.nodeid)], i) for i, item in enumerate(items)]
    items[:] = [items[i] for _, i in sorted(order)]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the suite's parts as units, handed out in their collected order, the timing files
    held until they can run alone. (pytest-xdist 3.8 marks its groups by renaming node ids, which pytest 9
    ignores, so the groups are named here, from each test's file.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuitePartsScheduling(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False  # largest unit first would put the late jobs beside the first

        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid) or nodeid

        def _timing_next(self) -> bool:
            return bool(self.workqueue) and next(iter(self.workqueue)) == TIMING_GROUP

        def _assign_work_unit(self, node) -> None:
            if self._timing_next():  # only _timing_turn hands the timing files out
                return self._timing_turn()
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            if self._timing_next():
                return self._timing_turn()
            super()._reschedule(node)

        def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
            super().mark_test_complete(node, item_index, duration)
            if self._timing_next():
                self._timing_turn()

        def _timing_turn(self) -> None:
            """A worker holds back its last test until it gets more work or is told to stop, so one with at
            most one test pending is waiting. While a worker still runs tests, a waiting one is stopped; once
            none runs, one waiting worker is kept and the others stopped, and it gets the timing files when
            the stopped ones have run their last tests."""
            pending = {n: self._pending_of(self.assigned_work[n]) for n in self.nodes}
            waiting = [n for n, p in pending.items() if p <= 1 and not n.shutting_down]
            if any(p >= 2 for p in pending.values()) or not waiting:
                for n in waiting:
                    n.shutdown()
                return
            keep, *others = waiting
            for n in others:
                n.shutdown()
            if all(pending[n] == 0 for n in pending if n is not keep):
                LoadScopeScheduling._assign_work_unit(self, keep)

    return SuitePartsScheduling(config, log)


def pytest_collectreport(report):
    if report.nodeid.endswith(".py") and (report.skipped or (report.passed and report.result)):
        _collected.FILES.add(report.nodeid)


def python_exe() -> str:
    return sys.executable
