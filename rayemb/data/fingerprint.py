"""The fingerprint of a dataset split: when it matches, a saved ``stats.json`` is reused."""

from __future__ import annotations

import hashlib

from rayemb import storage
from rayemb.constants import SCHEMA_FILE, TRAIN_SPLIT
from rayemb.data.schema import parquet_files


def dataset_fingerprint(data_dir: str, split: str = TRAIN_SPLIT) -> str:
    """A short hash of ``schema.yaml`` and the split's parquet file names, sizes and mtimes.

    Cheap (one ``stat`` per file, no reads) and changes whenever a file is
    rewritten, so a training job can reuse a ``stats.json`` whose fingerprint
    matches instead of recomputing it.
    """
    h = hashlib.sha256()
    schema_path = storage.join(data_dir, SCHEMA_FILE)  # local paths and URIs (rayemb.storage) alike
    if storage.isfile(schema_path):
        h.update(storage.read_bytes(schema_path))
    h.update(split.encode())
    files = parquet_files(data_dir, split)
    for path, (size, mtime_ns) in zip(files, storage.sizes_and_mtimes_ns(files)):
        h.update(f"\0{storage.basename(path)}\0{size}\0{mtime_ns}".encode())
    return "sha256:" + h.hexdigest()[:32]


__all__ = ["dataset_fingerprint"]
