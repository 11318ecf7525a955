"""Output directories that appear whole or not at all, the one way to find what to read, and versions kept
until no reader can still be on them.

Writing (:func:`publish_dir`): a finished local staging directory becomes the output at ``dest``.

* A URI (``s3://``, ``gs://``, ``hdfs://`` ...): object stores have no rename, and
  uploading file by file over an old output would let a reader see a mix. So the
  files go under a new version prefix, ``<dest>/_v/<UTC time>-<random>/``; then
  one small object, ``<dest>/_PUBLISHED.json``, names that version with its file
  list and sizes. It is written last, in one PUT, so a reader sees the previous
  version or the new one.
* The marker is a compare-and-swap. On S3 it is read with its ETag and written
  with ``If-Match`` (``If-None-Match: *`` when there was none): of two publishers
  that read the same marker one writes it, the other is refused, reads the
  winner's marker and commits on top of it. Just before each attempt the
  publisher checks that its own version is complete and not retired, so a
  marker never names a version that is gone (stores without conditional writes,
  and S3 without boto3, write the marker as is: one writer at a time there).
* Versions are never deleted at once. A marker lists what it replaced under
  ``retired`` with the time it stopped being named (the version it replaces, the
  files of an output written before versioning) and any version that no marker
  ever named and that started more than the grace period ago (a killed or lost
  write). Every later publish, and :func:`cleanup`, deletes the entries older
  than the grace period, only after a marker listing them is in place. A version
  once retired is never named again, so the version a marker names is never
  deleted, by anyone.
* The grace period (:func:`publish_grace_s`: ``$RAYEMB_PUBLISH_GRACE_S``, default
  7 days) bounds how long a job may go on reading a version after it was
  replaced: a training run resolves ``data.path`` once and reads those files
  every epoch. It is a grace period rather than reader leases because leases
  would need every reader (Ray Data tasks on every node, the MLflow pyfunc model
  in a serving process, tools other than rayemb) to write and renew an object
  while it reads, and a reader that dies leaves a lease that only a timeout
  clears: a grace period again, with a write per reader. Its cost is storage:
  a replaced dataset stays until the next publish or cleanup after the period.
* A local path (or ``file://``) is renamed into place: one rename, atomic;
  publishers into one directory take turns (``flock`` on it). With
  ``overwrite`` the old directory is moved aside and removed after. A local
  output has no versions: every tool reads it by its path, so no reader could
  stay on an old one, and keeping it would only cost disk. Replace a local
  dataset between jobs, or publish to a bucket when jobs read while it changes.
* :func:`write_file` (``rayemb schema infer --force``) changes one file of a
  published output by publishing a new version: the other files copied on the
  store, committed only if the marker still names the version copied.

Reading (:func:`resolve`): every reader of a published output (training's
``data.path``, ``rayemb export``'s dataset, ``rayemb predict``'s model and data,
the MLflow pyfunc model) asks it for the directory to read:

* a marker at the path: the version it names, after checking that every file it
  lists is there with its size;
* no marker, a remote output with the files of a complete one (``expect``): an
  output written before versioning, read as it is with a warning;
* a path inside ``_v/`` that no marker names (an interrupted or replaced write):
  refused, never read;
* a path under a published output (``s3://bucket/criteo/valid``): the same
  sub-path of the version its marker names.

Example::

    >>> publish_dir("/tmp/stage-x", "s3://bucket/criteo", overwrite=True)
    's3://bucket/criteo/_v/20260101T120000123456Z-9f3a1c2e'
    >>> resolve("s3://bucket/criteo/valid")
    's3://bucket/criteo/_v/20260101T120000123456Z-9f3a1c2e/valid'
    >>> cleanup("s3://bucket/criteo", grace_s=0)   # what the marker has retired, now
    ['_v/20251231T090000000000Z-11aa22bb']
"""

from __future__ import annotations

import calendar
import contextlib
import fcntl
import json
import logging
import math
import os
import random
import re
import secrets
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from rayemb import storage
from rayemb.s3_client import s3_client
from rayemb.constants import DEFAULT_PUBLISH_GRACE_S, PUBLISH_GRACE_ENV_VAR
from rayemb.errors import ConfigError, DataError
from rayemb.logs import redact_uri

logger = logging.getLogger(__name__)

