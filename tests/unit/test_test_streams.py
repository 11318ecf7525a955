"""How `make test` splits the suite between its two pytest-xdist workers (tests/conftest.py)."""

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


def test_jobs_and_clusters_run_serially_in_the_suites_order_with_timing_tests_last(conftest):
    items = [_item("tests/cluster/test_a.py"), _item("tests/dist/test_b.py"),
             _item("tests/unit/test_worker_data.py", timing=True), _item("tests/ray/test_c.py"),
             _item("tests/unit/test_d.py"), _item("tests/e2e/test_e.py"), _item("tests/ray/test_f.py", timing=True)]
    conftest.pytest_collection_modifyitems(None, items)
    assert [os.path.relpath(i.path, REPO) for i in items] == [
        "tests/cluster/test_a.py", "tests/ray/test_c.py", "tests/e2e/test_e.py",  # serial, as collected
        "tests/unit/test_worker_data.py", "tests/ray/test_f.py",  # serial, timing: last
        "tests/dist/test_b.py", "tests/unit/test_d.py"]  # the other stream


def test_a_timing_test_outside_the_serial_files_stops_collection_naming_the_file(conftest):
    with pytest.raises(pytest.UsageError, match="tests/unit/test_new.py to SERIAL_FILES"):
        conftest.pytest_collection_modifyitems(None, [_item("tests/unit/test_new.py", timing=True)])


def test_each_serial_file_still_holds_a_timing_test(conftest):
    for path in conftest.SERIAL_FILES:
        assert os.path.exists(os.path.join(REPO, path)), path
        assert "pytest.mark.timing" in open(os.path.join(REPO, path)).read(), f"{path}: no timing test left"


def test_the_scheduler_keeps_the_serial_stream_in_one_unit(conftest, pytestconfig):
    pytest.importorskip("xdist")
    from xdist.remote import Producer

    class Dist:
        def __init__(self, dist):
            self.dist, self.option = dist, pytestconfig.option

        def getvalue(self, name):
            return {"dist": self.dist, "tx": ["2*popen"]}.get(name) or pytestconfig.getvalue(name)

    assert conftest.pytest_xdist_make_scheduler(Dist("load"), None) is None  # another --dist is left to xdist
    sched = conftest.pytest_xdist_make_scheduler(Dist("loadgroup"), Producer("test", enabled=False))
    assert sched._split_scope("tests/ray/test_s3_job.py::test_x") == conftest.SERIAL_GROUP
    assert sched._split_scope("tests/unit/test_worker_data.py::test_y[a]") == conftest.SERIAL_GROUP
    assert sched._split_scope("tests/unit/test_config.py::test_z") == "tests/unit/test_config.py::test_z"
