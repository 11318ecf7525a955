"""Run tag names, and the tags every rayemb run carries (version, git commit, libraries, host).

Example::

    >>> tags = standard_tags()
    >>> tags[TAG_VERSION], tags[TAG_GIT_COMMIT][:8]
    ('0.1.0', '3f2a9c1d')
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from typing import Dict, List, Optional

# ---- TAG NAMES ---- #
TAG_GIT_COMMIT = "rayemb.git_commit"
TAG_GIT_DIRTY = "rayemb.git_dirty"
TAG_VERSION = "rayemb.version"
TAG_CLUSTER_SHAPE = "rayemb.cluster_shape"
TAG_PLAN_FINGERPRINT = "rayemb.plan_fingerprint"
TAG_FAILURE_REASON = "rayemb.failure_reason"
#: what a run is: "train" (default), "sweep" (a sweep's parent) or "comparison" (from `rayemb compare`)
TAG_KIND = "rayemb.kind"
TAG_PARENT_RUN_ID = "mlflow.parentRunId"
TAG_RUN_NAME = "mlflow.runName"
#: a sweep's trial runs: the Tune trial id, and why the scheduler stopped one early (the run then ends KILLED)
TAG_TRIAL_ID = "rayemb.sweep.trial_id"
TAG_STOPPED_REASON = "rayemb.stopped_reason"
#: a sweep's parent run: its best trial's run id
TAG_BEST_RUN_ID = "rayemb.sweep.best_run_id"
#: a sweep's parent run params: the swept config keys (comma-separated), the metric and its direction
PARAM_SWEEP_KEYS = "sweep.keys"
PARAM_SWEEP_METRIC = "sweep.metric"
PARAM_SWEEP_MODE = "sweep.mode"
SWEEP_MODES = ("max", "min")

#: distributions whose versions are tagged ``rayemb.lib.<name>`` when installed
TAGGED_LIBRARIES = ("torch", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu", "ray", "mlflow")
#: seconds one ``git`` call may take before the commit counts as unknown
GIT_TIMEOUT_S = 5
UNKNOWN = "unknown"


def _git(args: List[str], cwd: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def standard_tags() -> Dict[str, str]:
    """Tags every rayemb run carries: code version, git commit, library versions, host.

    The git commit is the one of the checkout rayemb is imported from (else of
    the working directory), ``"unknown"`` outside a git repository. MLflow's own
    ``mlflow.source.git.commit`` is set too, so the UI shows it.
    """
    import importlib.metadata as md

    from rayemb import _version

    tags: Dict[str, str] = {TAG_VERSION: _version.__version__}
    commit, dirty = None, None
    for cwd in (os.path.dirname(os.path.abspath(_version.__file__)), os.getcwd()):
        commit = _git(["rev-parse", "HEAD"], cwd)
        if commit:
            status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
            dirty = None if status is None else str(bool(status)).lower()
            break
    tags[TAG_GIT_COMMIT] = commit or UNKNOWN
    tags[TAG_GIT_DIRTY] = dirty or UNKNOWN
    if commit:
        tags["mlflow.source.git.commit"] = commit
    for dist in TAGGED_LIBRARIES:
        try:
            tags[f"rayemb.lib.{dist}"] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    tags["rayemb.python"] = sys.version.split()[0]
    try:
        tags["mlflow.user"] = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        pass
    tags["mlflow.source.name"] = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return tags
