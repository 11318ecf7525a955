"""Output directories that appear whole or not at all, and the one way to find what to read.

Writing (:func:`publish_dir`): a finished local staging directory becomes the output at ``dest``.

* A local path (or ``file://``) is renamed into place: one rename, atomic. With
  ``overwrite`` the old directory is moved aside first and removed after.
* A URI (``s3://``, ``gs://``, ``hdfs://`` ...): object stores have no rename, and
  uploading file by file over an old output would let a reader see a mix. So the
  files go under a new version prefix, ``<dest>/_v/<UTC time>-<random>/``; the
  upload is listed back and checked against the local sizes; then one small object,
  ``<dest>/_PUBLISHED.json``, names that version with its file list and sizes. It
  is written last, in one PUT, so a reader sees the previous version or the new
  one. Only after it are the other versions and the files of an output written
  before versioning deleted (best effort: a failed delete costs space, not
  correctness).

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
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rayemb import storage
from rayemb.errors import DataError
from rayemb.logs import redact_uri

logger = logging.getLogger(__name__)

#: the object that makes a version visible, written last
MARKER = "_PUBLISHED.json"
#: the folder under an output that holds its versions
VERSIONS_DIR = "_v"
FORMAT = "rayemb-published-v1"
#: concurrent uploads of one publish (each file is one streamed upload)
UPLOAD_THREADS = 8
#: levels walked up from a missing path to find the published output it lies in
_MAX_ANCESTORS = 8
_VERSION_NAME = re.compile(r"^[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}$")
_warned: set = set()


def new_version() -> str:
    """``<UTC time to the microsecond>Z-<8 hex>``: names sort by start time, two writers never collide."""
    now = time.time()
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now % 1 * 1e6):06d}Z-{secrets.token_hex(4)}"


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
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    version = doc.get("version", "") if isinstance(doc, dict) else ""
    parts = version.split("/") if isinstance(version, str) else []
    if (not isinstance(doc, dict) or doc.get("format") != FORMAT or len(parts) != 2 or parts[0] != VERSIONS_DIR
            or not _VERSION_NAME.match(parts[1]) or not isinstance(doc.get("files"), dict)):
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


def publish_dir(staging: str, dest: str, overwrite: bool = False, keep: bool = False) -> str:
    """Makes the finished local directory ``staging`` the output at ``dest`` (module docstring); returns the
    directory readers resolve to. ``staging`` is consumed (renamed into place, or removed after the upload)
    unless ``keep``: then it is copied, e.g. a dataset made locally and published to a bucket as well."""
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
    try:
        return _publish_remote(staging, dest, overwrite)
    finally:
        if not keep:
            shutil.rmtree(staging, ignore_errors=True)


def _publish_local(staging: str, dest: str, overwrite: bool) -> str:
    local = dest[len("file://"):] if dest.startswith("file://") else dest
    old = None
    if os.path.isdir(local) and os.listdir(local):
        if not overwrite:
            raise DataError(f"{local!r} appeared while the output was being written; nothing was replaced. Write "
                            "to a new path.", category="output_exists")
        old = tempfile.mkdtemp(prefix=os.path.basename(local.rstrip(os.sep)) + ".old-", dir=os.path.dirname(local))
        os.rename(local, os.path.join(old, "data"))
    os.replace(staging, local)
    if old:
        shutil.rmtree(old, ignore_errors=True)
    return dest


def _publish_remote(staging: str, dest: str, overwrite: bool) -> str:
    previous = read_marker(dest)
    version = f"{VERSIONS_DIR}/{new_version()}"
    target = storage.join(dest, version)
    files = _local_files(staging)
    try:
        _upload(staging, target, [rel for rel, _ in files])
        have = _sizes(target)
        wrong = [rel for rel, size in files if have.get(rel) != size]
        if wrong:
            raise DataError(f"The upload to {redact_uri(target)!r} lists {len(wrong)} file(s) missing or of another "
                            f"size after writing (e.g. {wrong[:3]}). Nothing was published; retry, and check that "
                            "nothing else writes there.", category="storage")
    except BaseException:
        _delete_quietly(target)  # an unmarked version is never read; removing it only saves space
        raise
    if not overwrite and has_output(dest):
        _delete_quietly(target)
        raise DataError(f"{redact_uri(dest)!r} holds an output written while this one was being uploaded; nothing was "
                        "replaced. Write to a new path.", category="output_exists")
    doc = {"format": FORMAT, "version": version, "published_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "files": dict(files), "bytes": sum(size for _, size in files),
           "replaces": previous["version"] if previous else None}
    write_marker(dest, doc)
    _remove_others(dest, version)
    return target


def write_marker(dest: str, doc: Dict[str, Any]) -> None:
    """The commit point of a remote publish: one PUT of the marker (visible whole or not at all)."""
    storage.write_text(storage.join(dest, MARKER), json.dumps(doc, indent=1, sort_keys=True))


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

    if not rels:
        return
    with ThreadPoolExecutor(max_workers=min(UPLOAD_THREADS, len(rels))) as pool:
        for f in [pool.submit(one, rel) for rel in rels]:
            f.result()


def _remove_others(dest: str, version: str) -> None:
    """After the marker: every other version, and any file of an output written before versioning."""
    keep = version.split("/", 1)[1]
    try:
        others = [storage.join(dest, VERSIONS_DIR, n) for n in storage.listdir(storage.join(dest, VERSIONS_DIR))
                  if n != keep]
        others += [storage.join(dest, n) for n in storage.listdir(dest) if n not in (VERSIONS_DIR, MARKER)]
    except DataError as e:  # published already: what is not deleted is not read either
        logger.warning("could not list %s to delete what the new version replaces (%s)", redact_uri(dest),
                       e.category)
        return
    for uri in others:
        _delete_quietly(uri)


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


__all__ = ["FORMAT", "MARKER", "VERSIONS_DIR", "has_output", "new_version", "publish_dir", "read_marker", "resolve",
           "resolve_dataset", "write_marker"]
