"""Where a job's files go when ``tracking.output_dir`` is a local path or a URI, and how Ray reads its data.

A local ``output_dir`` holds everything, as it always has::

    <out>/jobs/<job>/                  plan.json, stats.json, split.json, charts
    <out>/ray_results/<job>/checkpoint_*    Ray Train's storage (checkpoints)
    <out>/mlflow.db, mlartifacts/, mlflow-spill/    the default embedded MLflow store

A remote one (``s3://bucket/runs``; :mod:`rayemb.storage`) holds the job's
files and checkpoints; MLflow stays local, because sqlite cannot live on an
object store and the driver is its only writer::

    s3://bucket/runs/jobs/<job>/       uploaded from the local copies after planning and at the end
    s3://bucket/runs/ray_results/<job>/checkpoint_*    uploaded by Ray Train through pyarrow.fs
    <local>/jobs/<job>/                the local copies the MLflow run logs from
    <local>/mlflow.db, mlartifacts/, mlflow-spill/    unless tracking.tracking_uri / $MLFLOW_TRACKING_URI says otherwise

where ``<local>`` is ``runs`` resolved like a relative config path
(``$RAYEMB_WORKSPACE/runs``, else ``./runs``); the job prints one line saying so.

Example::

    >>> outputs = JobOutputs("s3://bucket/runs", "/work/runs", "synth-20260101-000000-42")
    >>> outputs.checkpoint_root
    's3://bucket/runs/ray_results/synth-20260101-000000-42'
    >>> outputs.job_dir, outputs.remote_job_dir
    ('/work/runs/jobs/synth-20260101-000000-42', 's3://bucket/runs/jobs/synth-20260101-000000-42')
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional

from rayemb import storage
from rayemb.config import resolve_path
from rayemb.constants import SMALL_SPLIT_MAX_ROWS, TRACKING_URI_ENV_VAR
from rayemb.errors import DataError
from rayemb.logs import redact_uri

logger = logging.getLogger(__name__)

#: the local side of a remote tracking.output_dir, resolved like a relative config path
LOCAL_OUTPUT_DIR = "runs"
RAY_RESULTS_DIR = "ray_results"
JOBS_DIR = "jobs"


def local_output_dir(out_dir: str) -> str:
    """``out_dir`` itself when local; for a URI, the local folder that holds the MLflow store and local copies."""
    return resolve_path(LOCAL_OUTPUT_DIR) if storage.is_remote(out_dir) else out_dir


def check_output_dir(out_dir: str) -> None:
    """A remote ``tracking.output_dir`` must name a scheme rayemb opens and a bucket that exists (before any work)."""
    storage.check_supported(out_dir, "tracking.output_dir")
    if not storage.is_remote(out_dir):
        return
    parts = out_dir.split("://", 1)
    root = f"{parts[0]}://{parts[1].split('/', 1)[0].split('?', 1)[0]}"
    if storage.scheme(out_dir) in ("s3", "gs", "gcs") and not storage.isdir(root):
        raise DataError(f"tracking.output_dir {redact_uri(out_dir)!r}: the bucket {redact_uri(root)!r} does not exist "
                        "or cannot be listed with this process's credentials. Create the bucket, or check "
                        "AWS_ENDPOINT_URL / the credentials in the environment (docs/storage.md).",
                        category="storage")


def tracking_uri(configured: Optional[str], out_dir: str) -> str:
    """``tracking.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else sqlite in :func:`local_output_dir`."""
    from rayemb.tracking import default_tracking_uri

    uri = configured or default_tracking_uri(local_output_dir(out_dir))
    if storage.is_remote(out_dir) and not configured and not os.environ.get(TRACKING_URI_ENV_VAR):
        print(f"rayemb: tracking.output_dir is remote ({redact_uri(out_dir)}); the MLflow store stays local: {uri} "
              "(set tracking.tracking_uri or $MLFLOW_TRACKING_URI to use another)", flush=True)
    return uri


@dataclass(frozen=True)
class JobOutputs:
    """The places of one job's outputs (see the module doc)."""

    #: tracking.output_dir resolved: an absolute path or a URI
    out_dir: str
    #: local folder: ``out_dir`` itself, or the local side of a remote one
    local_dir: str
    job_id: str

    @classmethod
    def of(cls, out_dir: str, job_id: str) -> "JobOutputs":
        return cls(out_dir, local_output_dir(out_dir), job_id)

    @property
    def remote(self) -> bool:
        return storage.is_remote(self.out_dir)

    @property
    def job_dir(self) -> str:
        """This job's local copies of what it logs (plan.json, stats.json, charts)."""
        return os.path.join(self.local_dir, JOBS_DIR, self.job_id)

    @property
    def remote_job_dir(self) -> Optional[str]:
        return storage.join(self.out_dir, JOBS_DIR, self.job_id) if self.remote else None

    @property
    def ray_storage(self) -> str:
        return storage.join(self.out_dir, RAY_RESULTS_DIR)

    @property
    def checkpoint_root(self) -> str:
        """Where Ray Train puts this job's checkpoints (its storage path / run name)."""
        return storage.join(self.ray_storage, self.job_id)

    @property
    def spill_dir(self) -> str:
        return os.path.join(self.local_dir, "mlflow-spill")

    def run_config_storage(self) -> Dict[str, Any]:
        """``storage_path`` (and ``storage_filesystem`` for a URI) of Ray Train's ``RunConfig``.

        A URI is handed to Ray as its pyarrow filesystem and a plain path, so Ray never sees
        (nor logs) credentials written into the URI.
        """
        if not self.remote:
            return {"storage_path": self.ray_storage}
        fs, path = storage.filesystem(self.ray_storage)
        return {"storage_path": path, "storage_filesystem": fs}

    def checkpoint_uri(self, path: Optional[str]) -> Optional[str]:
        """A Ray checkpoint's path as the user names it: local paths unchanged, remote ones as URIs."""
        if path is None or not self.remote:
            return path
        root = storage.filesystem(self.ray_storage)[1].rstrip("/")
        return storage.join(self.ray_storage, path[len(root) + 1:]) if path.startswith(root + "/") else path

    def publish(self, final: bool = False) -> None:
        """Uploads the local job folder to the remote one (no-op when local).

        Before training a failure is an error (the outputs would be missing); at the end a warning.
        """
        if not self.remote:
            return
        try:
            storage.upload_dir(self.job_dir, self.remote_job_dir)
        except DataError as e:
            if not final:
                raise
            logger.warning("could not upload %s to %s: %s", self.job_dir, redact_uri(self.remote_job_dir), e)
            print(f"rayemb: WARNING: job files not uploaded to {redact_uri(self.remote_job_dir)}: {e}", flush=True)


