"""How `make test` splits the suite between its two pytest-xdist workers (tests/conftest.py)."""

import copy
import os
import types

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def conftest(pytestconfig):
    """tests/conftest.py as pytest loaded it (``import conftest`` may name another directory's conftest)."""
    return pytestconfig.pluginmanager.get_plugin(os.path.join(REPO, "tests", "conftest.py"))


def _item(path: str, timing: bool = False, name: str = "test_x"):
    mark = pytest.mark.timing.mark if timing else None
    return types.SimpleNamespace(path=os.path.join(REPO, path), nodeid=f"{path}::{name}",
                                 get_closest_marker=lambda m: mark if m == "timing" else None)


def test_the_job_stream_first_then_the_other_tests_the_late_jobs_and_the_timing_files(conftest):
    items = [_item("tests/cluster/test_a.py"), _item("tests/dist/test_b.py"),
             _item("tests/unit/test_worker_data.py", timing=True), _item("tests/ray/test_c.py"),
             _item("tests/ray/test_convert_train.py"), _item("tests/unit/test_d.py"), _item("tests/e2e/test_e.py"),
             _item("tests/ray/test_data_starvation.py", timing=True), _item("tests/unit/test_worker_data.py", name="n")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [
        "tests/cluster/test_a.py::test_x", "tests/ray/test_c.py::test_x", "tests/e2e/test_e.py::test_x",  # jobs
        "tests/dist/test_b.py::test_x", "tests/unit/test_d.py::test_x",  # the other tests
        "tests/ray/test_convert_train.py::test_x",  # the late jobs
        # the timing files, as collected: their other tests too
        "tests/unit/test_worker_data.py::test_x", "tests/ray/test_data_starvation.py::test_x",
        "tests/unit/test_worker_data.py::n"]


def test_a_timing_test_outside_the_timing_files_stops_collection_naming_the_file(conftest):
    with pytest.raises(pytest.UsageError, match="tests/unit/test_new.py to TIMING_FILES"):
        conftest.pytest_collection_modifyitems(None, [_item("tests/unit/test_new.py", timing=True)])


def test_each_timing_file_still_holds_a_timing_test_and_each_late_file_exists(conftest):
    for path in conftest.TIMING_FILES:
        assert os.path.exists(os.path.join(REPO, path)), path
        assert "pytest.mark.timing" in open(os.path.join(REPO, path)).read(), f"{path}: no timing test left"
    for path in conftest.LATE_FILES:
        assert os.path.exists(os.path.join(REPO, path)), path
        # a late file runs in another process than the job stream: a package fixture would be set up twice
        text = open(os.path.join(REPO, path)).read()
        assert "e2e_job" not in text and "user_model_jobs" not in text, path


def test_the_scheduler_keeps_the_serial_stream_in_one_unit(conftest, pytestconfig):
    pytest.importorskip("xdist")
    from xdist.remote import Producer

    class Dist:
        def __init__(self, dist):
            # a copy: the scheduler sets its option (the handing-out order) on the pytest run it schedules
            self.dist, self.option = dist, copy.copy(pytestconfig.option)

        def getvalue(self, name):
            return {"dist": self.dist, "tx": ["2*popen"]}.get(name) or pytestconfig.getvalue(name)

    assert conftest.pytest_xdist_make_scheduler(Dist("load"), None) is None  # another --dist is left to xdist
    sched = conftest.pytest_xdist_make_scheduler(Dist("loadgroup"), Producer("test", enabled=False))
    assert sched._split_scope("tests/ray/test_s3_job.py::test_x") == conftest.SERIAL_GROUP
    assert sched._split_scope("tests/ray/test_convert_train.py::test_x[a]") == conftest.LATE_GROUP
    assert sched._split_scope("tests/unit/test_worker_data.py::test_y[a]") == conftest.TIMING_GROUP
    assert sched._split_scope("tests/unit/test_config.py::test_z") == "tests/unit/test_config.py::test_z"


class _Worker:
    """What the scheduler sees of a pytest-xdist worker; it runs what it was sent as a worker does: every test
    but the last until it gets more or is told to stop (the last one's teardown needs to know the next)."""

    def __init__(self, name: str):
        self.gateway = types.SimpleNamespace(id=name)
        self.shutting_down, self.torun, self.done = False, [], False

    def send_runtest_some(self, indices):
        self.torun.extend(indices)

    def shutdown(self):
        self.shutting_down = True

    def runnable(self) -> bool:
        return len(self.torun) >= 2 or (self.shutting_down and bool(self.torun))


def _run_suite(conftest, pytestconfig, collection):
    """The two workers taking turns, one test each, as the scheduler hands tests out: [(worker, test, the
    workers still alive then)] in the order the tests ran."""
    from xdist.remote import Producer

    class Dist:
        option = copy.copy(pytestconfig.option)

        def getvalue(self, name):
            return {"dist": "loadgroup", "tx": ["2*popen"]}.get(name) or pytestconfig.getvalue(name)

    sched = conftest.pytest_xdist_make_scheduler(Dist(), Producer("test", enabled=False))
    workers = [_Worker("gw0"), _Worker("gw1")]
    for w in workers:
        sched.add_node(w)
        sched.add_node_collection(w, collection)
    sched.schedule()
    ran = []
    for _ in range(10 * len(collection)):
        alive = [w for w in workers if not w.done]
        if not alive:
            break
        progressed = False
        for w in alive:
            if w.runnable():
                index = w.torun.pop(0)
                ran.append((w.gateway.id, collection[index], tuple(x.gateway.id for x in workers if not x.done)))
                sched.mark_test_complete(w, index)
                progressed = True
            elif w.shutting_down and not w.torun:
                w.done = True
                sched.remove_node(w)
                progressed = True
        assert progressed, f"deadlock: {[(w.gateway.id, w.torun, w.shutting_down) for w in workers]}"
    return ran


def test_the_timing_files_run_alone_after_both_streams_and_the_late_jobs_after_the_other_tests(conftest,
                                                                                               pytestconfig):
    pytest.importorskip("xdist")
    jobs = [f"tests/ray/test_s3_job.py::test_{i}" for i in range(6)] + ["tests/cluster/test_a.py::test_x"]
    others = [f"tests/unit/test_config.py::test_{i}" for i in range(4)]
    late = [f"tests/ray/test_convert_train.py::test_{i}" for i in range(3)]
    timing = ["tests/unit/test_worker_data.py::test_t", "tests/ray/test_data_starvation.py::test_t"]
    for collection in (jobs + others + late + timing,  # the job stream ends last
                       jobs[:2] + others + late * 1 + [f"tests/ray/test_materialize.py::test_{i}" for i in range(9)]
                       + timing,  # the late jobs end last
                       others[:1] + timing):  # only a test beside the timing files
        ran = _run_suite(conftest, pytestconfig, collection)
        assert sorted(t for _, t, _ in ran) == sorted(collection)  # each test once
        for worker, test, alive in ran:
            if test in timing:
                assert alive == (worker,), (test, alive)  # the other worker ran its last test and stopped
        first_late = [i for i, (_, t, _) in enumerate(ran) if "convert_train" in t or "materialize" in t]
        if first_late:  # one unit, after that worker's other tests
            late_worker = {ran[i][0] for i in first_late}
            assert len(late_worker) == 1
            assert not [t for w, t, _ in ran[first_late[0]:] if w in late_worker and t in others]
            if collection[0] == jobs[0] and len(collection) > 20:  # a long job stream: the late jobs run beside it
                assert {w for w, t, _ in ran if t in jobs} != late_worker