#: the object that makes a version visible, written last
MARKER = "_PUBLISHED.json"
#: the folder under an output that holds its versions
VERSIONS_DIR = "_v"
FORMAT = "rayemb-published-v1"
#: concurrent uploads (or copies on the store) of one publish (each file is one streamed upload)
UPLOAD_THREADS = 8
#: levels walked up from a missing path to find the published output it lies in
_MAX_ANCESTORS = 8
#: tries at the marker before giving up: each refused one means another publisher's marker landed first
_COMMIT_TRIES = 20
_VERSION_NAME = re.compile(r"^[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}$")
_STAMP = "%Y-%m-%dT%H:%M:%SZ"
#: S3 error codes of a conditional PUT that lost to another writer (409: one still in flight)
_LOST_RACE = ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409", "404")
_warned: set = set()


def new_version() -> str:
    """``<UTC time to the microsecond>Z-<8 hex>``: names sort by start time, two writers never collide."""
    now = time.time()
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now % 1 * 1e6):06d}Z-{secrets.token_hex(4)}"


def publish_grace_s(value: Optional[float] = None) -> float:
    """Seconds a replaced version is kept after the marker stops naming it: ``value``, else
    ``$RAYEMB_PUBLISH_GRACE_S``, else 7 days. ``inf`` keeps every version; 0 deletes at the next publish."""
    where = f"grace_s={value!r}"
    if value is None:
        raw = os.environ.get(PUBLISH_GRACE_ENV_VAR, "").strip()
        if not raw:
            return float(DEFAULT_PUBLISH_GRACE_S)
        where = f"${PUBLISH_GRACE_ENV_VAR}={raw!r}"
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
    if not value >= 0:
        raise ConfigError(f"{where} is not a number of seconds >= 0. Set it to how long a job may go on reading an "
                          f"output after it is replaced (default {DEFAULT_PUBLISH_GRACE_S} s, 7 days), or unset it.",
                          category="bad_config")
    return float(value)


def _stamp(t: float) -> str:
    return time.strftime(_STAMP, time.gmtime(t))


def _epoch(stamp: Any) -> float:
    """Seconds since the epoch of a ``retired`` time; inf (never due) for one that is not a time."""
    try:
        return float(calendar.timegm(time.strptime(stamp, _STAMP)))
    except (TypeError, ValueError):
        return math.inf


def _started(name: str) -> Optional[float]:
    """When the write of version ``name`` started (its name says), None for a name rayemb did not make."""
    if not _VERSION_NAME.match(name):
        return None
    return calendar.timegm(time.strptime(name[:15], "%Y%m%dT%H%M%S")) + int(name[15:21]) / 1e6


# ---- WHAT IS THERE ---- #


def has_output(path: str) -> bool:
    """True when ``path`` holds an output (published, or written before versioning); versions that no marker
    names (an interrupted write) do not count."""
    return any(n != VERSIONS_DIR for n in storage.listdir(path))


def read_marker(path: str) -> Optional[Dict[str, Any]]:
    """The marker of the output at ``path``, or None when there is none; :class:`DataError` when unreadable."""
    where = storage.join(path, MARKER)
    try:
        raw = storage.read_text(where)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return _parse_marker(where, raw)


def _parse_marker(where: str, raw: str) -> Dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    version = doc.get("version", "") if isinstance(doc, dict) else ""
    parts = version.split("/") if isinstance(version, str) else []
    if (not isinstance(doc, dict) or doc.get("format") != FORMAT or len(parts) != 2 or parts[0] != VERSIONS_DIR
            or not _VERSION_NAME.match(parts[1]) or not isinstance(doc.get("files"), dict)
            or not isinstance(doc.get("retired", {}), dict)):
        raise DataError(f"{redact_uri(where)!r} is not a marker of format {FORMAT} naming a version under "
                        f"{VERSIONS_DIR}/. It was changed by hand or by another tool; rewrite the output (rerun the "
                        "command that made it, with --overwrite where it has one).", category="bad_output")
    return doc