def read_splits(train_files: Any, valid_files: Any, rows: Optional[Dict[str, int]] = None,
                in_memory: bool = False) -> Dict[str, Any]:
    """Both splits of the parquet files, remote files through their pyarrow filesystem.

    ``rows``: split -> its row count; a split of at most :data:`~rayemb.constants.SMALL_SPLIT_MAX_ROWS` rows is
    read by this process into the object store (a :class:`~rayemb.train.held_splits.HeldSplit` that each rank
    slices). A larger one is, when the ranks keep their shards in memory (``in_memory``), a
    :class:`~rayemb.train.held_splits.FileSplit` that each rank reads its rows of, else (or when its size is
    unknown) a Ray Dataset read by Ray Data's read tasks as the ranks train.
    """
    import ray

    from rayemb.train.held_splits import FileSplit, HeldSplit

    out = {}
    for name, files in (("train", train_files), ("valid", valid_files)):
        paths, fs = storage.for_ray_data(files)
        size = None if rows is None else rows.get(name)
        if size is not None and size <= SMALL_SPLIT_MAX_ROWS:
            import pyarrow as pa
            import pyarrow.parquet as pq

            out[name] = HeldSplit.put(pa.concat_tables([pq.read_table(p, filesystem=fs) for p in paths]))
        elif size is not None and in_memory:
            out[name] = FileSplit.of(paths, fs)
        else:
            out[name] = ray.data.read_parquet(paths, filesystem=fs) if fs is not None else ray.data.read_parquet(paths)
    return out


__all__ = ["JobOutputs", "LOCAL_OUTPUT_DIR", "check_output_dir", "local_output_dir", "read_splits", "tracking_uri"]
