"""Worker-side data and resources: in-memory batches, prefetching, the first-batch timeout, CPU packing,
and the network interface collectives use."""

import pickle
import threading
import time

import pytest

from rayemb.train.worker.backend import SOCKET_IFNAME_VARS, interface_for, pin_socket_interface
from rayemb.train.worker.data_loader import DataStarvedError, RankBatches
from rayemb.train.driver.resources import data_starvation_warning, free_cpus_after_packing


class _Shard:
    """Stands in for a Ray Data shard: iter_batches yields ``n`` items (ints), optionally after a delay."""

    def __init__(self, n: int, delay_s: float = 0.0, fail_at=None) -> None:
        self.n, self.delay_s, self.fail_at, self.passes = n, delay_s, fail_at, 0

    def iter_batches(self, **kwargs):
        self.passes += 1
        time.sleep(self.delay_s)
        for i in range(self.n):
            if i == self.fail_at:
                raise ValueError("corrupt row group")
            yield i


def _batches(shard, **kw):
    args = dict(in_memory=True, first_batch_timeout_s=5.0, split="train", rank=0, seed=3)
    args.update(kw)
    return RankBatches(shard, 4, lambda x: x * 10, **args)


def test_in_memory_reads_once_and_reorders_each_epoch_reproducibly():
    shard = _Shard(20)
    data = _batches(shard)
    first = data.epoch(0)
    assert next(first) == 0 and data.needs_step_check  # the first batch before the shard is read: steps check
    e0 = [0, *first]
    e1, e2 = list(data.epoch(1)), list(data.epoch(2))
    assert shard.passes == 1 and len(data) == 20 and not data.needs_step_check
    assert e0 == [10 * i for i in range(20)]  # the first epoch in the order read, each batch converted once
    assert sorted(e1) == sorted(e2) == e0 and e1 != e2 != e0  # a fresh order per later epoch ...
    assert list(_batches(_Shard(20)).epoch(1)) == e1  # ... that the seed reproduces, also on a resumed job
    assert list(data.epoch(0)) == e0


def test_without_overlap_the_shard_is_read_first_and_every_epoch_has_its_own_order():
    shard = _Shard(20)
    data = _batches(shard, overlap_first_epoch=False)
    first = data.epoch(0)
    assert not data.needs_step_check and len(data) == 20  # read whole before the first batch is handed out
    e0, e1 = list(first), list(data.epoch(1))
    assert sorted(e0) == sorted(e1) == [10 * i for i in range(20)] and e0 != e1 and shard.passes == 1
    assert list(_batches(_Shard(20), overlap_first_epoch=False).epoch(0)) == e0  # seeded
    assert e1 == list(_batches(_Shard(20)).epoch(1))  # later epochs: the same order either way


def test_a_first_epoch_that_stops_early_still_keeps_every_batch():
    shard = _Shard(12)
    data = _batches(shard)
    it = data.epoch(0)
    assert [next(it) for _ in range(5)] == [0, 10, 20, 30, 40]  # e.g. train.max_steps_per_epoch
    e1 = list(data.epoch(1))
    assert sorted(e1) == [10 * i for i in range(12)] and shard.passes == 1 and len(data) == 12


@pytest.mark.timing
def test_a_preloaded_split_is_read_in_the_background_while_another_is():
    first, second = _Shard(10, delay_s=0.6), _Shard(10, delay_s=0.6)
    later = _batches(second, split="valid", shuffle=False)
    t0 = time.monotonic()
    later.preload()
    assert sorted(_batches(first).epoch(0)) == [10 * i for i in range(10)]
    assert list(later.epoch(0)) == [10 * i for i in range(10)] and list(later.epoch(1)) == list(later.epoch(0))
    assert time.monotonic() - t0 < 1.1  # the two 0.6 s reads overlapped
    assert second.passes == 1 and len(later) == 10


def test_a_preload_error_is_raised_where_the_batches_are_wanted():
    data = _batches(_Shard(5, fail_at=2), split="valid")
    data.preload()
    with pytest.raises(ValueError, match="corrupt row group"):
        data.epoch(0)
    streamed = _batches(_Shard(3), in_memory=False)
    streamed.preload()  # nothing to hold: streamed data is read when iterated
    assert streamed._loading is None and list(streamed.epoch(0)) == [0, 10, 20]


