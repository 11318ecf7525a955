"""The fingerprint of a dataset split: when it matches, a saved ``stats.json`` is reused."""

from __future__ import annotations

import hashlib
import os

from rayemb.constants import SCHEMA_FILE, TRAIN_SPLIT
from rayemb.data.schema import parquet_files


def dataset_fingerprint(data_dir: str, split: str = TRAIN_SPLIT) -> str:
    """A short hash of ``schema.yaml`` and the split's parquet file names, sizes and mtimes.

    Cheap (one ``stat`` per file, no reads) and changes whenever a file is
    rewritten, so a training job can reuse a ``stats.json`` whose fingerprint
    matches instead of recomputing it.
    """
    h = hashlib.sha256()
    schema_path = os.path.join(data_dir, SCHEMA_FILE)
    if os.path.isfile(schema_path):
        with open(schema_path, "rb") as f:
            h.update(f.read())
    h.update(split.encode())
    for path in parquet_files(data_dir, split):
        st = os.stat(path)
        h.update(f"\0{os.path.basename(path)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return "sha256:" + h.hexdigest()[:32]


__all__ = ["dataset_fingerprint"]
