"""The private local Ray of ``rayemb._ray.init_ray``: its worker processes run rayemb's setup hook."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from rayemb.logs import LOCAL_RAY_NOISY_LOGGERS, quiet_local_ray_worker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(300)


def test_quiet_local_ray_worker_lowers_only_the_named_loggers():
    name = LOCAL_RAY_NOISY_LOGGERS[0]
    before = logging.getLogger(name).level
    try:
        logging.getLogger(name).setLevel(logging.NOTSET)
        quiet_local_ray_worker()
        assert logging.getLogger(name).getEffectiveLevel() == logging.ERROR
        assert logging.getLogger("ray.train").getEffectiveLevel() < logging.ERROR
    finally:
        logging.getLogger(name).setLevel(before)


@pytest.fixture
def short_tmp():
    """A short private folder: Ray's session sockets under RAY_TMPDIR must fit the 107-byte socket path limit
    that pytest's long tmp_path names overflow."""
    path = tempfile.mkdtemp(prefix="rbl-", dir="/tmp" if os.path.isdir("/tmp") else None)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_workers_of_the_private_local_ray_quiet_the_placement_group_cleaner(short_tmp):
    """Without the hook Ray Train's PlacementGroupCleaner logs a warning every second of a local job (no
    dashboard, so no state API); in a worker of the local Ray its logger must sit at ERROR."""
    script = textwrap.dedent(f"""
        import logging, ray
        from rayemb._ray import init_ray
        init_ray()
        @ray.remote(num_cpus=0)
        def level():
            return logging.getLogger({LOCAL_RAY_NOISY_LOGGERS[0]!r}).getEffectiveLevel()
        print("LEVEL", ray.get(level.remote()))
        ray.shutdown()
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    for sub in ("home", "tmp", "ray"):
        (short_tmp / sub).mkdir()
    env.update(HOME=str(short_tmp / "home"), TMPDIR=str(short_tmp / "tmp"), RAY_TMPDIR=str(short_tmp / "ray"),
               PYTHONPATH=REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""))
    p = subprocess.run([sys.executable, "-c", script], env=env, cwd=short_tmp, capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("LEVEL ")]
    assert int(line.split()[1]) == logging.ERROR, p.stdout