def test_streamed_reads_every_epoch_in_order():
    shard = _Shard(6)
    data = _batches(shard, in_memory=False)
    assert list(data.epoch(0)) == [0, 10, 20, 30, 40, 50] and list(data.epoch(1)) == [0, 10, 20, 30, 40, 50]
    assert shard.passes == 2 and data.needs_step_check


@pytest.mark.timing
def test_a_starved_shard_fails_within_the_timeout_naming_the_cause():
    data = _batches(_Shard(3, delay_s=30.0), first_batch_timeout_s=0.5, cpus_per_worker=1.5)
    t0 = time.monotonic()
    with pytest.raises(DataStarvedError) as e:
        next(iter(data.epoch(0)))
    assert time.monotonic() - t0 < 5.0
    assert e.value.category == "data_starved"
    assert "scaling.cpus_per_worker (now 1.5)" in e.value.message and "data.first_batch_timeout_s" in e.value.message
    # it crosses process boundaries (Ray pickles worker errors) with its category
    again = pickle.loads(pickle.dumps(e.value))
    assert isinstance(again, DataStarvedError) and again.category == "data_starved"


def test_a_reader_error_reaches_the_training_thread():
    data = _batches(_Shard(5, fail_at=2), in_memory=False)
    it = data.epoch(0)
    assert next(it) == 0 and next(it) == 10
    with pytest.raises(ValueError, match="corrupt row group"):
        next(it)


def test_abandoned_stream_stops_its_thread():
    before = {t for t in threading.enumerate() if t.name == "rayemb-prefetch"}
    data = _batches(_Shard(1000), in_memory=False)
    it = data.epoch(0)
    next(it)
    mine = {t for t in threading.enumerate() if t.name == "rayemb-prefetch"} - before
    assert len(mine) == 1
    it.close()  # the loop broke early (a rank ran out of data)
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in mine):
        assert time.monotonic() < deadline, "prefetch thread still running"
        time.sleep(0.05)


def test_packing_leaves_a_cpu_for_ray_data_or_warns():
    assert free_cpus_after_packing([2.0, 2.0], 2, 1.0) == [0.0, 2.0]  # packed onto one node
    assert data_starvation_warning([2.0, 2.0], 2, 1.0) == []
    # 1.5 CPUs per worker on 2-CPU nodes: each node keeps 0.5, no read task fits anywhere
    warning = data_starvation_warning([2.0, 2.0], 2, 1.5)
    assert len(warning) == 1 and "Lower scaling.cpus_per_worker" in warning[0]
    # the workers do not fit at all: said so
    assert "do not fit" in data_starvation_warning([1.0], 2, 1.0)[0]


def test_interface_of_the_ray_address():
    addrs = {"lo": "127.0.0.1", "re0": "10.213.4.2", "eth0": "192.0.2.2"}
    assert interface_for("10.213.4.2", addrs) == "re0"
    assert interface_for("127.0.0.1", addrs) is None  # single-node: nothing to pin
    assert interface_for("10.9.9.9", addrs) is None


def test_pin_socket_interface_keeps_a_user_choice(monkeypatch):
    for var in SOCKET_IFNAME_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine0")
    assert pin_socket_interface("192.0.2.2") is None
    assert "NCCL_SOCKET_IFNAME" not in __import__("os").environ


def test_pin_socket_interface_sets_the_interface_of_this_host(monkeypatch):
    import os

    from rayemb.train.worker.backend import interface_addresses

    for var in SOCKET_IFNAME_VARS:
        # recorded, so that what the call below sets is undone: the next gloo group in this process would
        # otherwise bind to this interface (an emulated cluster's bridge, gone by then, failed a later run)
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    real = {n: a for n, a in interface_addresses().items() if not a.startswith("127.")}
    if not real:
        pytest.skip("this host has no non-loopback IPv4 interface")
    name, addr = sorted(real.items())[0]
    assert pin_socket_interface(addr) == name
    assert os.environ["GLOO_SOCKET_IFNAME"] == name == os.environ["NCCL_SOCKET_IFNAME"]


def test_spread_placement_leaves_each_node_its_share():
    # SPREAD puts one 1-CPU worker on each 2-CPU node: a CPU stays free on both
    assert free_cpus_after_packing([2.0, 2.0], 2, 1.0, "SPREAD") == [1.0, 1.0]
    assert free_cpus_after_packing([4.0, 1.0], 2, 1.0, "STRICT_SPREAD") == [3.0, 0.0]
    with pytest.raises(ValueError):
        free_cpus_after_packing([4.0], 2, 1.0, "STRICT_SPREAD")
