"""Where runs go: tracking URIs, the embedded sqlite store, and MLflow client defaults.

The one place that knows what a tracking URI looks like. An embedded store is
``sqlite:////abs/dir/mlflow.db`` (absolute, so every process opens the same
file whatever its working directory); anything else (``http://host:5000``) is
a server this module never touches.

Example::

    >>> sqlite_uri("/tmp/out/mlflow.db")
    'sqlite:////tmp/out/mlflow.db'
    >>> sqlite_path("sqlite:////tmp/out/mlflow.db?timeout=5")
    '/tmp/out/mlflow.db'
    >>> sqlite_path("http://mlflow.internal:5000") is None
    True
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from rayemb.constants import MLFLOW_DB_FILE, TRACKING_URI_ENV_VAR

SQLITE_URI_PREFIX = "sqlite:///"

# ---- MLFLOW CLIENT KNOBS (process-wide env vars; set only if the user has not) ---- #
#: one attempt per call: RunLogger retries with its own backoff, off the caller's thread
DEFAULT_MLFLOW_HTTP_MAX_RETRIES = 0
#: seconds one REST call may take before it counts as an outage (MLflow's default: 120)
DEFAULT_MLFLOW_HTTP_TIMEOUT_S = 10
CLIENT_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(DEFAULT_MLFLOW_HTTP_MAX_RETRIES),
    "MLFLOW_HTTP_REQUEST_TIMEOUT": str(DEFAULT_MLFLOW_HTTP_TIMEOUT_S),
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # MLflow prints "View run ... at: <tracking URI>" with any credentials in it; rayemb prints its own, redacted
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
#: folder (next to an embedded store's database) that holds its experiments' artifacts
ARTIFACTS_DIR = "mlartifacts"


def set_client_env_defaults() -> None:
    """Sets :data:`CLIENT_ENV_DEFAULTS` in this process, keeping any value the user set.

    They are process-wide environment variables that ``mlflow.utils.rest_utils``
    reads on every call, so they apply to every MLflow client of the process.
    """
    for name, value in CLIENT_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)


def sqlite_uri(db_path: str) -> str:
    """The absolute sqlite URI of a database file: ``/abs/mlflow.db`` -> ``sqlite:////abs/mlflow.db``."""
    return f"{SQLITE_URI_PREFIX}{os.path.abspath(db_path)}"


def sqlite_path(tracking_uri: str) -> Optional[str]:
    """The database file of a ``sqlite:///`` URI, or None for other stores and in-memory sqlite."""
    if not tracking_uri.startswith(SQLITE_URI_PREFIX):
        return None
    path = tracking_uri[len(SQLITE_URI_PREFIX):].split("?", 1)[0]
    return None if path in ("", ":memory:") else path


def default_tracking_uri(output_dir: str) -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else an absolute sqlite URI under ``output_dir``.

    The sqlite URI is absolute (``sqlite:////abs/dir/mlflow.db``) so that every
    process, whatever its working directory, opens the same database.
    """
    env = os.environ.get(TRACKING_URI_ENV_VAR)
    if env:
        return env
    return sqlite_uri(os.path.join(output_dir, MLFLOW_DB_FILE))


def ensure_store(tracking_uri: str) -> None:
    """Creates the sqlite database (and its folder) of ``tracking_uri``; no-op for servers.

    Call it once in the driver before anything else opens the store: MLflow
    creates the schema on first open, and several processes doing that at once
    race on the migrations and fail.
    """
    path = sqlite_path(tracking_uri)
    if path is None:
        return
    set_client_env_defaults()
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    from mlflow import MlflowClient

    MlflowClient(tracking_uri).search_experiments(max_results=1)


def artifact_location(tracking_uri: str, experiment: str) -> Optional[str]:
    """For sqlite stores, ``file://`` URI of ``experiment``'s artifacts next to the database; else None.

    MLflow's default for an embedded store is ``./mlruns`` of the working
    directory, which differs between processes; None keeps a server's default.
    """
    path = sqlite_path(tracking_uri)
    if path is None:
        return None
    slug = re.sub(r"[^\w.-]", "_", experiment) or "experiment"
    return (Path(path).resolve().parent / ARTIFACTS_DIR / slug).as_uri()
