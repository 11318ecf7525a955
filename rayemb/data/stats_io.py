"""``stats.json`` on disk: write it atomically, read it back, reuse it while the data is unchanged.

Paths may be URIs (``s3://bucket/stats.json``, :mod:`rayemb.storage`): an
object store shows a new object only once it is completely uploaded.

Example::

    >>> stats = load_or_compute_stats("/data/synth", "stats.json")   # reused when the fingerprint matches
    >>> write_stats_json(stats, "runs/job/stats.json")
    >>> write_stats_json(stats, "s3://bucket/stats/synth.json")
"""

from __future__ import annotations

import json
import logging
import os
from typing import Optional

from rayemb import storage
from rayemb.constants import TRAIN_SPLIT
from rayemb.data.fingerprint import dataset_fingerprint
from rayemb.data.schema import DatasetSchema
from rayemb.data.sketches import DEFAULT_NUM_HEAVY_HITTERS
from rayemb.data.stats import compute_stats
from rayemb.data.stats_types import STATS_SCHEMA_VERSION, DatasetStats
from rayemb.errors import DataError
from rayemb.logs import redact_uri

logger = logging.getLogger(__name__)


def write_stats_json(stats: DatasetStats, path: str) -> str:
    """Writes ``stats`` atomically (temp file + rename, or one upload), so readers never see half a file."""
    if storage.is_remote(path):
        return storage.write_text(path, json.dumps(stats.to_dict(), indent=1))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(stats.to_dict(), f, indent=1)
    os.replace(tmp, path)
    return path


def load_stats_json(path: str) -> DatasetStats:
    shown = redact_uri(path)
    try:
        if storage.is_remote(path):
            stats = json.loads(storage.read_text(path))
        else:
            with open(path) as f:
                stats = json.load(f)
    except FileNotFoundError:
        raise DataError(f"Stats file {shown!r} does not exist. Create it with "
                        f"`rayemb stats --data DIR --out {shown}`.") from None
    except json.JSONDecodeError as e:
        raise DataError(f"Stats file {shown!r} is not valid JSON ({e}). Recompute it with `rayemb stats`.") from None
    if not isinstance(stats, dict) or stats.get("schema_version") != STATS_SCHEMA_VERSION or "tables" not in stats:
        raise DataError(
            f"Stats file {shown!r} is not a stats.json of schema_version {STATS_SCHEMA_VERSION}. "
            "Recompute it with `rayemb stats --data DIR --out stats.json`."
        )
    return DatasetStats.from_dict(stats)


def check_stats_file(stats_path: Optional[str]) -> None:
    """Reads ``stats_path`` when it exists: a damaged file is an input error found before any work starts."""
    if stats_path and storage.isfile(stats_path):
        load_stats_json(stats_path)


def load_or_compute_stats(
    data_dir: str,
    stats_path: Optional[str] = None,
    *,
    split: str = TRAIN_SPLIT,
    exact: bool = False,
    num_heavy_hitters: int = DEFAULT_NUM_HEAVY_HITTERS,
    progress: bool = False,
    fingerprint: Optional[str] = None,
) -> DatasetStats:
    """Reuses ``stats_path`` when its fingerprint and split match ``data_dir``, else computes stats.

    ``fingerprint``: the split's :func:`~rayemb.data.fingerprint.dataset_fingerprint` where the caller has it
    (one listing and ``stat`` of every file, a request each on an object store), else taken here. A stale file (the data changed) is logged and recomputed, never silently used; so is one that counted
    a raw-id table's ids as an encoded table's (written before rayemb counted raw ids), and one without the
    moments of a ``standardize`` dense column (written before rayemb measured them).
    """
    if stats_path and storage.isfile(stats_path):
        stats = load_stats_json(stats_path)
        schema = DatasetSchema.load(data_dir)
        fingerprint = fingerprint or dataset_fingerprint(data_dir, split)
        if (stats.fingerprint == fingerprint and stats.split in (None, split)
                and stats.values is not None
                and {n for n, t in stats.tables.items() if t.ids == "raw"} == set(schema.raw_names)
                and all(c in stats.values.dense_moments for c in schema.standardized)):
            logger.info("reusing %s (fingerprint matches %s)", redact_uri(stats_path), redact_uri(data_dir))
            return stats
        logger.warning("%s was computed for other data than %s/%s (or by an older rayemb); recomputing",
                       redact_uri(stats_path), redact_uri(data_dir), split)
    return compute_stats(data_dir, exact=exact, split=split, num_heavy_hitters=num_heavy_hitters, progress=progress,
                         fingerprint=fingerprint)


#: where a job keeps the statistics of the data it trained on, under its ``tracking.output_dir``
KEPT_STATS_DIR = "stats"


def kept_stats_path(out_dir: str, data_dir: str, split: str = TRAIN_SPLIT, fingerprint: Optional[str] = None) -> str:
    """``<out_dir>/stats/<split>-<fingerprint>.json``: the statistics of ``data_dir``'s split as its files are now
    (:func:`~rayemb.data.fingerprint.dataset_fingerprint`: schema.yaml, file names, sizes and mtimes). A job
    writes it once its outputs start; the next job on the same files, whatever else it changes, reads it instead
    of a statistics pass (:func:`load_or_compute_stats` still checks it matches). ``fingerprint``: the split's,
    where the caller has it."""
    digest = (fingerprint or dataset_fingerprint(data_dir, split)).split(":", 1)[-1]
    return storage.join(out_dir, KEPT_STATS_DIR, f"{split}-{digest}.json")


def keep_stats(stats: DatasetStats, out_dir: str, data_dir: str, split: str = TRAIN_SPLIT) -> Optional[str]:
    """Writes ``stats`` to :func:`kept_stats_path` unless it is there (atomically); returns the path, or None
    where it could not be written (a job never fails for its cache: it says so). It is kept under the
    fingerprint of the files it counted (``stats.fingerprint``), taken when the pass started."""
    path = kept_stats_path(out_dir, data_dir, split, fingerprint=stats.fingerprint)
    try:
        if not storage.isfile(path):
            write_stats_json(stats, path)
        return path
    except OSError as e:
        logger.warning("could not keep the statistics at %s (%s); the next job computes them again",
                       redact_uri(path), e)
        return None


__all__ = ["write_stats_json", "load_stats_json", "check_stats_file", "load_or_compute_stats", "kept_stats_path",
           "keep_stats", "KEPT_STATS_DIR"]