def _sizes(root: str) -> Dict[str, int]:
    """Size of every file under ``root`` by its ``/``-separated path relative to ``root``."""
    if not storage.is_remote(root):
        out = {}
        local = storage.abspath(root[len("file://"):] if root.startswith("file://") else root)
        for dirpath, _, names in os.walk(local):
            for n in names:
                p = os.path.join(dirpath, n)
                out[os.path.relpath(p, local).replace(os.sep, "/")] = os.path.getsize(p)
        return out
    import pyarrow.fs as pafs

    fs, p = storage.filesystem(root)
    try:
        infos = fs.get_file_info(pafs.FileSelector(p, allow_not_found=True, recursive=True))
    except OSError as e:
        raise DataError(f"Cannot list {redact_uri(root)!r} ({type(e).__name__}). Check that this process can "
                        "reach the store (docs/storage.md).", category="storage") from None
    base = p.rstrip("/") + "/"
    return {i.path[len(base):]: int(i.size) for i in infos if i.type == pafs.FileType.File}


# ---- READING ---- #


def resolve(path: str, expect: Sequence[str] = ()) -> str:
    """The directory to read for the output at ``path`` (module docstring); ``path`` itself when it holds no
    published output, so a missing one is reported by the reader as before.

    ``expect``: top-level names a complete output of this kind has (``schema.yaml``; ``model.json``): a
    remote path without a marker that has them all is an output written before versioning (read, with a
    warning). A path that holds nothing but unpublished versions is refused (:class:`DataError`).
    """
    if not path:
        return path
    inside = _inside_version(path)
    if inside is not None:
        return _check_named(path, *inside)
    marker = read_marker(path)
    if marker is not None:
        return _checked_version(path, marker)
    names = storage.listdir(path)
    if not names and not storage.isfile(path):
        return _under_published(path)
    old = [n for n in names if n not in (VERSIONS_DIR, MARKER)]
    if VERSIONS_DIR in names and not old:
        raise DataError(f"{redact_uri(path)!r} holds only an unpublished version (a write that was interrupted "
                        f"before its {MARKER} was written): there is nothing complete to read. Rerun the command "
                        "that writes it.", category="unpublished_output")
    if storage.is_remote(path) and expect and all(n in old for n in expect) and path not in _warned:
        _warned.add(path)
        logger.warning("%s has no %s: an output written before versioned publishing, read as it is. Rewrite it "
                       "(rerun the command that made it, with --overwrite) so that later replacements are atomic.",
                       redact_uri(path), MARKER)
    return path


def resolve_dataset(path: str) -> str:
    """:func:`resolve` for a dataset directory (``data.path``): complete when it has ``schema.yaml``."""
    from rayemb.constants import SCHEMA_FILE

    return resolve(path, expect=(SCHEMA_FILE,))


def _inside_version(path: str) -> Optional[Tuple[str, str, str]]:
    """(output root, version name, rest) when ``path`` lies in ``<root>/_v/<version>/``; None otherwise."""
    head, sep, query = path.partition("?")
    comps = head.rstrip("/").split("/")
    start = 3 if "://" in head else 1  # never the scheme, the host or the bucket
    for i in range(start, len(comps) - 1):
        if comps[i] == VERSIONS_DIR:
            root = "/".join(comps[:i]) + (sep + query)
            return root, comps[i + 1], "/".join(comps[i + 2:])
    return None


def _check_named(path: str, root: str, version: str, rest: str) -> str:
    marker = read_marker(root)
    if marker is None or marker["version"] != f"{VERSIONS_DIR}/{version}":
        raise DataError(f"{redact_uri(path)!r} lies in version {version!r} of the output {redact_uri(root)!r}, which "
                        f"its {MARKER} does not name (an interrupted or replaced write): it is never read. Pass "
                        f"{redact_uri(root)!r} itself to read its published version.", category="unpublished_output")
    return storage.join(_checked_version(root, marker), rest) if rest else _checked_version(root, marker)


def _checked_version(root: str, marker: Dict[str, Any]) -> str:
    """The version directory ``marker`` names, after checking every file it lists is there with its size."""
    target = storage.join(root, marker["version"])
    have = _sizes(target)
    wrong = [n for n, size in sorted(marker["files"].items()) if have.get(n) != int(size)]
    if wrong:
        raise DataError(f"The output {redact_uri(root)!r} is damaged: {len(wrong)} file(s) its {MARKER} lists are "
                        f"missing or of another size in {marker['version']}/ (e.g. {wrong[:3]}); they were deleted or "
                        "changed after it was published. Rewrite the output (rerun the command that made it).",
                        category="bad_output")
    return target


