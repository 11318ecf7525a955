"""rayemb itself as a wheel, assembled from the copy this process imported, for a model that carries it.

The MLflow model's class lives in rayemb, and no package index serves rayemb,
so a pin ``rayemb==0.1.0`` would leave ``mlflow models serve`` (or any host
that builds the model's environment from its requirements) nothing to install.
The logged model carries this wheel instead and its requirements name it by a
path inside the model folder (:mod:`rayemb.serve.mlflow_model`).

The wheel is assembled from what is installed, not built from a source tree:
the files of the imported ``rayemb`` package (the ones that run here: an
editable install's source folder, or site-packages) and the installed
distribution's metadata (name, version, dependencies, entry points, as pip
recorded them at install time). That works the same from an editable checkout,
a wheel install in a container image, or a copy on ``PYTHONPATH`` (version
from :mod:`rayemb._version`, no dependencies listed), needs neither
setuptools nor the network, and gives the same bytes for the same files
(entries sorted, fixed timestamps). rayemb is pure Python, so the wheel is
``py3-none-any``.

Example::

    >>> build_wheel("/tmp/w")
    '/tmp/w/rayemb-0.1.0-py3-none-any.whl'
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import re
import zipfile
from typing import Dict, List, Optional, Tuple

#: the distribution and its top-level package
DIST_NAME = "rayemb"
#: rayemb has no compiled parts: one wheel for every Python and platform
TAG = "py3-none-any"
#: what the dist-info of an installed copy holds that is about the installation, not the package
_INSTALL_RECORDS = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "WHEEL"}
#: the zip timestamp of every entry (zip's earliest), so that equal files give an equal wheel
_EPOCH = (1980, 1, 1, 0, 0, 0)


def wheel_name(version: str) -> str:
    """The wheel's file name (PEP 427: ``-`` in a component becomes ``_``)."""
    return f"{DIST_NAME}-{version.replace('-', '_')}-{TAG}.whl"


def _package_files() -> List[Tuple[str, str]]:
    """(path in the wheel, file on disk) of every file of the imported package, bytecode left out."""
    import rayemb

    root = os.path.dirname(os.path.abspath(rayemb.__file__))
    out = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for n in sorted(names):
            if not n.endswith((".pyc", ".pyo")):
                path = os.path.join(d, n)
                out.append((f"{DIST_NAME}/" + os.path.relpath(path, root).replace(os.sep, "/"), path))
    return out


def _metadata() -> Tuple[str, Dict[str, bytes]]:
    """(version, dist-info file name -> bytes) of the installed distribution; a copy that is imported but not
    installed gets a minimal METADATA of its own version."""
    try:
        dist: Optional[importlib.metadata.Distribution] = importlib.metadata.distribution(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is None:
        from rayemb._version import __version__

        return __version__, {"METADATA": (f"Metadata-Version: 2.1\nName: {DIST_NAME}\n"
                                          f"Version: {__version__}\n").encode()}
    files = {}
    for entry in dist.files or []:
        parts = entry.parts
        if len(parts) >= 2 and parts[0].endswith(".dist-info") and parts[1] not in _INSTALL_RECORDS:
            files["/".join(parts[1:])] = entry.read_binary()
    if "METADATA" not in files:  # a distribution whose RECORD lists no metadata files
        files["METADATA"] = (dist.read_text("METADATA") or "").encode()
    for license_file in dist.metadata.get_all("License-File") or []:
        # Metadata 2.4 names its license files; an editable install keeps them in the project, not the dist-info
        if f"licenses/{license_file}" not in files:
            text = dist.read_text(f"licenses/{license_file}") or _project_file(dist, license_file)
            if text is not None:
                files[f"licenses/{license_file}"] = text.encode()
    return dist.version, files


def _project_file(dist: importlib.metadata.Distribution, name: str) -> Optional[str]:
    """``name`` in the project folder of an editable install (None: not one, or no such file)."""
    import json

    try:
        url = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return None
    if not (url.get("dir_info") or {}).get("editable") or not str(url.get("url", "")).startswith("file://"):
        return None
    path = os.path.join(url["url"][len("file://"):], name)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(directory: str) -> str:
    """Writes rayemb's wheel (:func:`wheel_name`) into ``directory`` (created); returns its path."""
    version, meta = _metadata()
    info_dir = f"{DIST_NAME}-{re.sub(r'[^A-Za-z0-9.+]', '_', version)}.dist-info"
    entries: List[Tuple[str, bytes]] = []
    for arcname, path in _package_files():
        with open(path, "rb") as f:
            entries.append((arcname, f.read()))
    meta["WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: rayemb.serve.own_wheel\nRoot-Is-Purelib: true\n"
                     f"Tag: {TAG}\n").encode()
    entries += [(f"{info_dir}/{name}", data) for name, data in sorted(meta.items())]
    record = "".join(_record_line(n, d) + "\n" for n, d in entries) + f"{info_dir}/RECORD,,\n"
    entries.append((f"{info_dir}/RECORD", record.encode()))
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, wheel_name(version))
    tmp = target + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            item = zipfile.ZipInfo(name, date_time=_EPOCH)
            item.external_attr = 0o644 << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(item, data)
    os.replace(tmp, target)
    return target


__all__ = ["DIST_NAME", "TAG", "build_wheel", "wheel_name"]
