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


@pytest.fixture(scope="module")
def ray_2_cpus():
    """A real local Ray with 2 CPUs on 127.0.0.1, stopped by the handle that started it."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}})
    yield ray
    ray.shutdown()


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