def _under_published(path: str) -> str:
    """``path`` (which holds nothing) mapped into the published version of an output above it, if there is one."""
    head, sep, query = path.partition("?")
    comps = head.rstrip("/").split("/")
    stop = 3 if "://" in head else 1
    for i in range(len(comps) - 1, max(stop, len(comps) - _MAX_ANCESTORS) - 1, -1):
        root = "/".join(comps[:i]) + (sep + query)
        if not storage.is_remote(root) and not os.path.isdir(root):
            continue
        marker = read_marker(root)
        if marker is not None:
            return storage.join(_checked_version(root, marker), *comps[i:])
    return path



# ---- WRITING ---- #


def publish_dir(staging: str, dest: str, overwrite: bool = False, keep: bool = False,
                grace_s: Optional[float] = None) -> str:
    """Makes the finished local directory ``staging`` the output at ``dest`` (module docstring); returns the
    directory readers resolve to. ``staging`` is consumed (renamed into place, or removed after the upload)
    unless ``keep``: then it is copied, e.g. a dataset made locally and published to a bucket as well.
    ``grace_s``: how long what this publish replaces stays readable (:func:`publish_grace_s`)."""
    if not storage.is_remote(dest):
        if keep:
            local = dest[len("file://"):] if dest.startswith("file://") else dest
            os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=os.path.basename(local.rstrip(os.sep)) + ".partial-",
                                   dir=os.path.dirname(os.path.abspath(local)))
            staging = shutil.copytree(staging, os.path.join(tmp, "data"))
            try:
                return _publish_local(staging, dest, overwrite)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return _publish_local(staging, dest, overwrite)
    grace = publish_grace_s(grace_s)
    try:
        return _publish_remote(staging, dest, overwrite, grace)
    finally:
        if not keep:
            shutil.rmtree(staging, ignore_errors=True)


def publish_revision(dest: str, changes: Mapping[str, bytes], grace_s: Optional[float] = None) -> str:
    """A new version of the published output at ``dest``: the files of the version its marker names, copied on the
    store (S3: CopyObject, the bytes stay there), with ``changes`` (``/`` path in the output -> content) written
    over them or added. Committed only if the marker still names the version copied; the old version stays
    readable for the grace period like any replaced one. Returns the new version's directory."""
    grace = publish_grace_s(grace_s)
    current = read_marker(dest)
    if current is None:
        raise DataError(f"{redact_uri(dest)!r} has no {MARKER}: it is not a published output, so there is no version "
                        "to change. Write the file in place, or publish the output first.", category="bad_output")
    base = current["version"]
    source = _checked_version(dest, current)
    version = f"{VERSIONS_DIR}/{new_version()}"
    target = storage.join(dest, version)
    files = {rel: int(size) for rel, size in current["files"].items() if rel not in changes}
    try:
        _copy_on_store(source, target, sorted(files))
        for rel, data in sorted(changes.items()):
            storage.write_bytes(storage.join(target, rel), data)
            files[rel] = len(data)
        doc = _commit(dest, version, files, overwrite=True, grace=grace, base=base)
    except BaseException:
        _delete_unless_named(dest, version)
        raise
    _delete_due(dest, doc, grace)
    return target


def write_file(path: str, data: bytes, grace_s: Optional[float] = None) -> str:
    """Writes the file ``path`` whole (:func:`rayemb.storage.write_bytes`); returns where it now is. A path in or
    under a published output is never written into the version readers check against its marker: the output gets
    a new version with the file (:func:`publish_revision`), and the path in that version is returned."""
    where = _published_root(path)
    if where is None:
        return storage.write_bytes(path, data)
    root, rel = where
    return storage.join(publish_revision(root, {rel: data}, grace_s=grace_s), rel)


def cleanup(dest: str, grace_s: Optional[float] = None) -> List[str]:
    """Deletes what the output at ``dest`` has retired more than the grace period ago, and versions no marker ever
    named that started longer ago than that (killed writes); returns them (``_v/<name>``, or a name of an output
    written before versioning). Never the version the marker names; nothing without a marker (a first write may
    still be uploading) and nothing for a local path (it has no versions)."""
    grace = publish_grace_s(grace_s)
    if not storage.is_remote(dest):
        return []
    for attempt in range(_COMMIT_TRIES):
        current, tag = _marker_and_tag(dest)
        if current is None:
            return []
        doc = _next_marker(dest, current, None, {}, grace, time.time())
        if doc == current or write_marker(dest, doc, tag):
            return _delete_due(dest, doc, grace)
        _pause(attempt)
    raise _contended(dest)


