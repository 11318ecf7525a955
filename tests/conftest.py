"""Shared fixtures: tiny generated datasets and a local 2-CPU Ray bound to 127.0.0.1."""

from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A small one-hot synthetic dataset (8 tables) shared by every test of the pytest session."""
    from rayemb.data.synthetic import SyntheticSpec, generate

    out = str(tmp_path_factory.mktemp("tiny_data"))
    generate(SyntheticSpec(rows=40_000, num_tables=8, seed=7, num_signal_tables=6), out)
    return out


@pytest.fixture(scope="session")
def _shared_ray():
    """One local Ray for the whole test run: starting one costs seconds, and most Ray tests only need it up.

    Yields a function that (re)starts it when a fixture with other settings (``s3_ray``, ``ray_local``)
    shut it down in between. Stopped by the handle that started it."""
    import ray

    def up():
        if not ray.is_initialized():
            ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                     logging_level="WARNING",
                     runtime_env={"env_vars": {"PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}})
        return ray

    yield up
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def ray_2_cpus(_shared_ray):
    """A real local Ray with 2 CPUs on 127.0.0.1, shared by the tests that take it, with every CPU free."""
    ray = _shared_ray()
    _wait_for_free_cpus(ray)
    yield ray


def _wait_for_free_cpus(ray, timeout_s: float = 60.0) -> None:
    """A test that ends while Ray still tears down its actors would starve the next one's workers."""
    import time

    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < ray.cluster_resources().get("CPU", 0.0):
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray still holds CPUs {timeout_s:.0f} s after the previous test: "
                               f"{ray.available_resources()} of {ray.cluster_resources()}")
        time.sleep(0.5)


def python_exe() -> str:
    return sys.executable
