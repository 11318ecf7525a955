"""Connecting to Ray the same way from every entry point."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

ADDRESS_ENV_VAR = "RAY_ADDRESS"
#: run in every worker process of the private local Ray (rayemb.logs.quiet_local_ray_worker)
LOCAL_WORKER_SETUP_HOOK = "rayemb.logs.quiet_local_ray_worker"


@contextlib.contextmanager
def env_default(name: str, value: str) -> Iterator[None]:
    """``$name`` set to ``value`` inside the block unless the user set it; as before after it. Ray Train and Tune
    read some settings only from the driver's environment, when ``fit()`` starts its controller."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def init_ray() -> None:
    """Joins the cluster named by ``$RAY_ADDRESS`` (set for drivers started by ``ray job submit``), else
    starts a private local Ray on 127.0.0.1.

    A bare ``ray.init()`` would instead try to join whatever cluster
    ``$RAY_TMPDIR/ray/ray_current_cluster`` (``RAY_TMPDIR`` defaults to ``TMPDIR``,
    then ``/tmp``) last recorded — a head that may be long gone, which makes
    ``ray.init()`` wait for a GCS that never answers. The private local Ray also
    keeps its session under ``$RAY_TMPDIR/ray``.

    To use a running cluster from a shell, set ``RAY_ADDRESS=host:port`` together
    with its token: Ray turns token auth on for an explicit address only with
    ``RAY_AUTH_MODE=token`` and reads the token from ``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``. For the head of
    ``cluster/local_head.sh``, ``eval "$(bash cluster/local_head.sh env)"`` sets all of it.
    """
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get(ADDRESS_ENV_VAR)
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        # no dashboard (CPU a 2-core box needs), so no state API: the setup hook quiets what polls it
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
                 logging_level=logging.WARNING, runtime_env={"worker_process_setup_hook": LOCAL_WORKER_SETUP_HOOK})
