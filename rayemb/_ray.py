"""Connecting to Ray the same way from every entry point."""

from __future__ import annotations

import logging
import os

ADDRESS_ENV_VAR = "RAY_ADDRESS"


def init_ray() -> None:
    """Joins the cluster named by ``$RAY_ADDRESS`` (set for drivers started by ``ray job submit``), else
    starts a private local Ray on 127.0.0.1.

    A bare ``ray.init()`` would instead try to join whatever cluster
    ``/tmp/ray/ray_current_cluster`` last recorded — a head that may be long
    gone, which makes ``ray.init()`` wait for a GCS that never answers. Set
    ``RAY_ADDRESS=auto`` (or ``host:port``) to use a running cluster from a shell.
    """
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get(ADDRESS_ENV_VAR)
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
                 logging_level=logging.WARNING)
