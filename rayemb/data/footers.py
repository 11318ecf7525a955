"""Parquet footers: a file's metadata and column schema read without its data pages, local or remote.

The schema checks (:func:`rayemb.data.schema.check_parquet_columns`), row counts and ``rayemb schema infer``
read only footers, so a dataset of any size is checked cheaply before any work starts; a file whose footer
cannot be read is corrupt or truncated and fails here, named (:func:`corrupt_file_error`).
"""

from __future__ import annotations

from typing import Any, Callable, List

from rayemb import storage
from rayemb.errors import DataError
from rayemb.logs import redact_uri


def corrupt_file_error(path: str, e: BaseException) -> DataError:
    """The DataError (category ``corrupt_file``) for a parquet file that pyarrow cannot read, ``e`` its error."""
    return DataError(
        f"Parquet file {redact_uri(path)!r} cannot be read ({type(e).__name__}: {str(e).strip()[:200]}). It is "
        "corrupt or truncated: rewrite it (e.g. rerun the conversion that made it) or remove it from the dataset.",
        category="corrupt_file",
    )


def read_footer(path: str) -> Any:
    """The parquet footer (``FileMetaData``) of a local or remote file; corrupt files raise DataError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where, fs = storage.parquet_source(path)
    try:
        return pq.read_metadata(where, filesystem=fs)
    except (pa.ArrowException, OSError) as e:
        raise corrupt_file_error(path, e) from None


def read_footer_schema(path: str) -> Any:
    """The arrow schema of a local or remote parquet file from its footer; corrupt files raise DataError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if storage.is_remote(path):
        try:
            return read_footer(path).schema.to_arrow_schema()
        except pa.ArrowException as e:
            raise corrupt_file_error(path, e) from None
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as e:
        raise corrupt_file_error(path, e) from None


def read_footers(paths: List[str], read: Callable[[str], Any]) -> List[Any]:
    """``read`` of every path: in order, and concurrently for remote files (one round trip each)."""
    if not paths or not storage.is_remote(paths[0]):
        return [read(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
        return list(pool.map(read, paths))
