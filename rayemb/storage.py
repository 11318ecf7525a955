"""Paths and URIs alike: local files, ``s3://``, ``gs://``, ``hdfs://`` and ``file://`` through ``pyarrow.fs``.

Every place rayemb accepts a path (``data.path``, ``data.stats_path``,
``tracking.output_dir``, ``--resume-from``, ``rayemb stats --out``,
``rayemb checkpoint --checkpoint``) goes through these helpers. A plain path
(or ``file://``) takes the same ``os`` calls as before; a URI opens the
filesystem :func:`pyarrow.fs.FileSystem.from_uri` gives for it, the same one
Ray Train and Ray Data use.

Credentials never come from a config value (configs are logged as MLflow
params): S3 reads ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION`` and ``AWS_ENDPOINT_URL`` (an
S3-compatible server such as MinIO; pyarrow honours it) or an instance role;
GCS reads ``GOOGLE_APPLICATION_CREDENTIALS`` or the VM's account; HDFS its
Hadoop configuration. Credentials written into a URI (``s3://KEY:SECRET@bucket``)
work, as in pyarrow, and are redacted wherever rayemb logs the URI
(:func:`rayemb.logs.redact_uri`).

Example::

    >>> from rayemb import storage
    >>> storage.join("s3://bucket/data", "train"), storage.is_remote("/data/synth")
    ('s3://bucket/data/train', False)
    >>> storage.write_text("s3://bucket/runs/note.txt", "hello")     # one PUT: readers see all or nothing
    >>> storage.list_files("s3://bucket/data/train", ".parquet")[:1]
    ['s3://bucket/data/train/part-00000.parquet']
    >>> with storage.local_copy("s3://bucket/runs/ckpt") as local:   # downloaded, removed after
    ...     os.listdir(local)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import unquote, urlsplit

from rayemb.errors import DataError
from rayemb.logs import redact_uri

#: schemes opened through pyarrow.fs (besides plain paths and file://)
REMOTE_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
#: schemes whose URI names a bucket (``scheme://bucket/key``); pyarrow's path is ``bucket/key``
_BUCKET_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss")
#: environment that changes what a filesystem connects to (part of the cache key; values are hashed)
_FS_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
           "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "GOOGLE_APPLICATION_CREDENTIALS")
_FIX = ("Check the path, and that this process and every Ray node can reach it: for S3, AWS_ACCESS_KEY_ID / "
        "AWS_SECRET_ACCESS_KEY (or an instance role), AWS_DEFAULT_REGION, and AWS_ENDPOINT_URL for an "
        "S3-compatible server; never put credentials in the job config (docs/storage.md).")

_fs_cache: Dict[Tuple[str, str], Any] = {}
_fs_lock = threading.Lock()


# ---- WHAT A PATH IS ---- #


def scheme(path: str) -> str:
    """The URI scheme in lower case (``"s3"``), or ``""`` for a plain path."""
    if "://" not in path:
        return ""
    return path.split("://", 1)[0].lower()


def is_remote(path: Any) -> bool:
    """True for URIs opened through pyarrow.fs (``s3://``...), False for plain paths and ``file://``."""
    return isinstance(path, str) and scheme(path) in REMOTE_SCHEMES


def check_supported(path: str, what: str) -> None:
    """Raises :class:`DataError` (``bad_config``) for a URI scheme rayemb cannot open."""
    s = scheme(path)
    if s and s != "file" and s not in REMOTE_SCHEMES:
        raise DataError(f"{what} {redact_uri(path)!r} has the scheme {s}://, which rayemb cannot open. Use a "
                        f"local path or one of {', '.join(f'{x}://' for x in ('file',) + REMOTE_SCHEMES)}.",
                        category="bad_config")


def _local(path: str) -> str:
    """A plain path for ``file://`` URIs, the path itself otherwise."""
    return unquote(urlsplit(path).path) if scheme(path) == "file" else path


def _split_query(uri: str) -> Tuple[str, str]:
    base, sep, query = uri.partition("?")
    return base, sep + query


def join(base: str, *parts: str) -> str:
    """``os.path.join`` for plain paths; ``/``-joined for URIs (a ``?query`` stays at the end)."""
    if not is_remote(base):
        return os.path.join(base, *parts)
    head, query = _split_query(base)
    for p in parts:
        head = head.rstrip("/") + "/" + p.strip("/")
    return head + query


def basename(path: str) -> str:
    return _split_query(path)[0].rstrip("/").rsplit("/", 1)[-1] if is_remote(path) else os.path.basename(path)


def dirname(path: str) -> str:
    if not is_remote(path):
        return os.path.dirname(path)
    head, query = _split_query(path)
    return head.rstrip("/").rsplit("/", 1)[0] + query


def abspath(path: str) -> str:
    """URIs unchanged; plain paths made absolute."""
    return path if "://" in path else os.path.abspath(path)


# ---- THE FILESYSTEM OF A URI ---- #


def filesystem(uri: str) -> Tuple[Any, str]:
    """``(pyarrow filesystem, path on it)`` of a URI, the filesystem cached per bucket/host and environment."""
    import pyarrow.fs as pafs

    parts = urlsplit(uri)
    env = hashlib.sha256("\0".join(os.environ.get(k, "") for k in _FS_ENV).encode()).hexdigest()
    key = (f"{parts.scheme.lower()}://{parts.netloc}?{parts.query}", env)
    with _fs_lock:
        fs = _fs_cache.get(key)
    if fs is None:
        try:
            fs, path = pafs.FileSystem.from_uri(uri)
        except Exception as e:  # noqa: BLE001 - pyarrow raises ValueError/OSError/ArrowInvalid
            raise _storage_error("open", uri, e) from None
        with _fs_lock:
            _fs_cache[key] = fs
        return fs, path
    return fs, _fs_path(uri)


def _fs_path(uri: str) -> str:
    """The path pyarrow's ``from_uri`` gives for ``uri`` (``bucket/key`` or ``/path``), without the call."""
    parts = urlsplit(uri)
    path = unquote(parts.path)
    if parts.scheme.lower() in _BUCKET_SCHEMES:
        host = parts.netloc.rsplit("@", 1)[-1]
        return (host + path).rstrip("/")
    return path.rstrip("/") or "/"


def uri(fs_path: str, like: str) -> str:
    """The URI of ``fs_path`` (a path on the filesystem of the URI ``like``), credentials in ``like`` left out."""
    parts = urlsplit(like)
    host = parts.netloc.rsplit("@", 1)[-1]
    if parts.scheme.lower() in _BUCKET_SCHEMES:
        return f"{parts.scheme}://{fs_path.lstrip('/')}"
    return f"{parts.scheme}://{host}/{fs_path.lstrip('/')}"


def _storage_error(verb: str, path: str, e: BaseException) -> DataError:
    from rayemb.logs import redact_text

    detail = redact_text(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)[:300]
    return DataError(f"Cannot {verb} {redact_uri(path)!r} ({type(e).__name__}: {detail}). {_FIX}",
                     category="storage")


def _info(path: str) -> Any:
    fs, p = filesystem(path)
    try:
        return fs.get_file_info(p)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _storage_error("read", path, e) from None


# ---- QUESTIONS ---- #


def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(_local(path))
    import pyarrow.fs as pafs

    return _info(path).type != pafs.FileType.NotFound


def isdir(path: str) -> bool:
    """A directory, or for object stores a prefix with at least one object under it."""
    if not is_remote(path):
        return os.path.isdir(_local(path))
    import pyarrow.fs as pafs

    return _info(path).type == pafs.FileType.Directory


def isfile(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(_local(path))
    import pyarrow.fs as pafs

    return _info(path).type == pafs.FileType.File


def size_and_mtime_ns(path: str) -> Tuple[int, int]:
    """(bytes, modification time in ns) of a file; object stores give the upload time."""
    if not is_remote(path):
        st = os.stat(_local(path))
        return st.st_size, st.st_mtime_ns
    info = _info(path)
    if info.size is None:
        raise FileNotFoundError(path)
    return int(info.size), int(info.mtime_ns or 0)


def sizes_and_mtimes_ns(paths: Sequence[str]) -> List[Tuple[int, int]]:
    """:func:`size_and_mtime_ns` of many files; remote ones are asked concurrently (one round trip each)."""
    paths = list(paths)
    if not paths or not is_remote(paths[0]):
        return [size_and_mtime_ns(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
        return list(pool.map(size_and_mtime_ns, paths))


def listdir(path: str) -> List[str]:
    """Names of the entries directly under ``path`` (files and directories), sorted; [] when there is none."""
    if not is_remote(path):
        local = _local(path)
        return sorted(os.listdir(local)) if os.path.isdir(local) else []
    import pyarrow.fs as pafs

    fs, p = filesystem(path)
    try:
        infos = fs.get_file_info(pafs.FileSelector(p, allow_not_found=True, recursive=False))
    except OSError as e:
        raise _storage_error("list", path, e) from None
    return sorted(i.base_name for i in infos)


def list_files(directory: str, suffix: str = "") -> List[str]:
    """Sorted paths (URIs for a URI) of the entries of ``directory`` whose name ends with ``suffix``."""
    if not is_remote(directory):
        return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(suffix)) \
            if os.path.isdir(_local(directory)) else []
    return sorted(join(directory, n) for n in listdir(directory) if n.endswith(suffix))


# ---- READING AND WRITING ---- #


def read_bytes(path: str) -> bytes:
    """A whole file, one version of it even while it is rewritten; FileNotFoundError when there is none.

    On S3 that takes one GET (:mod:`rayemb.s3_client`): pyarrow's reader asks the size first and then reads that
    many bytes, which cuts a version written in between at the older one's size."""
    if not is_remote(path):
        with open(_local(path), "rb") as f:
            return f.read()
    if scheme(path) == "s3":
        from rayemb.s3_client import s3_client

        client = s3_client(path)
        if client is not None:
            return _get_object(client, path)
    fs, p = filesystem(path)
    try:
        with fs.open_input_stream(p) as f:
            return f.read()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _storage_error("read", path, e) from None


def _get_object(client: Any, path: str) -> bytes:
    from botocore.exceptions import BotoCoreError, ClientError

    _, p = filesystem(path)
    bucket, _, key = p.partition("/")
    try:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as e:
        if str(e.response.get("Error", {}).get("Code", "")) in ("NoSuchKey", "404"):
            raise FileNotFoundError(redact_uri(path)) from None
        raise _storage_error("read", path, e) from None
    except BotoCoreError as e:
        raise _storage_error("read", path, e) from None


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def write_bytes(path: str, data: bytes) -> str:
    """Writes a whole file so that readers never see part of it; returns ``path``.

    Local and HDFS: a temp name in the same directory, then a rename. Object
    stores (S3, GCS): one upload, which becomes visible only when complete.
    """
    if not is_remote(path):
        local = _local(path)
        os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
        tmp = f"{local}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, local)
        return path
    fs, p = filesystem(path)
    try:
        if scheme(path) in _BUCKET_SCHEMES:
            with fs.open_output_stream(p) as f:
                f.write(data)
        else:
            fs.create_dir(p.rsplit("/", 1)[0], recursive=True)
            tmp = f"{p}.tmp{os.getpid()}"
            with fs.open_output_stream(tmp) as f:
                f.write(data)
            fs.move(tmp, p)
    except OSError as e:
        raise _storage_error("write", path, e) from None
    return path


def write_text(path: str, text: str) -> str:
    return write_bytes(path, text.encode("utf-8"))


def sha256(path: str) -> str:
    """Hex SHA-256 of a file, streamed (nothing is written locally)."""
    h = hashlib.sha256()
    if not is_remote(path):
        with open(_local(path), "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        return h.hexdigest()
    fs, p = filesystem(path)
    try:
        with fs.open_input_stream(p) as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    except OSError as e:
        raise _storage_error("read", path, e) from None
    return h.hexdigest()


def parquet_source(path: str) -> Tuple[str, Optional[Any]]:
    """``(path, filesystem)`` for pyarrow.parquet: ``pq.ParquetFile(p, filesystem=fs)``; plain paths as they are."""
    if not is_remote(path):
        return _local(path), None
    fs, p = filesystem(path)
    return p, fs


def for_ray_data(paths: Sequence[str]) -> Tuple[List[str], Optional[Any]]:
    """``(paths, filesystem)`` for ``ray.data.read_parquet(paths, filesystem=fs)``: plain paths unchanged."""
    paths = list(paths)
    if not paths or not is_remote(paths[0]):
        return [_local(p) for p in paths], None
    fs, _ = filesystem(paths[0])
    return [_fs_path(p) for p in paths], fs


# ---- WHOLE DIRECTORIES ---- #


def upload_dir(local_dir: str, dest: str) -> None:
    """Copies a local directory's tree to ``dest`` (a URI or a local path), files overwritten."""
    if not is_remote(dest):
        shutil.copytree(local_dir, _local(dest), dirs_exist_ok=True)
        return
    import pyarrow.fs as pafs

    fs, p = filesystem(dest)
    try:
        pafs.copy_files(os.path.abspath(local_dir), p, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=fs)
    except OSError as e:
        raise _storage_error("write", dest, e) from None


def download_dir(src: str, local_dir: str) -> str:
    """Copies the tree under ``src`` into ``local_dir`` (created); returns ``local_dir``."""
    os.makedirs(local_dir, exist_ok=True)
    if not is_remote(src):
        shutil.copytree(_local(src), local_dir, dirs_exist_ok=True)
        return local_dir
    import pyarrow.fs as pafs

    fs, p = filesystem(src)
    try:
        pafs.copy_files(p, local_dir, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _storage_error("download", src, e) from None
    return local_dir


@contextlib.contextmanager
def local_copy(path: str, prefix: str = "rayemb-") -> Iterator[str]:
    """A local directory with the contents of ``path``: itself when local, else a download removed on exit."""
    if not is_remote(path):
        yield _local(path)
        return
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        yield download_dir(path, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def upload_file(local_file: str, dest: str) -> str:
    """Copies one local file to ``dest`` (streamed; on object stores it appears only when complete)."""
    if not is_remote(dest):
        return _copy_local(local_file, _local(dest))
    fs, p = filesystem(dest)
    try:
        with open(local_file, "rb") as src, fs.open_output_stream(p) as out:
            for block in iter(lambda: src.read(1 << 22), b""):
                out.write(block)
    except OSError as e:
        raise _storage_error("write", dest, e) from None
    return dest


def _copy_local(src: str, dest: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    tmp = f"{dest}.tmp{os.getpid()}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)
    return dest


@contextlib.contextmanager
def local_output(path: str, prefix: str = "rayemb-out-") -> Iterator[str]:
    """A local file name to write ``path``'s content to; ``path`` appears only when the block ends without error.

    Local: a temp name next to it, renamed at the end. Remote: a temp file, uploaded at the end.
    """
    if not is_remote(path):
        local = _local(path)
        os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
        tmp = f"{local}.tmp{os.getpid()}"
        try:
            yield tmp
            os.replace(tmp, local)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        local = os.path.join(tmp, basename(path))
        yield local
        upload_file(local, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["REMOTE_SCHEMES", "abspath", "basename", "check_supported", "dirname", "download_dir", "exists",
           "filesystem", "for_ray_data", "is_remote", "isdir", "isfile", "join", "list_files", "listdir",
           "local_copy", "local_output", "parquet_source", "read_bytes", "read_text", "scheme", "sha256",
           "size_and_mtime_ns", "sizes_and_mtimes_ns", "upload_dir", "upload_file", "uri", "write_bytes", "write_text"]