def _publish_local(staging: str, dest: str, overwrite: bool) -> str:
    local = dest[len("file://"):] if dest.startswith("file://") else dest
    parent = os.path.dirname(os.path.abspath(local))
    os.makedirs(parent, exist_ok=True)
    old = None
    with _local_turn(parent):
        if os.path.isdir(local) and os.listdir(local):
            if not overwrite:
                raise DataError(f"{local!r} appeared while the output was being written; nothing was replaced. "
                                "Write to a new path.", category="output_exists")
            old = tempfile.mkdtemp(prefix=os.path.basename(local.rstrip(os.sep)) + ".old-", dir=parent)
            os.rename(local, os.path.join(old, "data"))
        os.replace(staging, local)
    if old:
        shutil.rmtree(old, ignore_errors=True)
    return dest


@contextlib.contextmanager
def _local_turn(directory: str) -> Iterator[None]:
    """Publishers into one local directory take turns: without it two overwrites of one path interleave their
    renames and one fails half done. ``flock`` on the directory itself, so no lock file is left behind."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _publish_remote(staging: str, dest: str, overwrite: bool, grace: float) -> str:
    version = f"{VERSIONS_DIR}/{new_version()}"
    target = storage.join(dest, version)
    files = _local_files(staging)
    try:
        _upload(staging, target, [rel for rel, _ in files])
        doc = _commit(dest, version, dict(files), overwrite, grace)
    except BaseException:
        _delete_unless_named(dest, version)  # an unmarked version is never read; removing it only saves space
        raise
    _delete_due(dest, doc, grace)
    return target


def _commit(dest: str, version: str, files: Dict[str, int], overwrite: bool, grace: float,
            base: Optional[str] = None) -> Dict[str, Any]:
    """Writes the marker naming ``version`` on top of the one there now (compare-and-swap, retried when another
    publisher's lands first); returns it. ``base``: the version the marker must still name (a revision of it)."""
    target = storage.join(dest, version)
    for attempt in range(_COMMIT_TRIES):
        current, tag = _marker_and_tag(dest)
        if current is not None and current["version"] == version:
            return current  # an earlier try landed though its answer was lost
        if current is not None and version in current.get("retired", {}):
            raise DataError(f"The upload to {redact_uri(target)!r} took longer than the grace period "
                            f"({grace:.0f} s) and another publish retired it as abandoned; nothing was published. "
                            f"Rerun it, or raise ${PUBLISH_GRACE_ENV_VAR}.", category="output_conflict")
        if base is not None and (current is None or current["version"] != base):
            raise DataError(f"{redact_uri(dest)!r} was replaced while this change to its version {base} was being "
                            "written; nothing was published. Rerun the command on the output as it is now.",
                            category="output_conflict")
        if not overwrite and has_output(dest):
            raise DataError(f"{redact_uri(dest)!r} holds an output written while this one was being uploaded; "
                            "nothing was replaced. Write to a new path.", category="output_exists")
        have = _sizes(target)
        wrong = [rel for rel, size in sorted(files.items()) if have.get(rel) != size]
        if wrong:
            raise DataError(f"The upload to {redact_uri(target)!r} lists {len(wrong)} file(s) missing or of another "
                            f"size after writing (e.g. {wrong[:3]}). Nothing was published; retry, and check that "
                            "nothing else writes or deletes there.", category="storage")
        doc = _next_marker(dest, current, version, files, grace, time.time())
        if write_marker(dest, doc, tag):
            return doc
        _pause(attempt)
    raise _contended(dest)


def _next_marker(dest: str, current: Optional[Dict[str, Any]], version: Optional[str], files: Dict[str, int],
                 grace: float, now: float) -> Dict[str, Any]:
    """The marker after ``current``: naming ``version`` (None: the same one, only ``retired`` brought up to date).

    ``retired`` keeps what is still stored, adds the version replaced and the files of an output written before
    versioning (stamped ``now``), and versions never named that started more than ``grace`` ago (stamped with
    their start: no reader ever read them)."""
    names = storage.listdir(dest)
    versions = storage.listdir(storage.join(dest, VERSIONS_DIR)) if VERSIONS_DIR in names else []
    present = {f"{VERSIONS_DIR}/{n}" for n in versions} | {n for n in names if n not in (VERSIONS_DIR, MARKER)}
    retired = {k: t for k, t in (current or {}).get("retired", {}).items() if k in present}
    named = current["version"] if current else None
    if version is not None:
        if named:
            retired.setdefault(named, _stamp(now))
        for n in names:
            if n not in (VERSIONS_DIR, MARKER):
                retired.setdefault(n, _stamp(now))
    keep = version or named
    for n in versions:
        key, started = f"{VERSIONS_DIR}/{n}", _started(n)
        if key not in retired and key not in (keep, named) and started is not None and started <= now - grace:
            retired[key] = _stamp(started)
    if version is None:
        return {**current, "retired": retired}
    return {"format": FORMAT, "version": version, "published_utc": _stamp(now), "files": dict(files),
            "bytes": sum(files.values()), "replaces": named, "retired": retired}


def _delete_due(dest: str, doc: Dict[str, Any], grace: float) -> List[str]:
    """After ``doc`` is the marker: deletes its ``retired`` entries older than ``grace`` (best effort: a failed
    delete costs space, and the next publish or cleanup tries again)."""
    due = sorted(k for k, t in doc.get("retired", {}).items()
                 if k != doc["version"] and _epoch(t) <= time.time() - grace)
    for rel in due:
        _delete_quietly(storage.join(dest, rel))
    if due:
        logger.info("%s: deleted %d retired entr%s older than %.0f s: %s", redact_uri(dest), len(due),
                    "y" if len(due) == 1 else "ies", grace, ", ".join(due[:5]))
    return due


def _pause(attempt: int) -> None:
    time.sleep(random.uniform(0.0, min(2.0, 0.05 * 2 ** attempt)))  # apart, so the losers do not collide again


def _contended(dest: str) -> DataError:
    return DataError(f"{redact_uri(dest)!r}: {_COMMIT_TRIES} tries at its {MARKER} each lost to another publisher's; "
                     "nothing was published. Rerun when fewer jobs write this output.", category="output_conflict")


def _delete_unless_named(dest: str, version: str) -> None:
    """Removes a version this process wrote and failed to publish, unless a marker names it after all (a write
    whose answer was lost): then it is the output, and stays."""
    try:
        marker = read_marker(dest)
    except DataError:
        return  # cannot tell: leave it, it costs space only
    if marker is None or marker["version"] != version:
        _delete_quietly(storage.join(dest, version))


def _published_root(path: str) -> Optional[Tuple[str, str]]:
    """(published output, ``/`` path in it) for a remote ``path`` in a version or under an output with a marker."""
    if not storage.is_remote(path):
        return None
    inside = _inside_version(path)
    if inside is not None:
        root, _, rest = inside
        return (root, rest) if rest else None
    head, sep, query = path.partition("?")
    comps = head.rstrip("/").split("/")
    for i in range(len(comps) - 1, max(3, len(comps) - _MAX_ANCESTORS) - 1, -1):  # never the scheme or host
        root = "/".join(comps[:i]) + (sep + query)
        if read_marker(root) is not None:
            return root, "/".join(comps[i:])
    return None


# ---- THE MARKER: READ WITH ITS TAG, WRITTEN IF UNCHANGED ---- #


def write_marker(dest: str, doc: Dict[str, Any], tag: Optional[str] = None) -> bool:
    """The commit point of a remote publish: one PUT of the marker (visible whole or not at all).

    Where the store has conditional writes (S3) it lands only if the marker is still the one read: ``tag`` is
    that one's ETag, None when there was none. False: another publisher's marker came first (read it again).
    Elsewhere the marker is written as it is and this returns True. Tests hold publishers here to order them."""
    body = json.dumps(doc, indent=1, sort_keys=True).encode("utf-8")
    where = storage.join(dest, MARKER)
    client = s3_client(dest)
    if client is None:
        storage.write_bytes(where, body)
        return True
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _bucket_key(where)
    condition = {"IfMatch": tag} if tag else {"IfNoneMatch": "*"}
    try:
        client.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json", **condition)
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code in _LOST_RACE:
            return False
        if code != "NotImplemented":
            raise _client_error("write", where, e) from None
        if where not in _warned:
            _warned.add(where)
            logger.warning("%s: the S3 server has no conditional writes; the marker is written as is, so run one "
                           "publisher of this output at a time", redact_uri(where))
        storage.write_bytes(where, body)
    except BotoCoreError as e:
        raise _client_error("write", where, e) from None
    return True


def _marker_and_tag(dest: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """The marker at ``dest`` (None when there is none) and the tag :func:`write_marker` is conditional on."""
    client = s3_client(dest)
    if client is None:
        return read_marker(dest), None
    from botocore.exceptions import BotoCoreError, ClientError

    where = storage.join(dest, MARKER)
    bucket, key = _bucket_key(where)
    try:
        answer = client.get_object(Bucket=bucket, Key=key)
        raw = answer["Body"].read().decode("utf-8")
    except ClientError as e:
        if str(e.response.get("Error", {}).get("Code", "")) in ("NoSuchKey", "404"):
            return None, None
        raise _client_error("read", where, e) from None
    except BotoCoreError as e:
        raise _client_error("read", where, e) from None
    return _parse_marker(where, raw), answer["ETag"]


def _bucket_key(uri: str) -> Tuple[str, str]:
    _, path = storage.filesystem(uri)
    bucket, _, key = path.partition("/")
    return bucket, key


def _client_error(verb: str, where: str, e: BaseException) -> DataError:
    from rayemb.logs import redact_text

    detail = redact_text(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)[:300]
    return DataError(f"Cannot {verb} {redact_uri(where)!r} ({type(e).__name__}: {detail}). Check that this process "
                     "can reach the store (docs/storage.md).", category="storage")


# ---- FILES ---- #


def _local_files(staging: str) -> List[Tuple[str, int]]:
    """(relative ``/`` path, bytes) of every file under ``staging``, largest first (they take longest)."""
    out = []
    for dirpath, _, names in os.walk(staging):
        for n in names:
            p = os.path.join(dirpath, n)
            out.append((os.path.relpath(p, staging).replace(os.sep, "/"), os.path.getsize(p)))
    return sorted(out, key=lambda f: (-f[1], f[0]))


def _upload(staging: str, target: str, rels: List[str]) -> None:
    def one(rel: str) -> None:
        storage.upload_file(os.path.join(staging, *rel.split("/")), storage.join(target, rel))

    _each(one, rels)


def _copy_on_store(source: str, target: str, rels: List[str]) -> None:
    """Copies files from one directory of a store to another; on the store itself where it can (S3 CopyObject),
    streamed through this process where it cannot (S3 refuses CopyObject over 5 GiB)."""
    fs, src = storage.filesystem(source)
    _, dst = storage.filesystem(target)

    def one(rel: str) -> None:
        a, b = f"{src}/{rel}", f"{dst}/{rel}"
        try:
            fs.copy_file(a, b)
            return
        except OSError:
            pass
        try:
            with fs.open_input_stream(a) as i, fs.open_output_stream(b) as o:
                for block in iter(lambda: i.read(1 << 22), b""):
                    o.write(block)
        except OSError as e:
            raise _client_error("copy", storage.join(source, rel), e) from None

    _each(one, rels)


def _each(fn: Callable[[str], None], rels: List[str]) -> None:
    if not rels:
        return
    with ThreadPoolExecutor(max_workers=min(UPLOAD_THREADS, len(rels))) as pool:
        for f in [pool.submit(fn, rel) for rel in rels]:
            f.result()


def _delete_quietly(uri: str) -> None:
    import pyarrow.fs as pafs

    try:
        fs, p = storage.filesystem(uri)
        info = fs.get_file_info(p)
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(p)
        elif info.type == pafs.FileType.File:
            fs.delete_file(p)
    except Exception as e:  # noqa: BLE001 - best effort: what is left is unreachable, it only costs space
        logger.warning("could not delete %s (%s); it is not read, only stored", redact_uri(uri), type(e).__name__)


__all__ = ["FORMAT", "MARKER", "VERSIONS_DIR", "cleanup", "has_output", "new_version", "publish_dir",
           "publish_grace_s", "publish_revision", "read_marker", "resolve", "resolve_dataset", "write_file",
           "write_marker"]
