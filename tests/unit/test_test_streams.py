"""How `make test` splits the suite between its pytest-xdist workers (tests/conftest.py): the streams, the other
tests, and the timing files last and alone. The scheduler is driven here as pytest-xdist drives it, with workers
that run the tests they are sent in a simulated order."""

import os
import random
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


def test_one_process_runs_the_streams_first_the_others_then_the_timing_files(conftest):
    items = [_item("tests/cluster/test_a.py"), _item("tests/dist/test_b.py"),
             _item("tests/unit/test_worker_data.py", timing=True), _item("tests/ray/test_c.py"),
             _item("tests/unit/test_d.py"), _item("tests/e2e/test_e.py"),
             _item("tests/ray/test_data_starvation.py", timing=True), _item("tests/unit/test_worker_data.py")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [os.path.relpath(i.path, REPO) for i in items] == [
        "tests/cluster/test_a.py", "tests/ray/test_c.py", "tests/e2e/test_e.py",  # the streams, as collected
        "tests/dist/test_b.py", "tests/unit/test_d.py",  # the others
        "tests/unit/test_worker_data.py", "tests/ray/test_data_starvation.py", "tests/unit/test_worker_data.py"]


def test_a_timing_test_outside_the_timing_files_stops_collection_naming_the_file(conftest):
    with pytest.raises(pytest.UsageError, match="tests/unit/test_new.py to TIMING_FILES"):
        conftest.pytest_collection_modifyitems(None, [_item("tests/unit/test_new.py", timing=True)])


def test_each_timing_file_still_holds_a_timing_test(conftest):
    for path in conftest.TIMING_FILES:
        assert os.path.exists(os.path.join(REPO, path)), path
        assert "pytest.mark.timing" in open(os.path.join(REPO, path)).read(), f"{path}: no timing test left"


class _Dist:
    def __init__(self, pytestconfig, dist, workers):
        self.dist, self.option, self.workers, self.pytestconfig = dist, pytestconfig.option, workers, pytestconfig

    def getvalue(self, name):
        return {"dist": self.dist, "tx": [f"{self.workers}*popen"], "numprocesses": self.workers}.get(name) \
            if name in ("dist", "tx", "numprocesses") else self.pytestconfig.getvalue(name)


class _Worker:
    """A pytest-xdist worker as the scheduler sees it: it runs a test once it knows the next one (or is told to
    shut down), and reports each test done; after shutdown it runs what it holds and ends."""

    def __init__(self, name):
        self.name, self.shutting_down, self.queue, self.ended = name, False, [], False
        self.gateway = types.SimpleNamespace(id=name)

    def send_runtest_some(self, indices):
        assert not self.shutting_down, f"{self.name} got work after shutdown"
        self.queue.extend(indices)

    def shutdown(self):
        self.shutting_down = True

    def can_run(self):
        return not self.ended and (len(self.queue) > 1 or (self.queue and self.shutting_down))

    def __repr__(self):
        return self.name


def _collection():
    ids = [f"tests/cluster/test_c{i}.py::test_{j}" for i in range(3) for j in range(2)]
    ids += [f"tests/ray/test_r{i}.py::test_x" for i in range(4)] + ["tests/e2e/test_submit.py::test_x"]
    ids += [f"tests/unit/test_u{i}.py::test_x" for i in range(12)] + [f"tests/dist/test_d{i}.py::test_x"
                                                                    for i in range(3)]
    ids += ["tests/unit/test_worker_data.py::test_t1", "tests/unit/test_worker_data.py::test_fast",
            "tests/ray/test_data_starvation.py::test_t2"]
    return ids


def _simulate(conftest, pytestconfig, workers: int, seed: int):
    from xdist.remote import Producer

    sched = conftest.pytest_xdist_make_scheduler(_Dist(pytestconfig, "loadgroup", workers),
                                                 Producer("test", enabled=False))
    ids = _collection()
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    for n in nodes:
        sched.add_node(n)
    for n in nodes:
        sched.add_node_collection(n, ids)
    sched.schedule()
    rng, log = random.Random(seed), []  # log: (worker, test id, ids still not run by any worker)
    done = set()
    while True:
        ready = [n for n in nodes if n.can_run()]
        if not ready:
            break
        node = rng.choice(ready)
        index = node.queue.pop(0)
        done.add(index)
        log.append((node.name, ids[index], len(ids) - len(done)))
        sched.mark_test_complete(node, index)
        if node.shutting_down and not node.queue:
            node.ended = True
            sched.remove_node(node)
    return sched, ids, nodes, log


@pytest.mark.parametrize("workers,seed", [(3, 0), (3, 1), (3, 7), (2, 3), (1, 0)])
def test_each_stream_runs_on_one_worker_and_the_timing_files_alone_after_every_other_test(
        conftest, pytestconfig, workers, seed):
    pytest.importorskip("xdist")
    sched, ids, nodes, log = _simulate(conftest, pytestconfig, workers, seed)
    assert sorted(t for _, t, _ in log) == sorted(ids)  # every test ran once
    assert sched.tests_finished and not sched.has_pending and not sched.workqueue
    worker_of = {t: w for w, t, _ in log}
    for dirs in conftest.STREAMS.values():
        assert len({w for t, w in worker_of.items() if t.startswith(dirs)
                    and conftest.stream_of(t) != conftest.TIMING_GROUP}) == 1, dirs
    timing = [k for k, (_, t, _) in enumerate(log) if conftest.stream_of(t) == conftest.TIMING_GROUP]
    assert len(timing) == 3 and timing == list(range(len(log) - 3, len(log)))  # the last three tests run ...
    assert len({log[k][0] for k in timing}) == 1  # ... on one worker
    timing_worker = log[timing[0]][0]
    # ... and every other worker had ended before the first of them ran
    first = timing[0]
    assert all(w == timing_worker for w, _, _ in log[first:])


def test_the_streams_start_first_one_to_a_worker(conftest, pytestconfig):
    pytest.importorskip("xdist")
    sched, ids, nodes, log = _simulate(conftest, pytestconfig, 3, 0)
    firsts = {}
    for w, t, _ in log:
        firsts.setdefault(w, t)
    assert sorted(conftest.stream_of(t) or "other" for t in firsts.values()) == ["cluster", "jobs", "other"]


def test_another_dist_mode_is_left_to_xdist(conftest, pytestconfig):
    assert conftest.pytest_xdist_make_scheduler(_Dist(pytestconfig, "load", 2), None) is None
