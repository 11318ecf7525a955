"""Packaging: pyproject.toml declares what rayemb/ imports, its pins agree with the
lock (requirements/lock-cpu.txt), and a clean venv installs from the lock and runs.

torchrec is the documented exception: it is installed with ``pip install --no-deps``
(its metadata demands the CUDA fbgemm-gpu, which clashes with fbgemm-gpu-cpu), so
it is named in ``[tool.rayemb] install-no-deps`` instead of ``dependencies``, and
the fbgemm build comes from the ``cpu``/``gpu`` extra.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"
LOCK = REPO / "requirements" / "lock-cpu.txt"
PACKAGE = "rayemb"
# Extras that provide runtime code (the fbgemm build); `test` is not one of them.
RUNTIME_EXTRAS = ("cpu", "gpu")
CLI_COMMANDS = ("gen-data", "stats", "plan", "train", "compare")


def _pyproject() -> dict:
    with open(PYPROJECT, "rb") as f:
        return tomllib.load(f)


def _requirements(section: str = "all") -> List[Tuple[str, Requirement]]:
    """(where, requirement) for dependencies, every extra and [tool.rayemb] install-no-deps."""
    d = _pyproject()
    out = [("dependencies", Requirement(r)) for r in d["project"]["dependencies"]]
    for extra, reqs in d["project"].get("optional-dependencies", {}).items():
        out += [(f"extra {extra}", Requirement(r)) for r in reqs]
    out += [("install-no-deps", Requirement(r)) for r in d["tool"]["rayemb"]["install-no-deps"]]
    return out


def _lock() -> Dict[str, str]:
    pins: Dict[str, str] = {}
    for n, line in enumerate(LOCK.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line)
        assert m, f"{LOCK.name}:{n}: not an exact `name==version` pin: {line!r}"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"{LOCK.name}:{n}: {name} pinned twice"
        pins[name] = m.group(2)
    return pins


def _imports(tree: ast.AST) -> Iterable[Tuple[str, int, bool]]:
    """(top-level module, line, optional) for every absolute import in a module.

    An import is optional when it sits in a ``try:`` body whose handlers catch
    ImportError (the code runs without it, e.g. psutil). ``importlib.import_module``
    calls with a literal name count as imports.
    """

    def catches_import_error(node: ast.Try) -> bool:
        for h in node.handlers:
            names = [h.type] if not isinstance(h.type, ast.Tuple) else list(h.type.elts)
            if h.type is None or any(isinstance(t, ast.Name) and t.id in ("ImportError", "ModuleNotFoundError", "Exception")
                                     for t in names):
                return True
        return False

    def visit(node: ast.AST, optional: bool):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name.split(".")[0], node.lineno, optional
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                yield node.module.split(".")[0], node.lineno, optional
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            yield node.args[0].value.split(".")[0], node.lineno, optional
        if isinstance(node, ast.Try):
            body_optional = optional or catches_import_error(node)
            for child in node.body:
                yield from visit(child, body_optional)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                yield from visit(child, optional)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, optional)

    yield from visit(tree, False)


def third_party_imports(package_dir: Path) -> Dict[str, List[str]]:
    """Top-level third-party module -> ['path:line', ...] for the required imports under package_dir."""
    own = package_dir.name
    found: Dict[str, List[str]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for mod, line, optional in _imports(tree):
            if optional or mod == own or mod in sys.stdlib_module_names:
                continue
            found.setdefault(mod, []).append(f"{path.relative_to(package_dir.parent)}:{line}")
    return found


def undeclared_imports(package_dir: Path, declared: Set[str]) -> List[str]:
    """One message per third-party import whose distribution is not among `declared` (canonical names)."""
    providers = importlib.metadata.packages_distributions()
    problems = []
    for mod, where in sorted(third_party_imports(package_dir).items()):
        dists = {canonicalize_name(d) for d in providers.get(mod, [])}
        if not dists:
            problems.append(f"`import {mod}` ({', '.join(where[:3])}): no installed distribution provides it")
        elif not dists & declared:
            problems.append(f"`import {mod}` ({', '.join(where[:3])}): provided by {sorted(dists)}, "
                            "none of which pyproject.toml declares")
    return problems


def _declared_runtime() -> Set[str]:
    return {canonicalize_name(r.name) for where, r in _requirements()
            if where in ("dependencies", "install-no-deps") or where in {f"extra {e}" for e in RUNTIME_EXTRAS}}


def test_dependencies_cover_every_third_party_import():
    declared = _declared_runtime()
    imported = third_party_imports(REPO / PACKAGE)
    # the walker sees the stack rayemb is built on (guards against it silently finding nothing)
    assert {"torch", "torchrec", "ray", "mlflow", "numpy", "pyarrow", "yaml"} <= set(imported), sorted(imported)
    problems = undeclared_imports(REPO / PACKAGE, declared)
    assert not problems, ("rayemb/ imports packages pyproject.toml does not declare — add them to "
                          "[project] dependencies (and regenerate the lock):\n  " + "\n  ".join(problems))


def test_import_check_catches_an_undeclared_import(tmp_path):
    pkg = tmp_path / "demo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import os\nfrom . import sub\nimport demo.sub\n")
    (pkg / "sub.py").write_text(
        "import numpy\nimport not_a_real_pkg_xyz.sub\n"
        "def f():\n    from sklearn import metrics\n"
        "try:\n    import psutil\nexcept ImportError:\n    psutil = None\n"
    )
    problems = undeclared_imports(pkg, {"numpy"})
    assert len(problems) == 2, problems
    assert "import not_a_real_pkg_xyz" in problems[0] and "no installed distribution" in problems[0]
    assert "import sklearn" in problems[1] and "scikit-learn" in problems[1]


def test_pins_agree_with_lock():
    lock = _lock()
    assert lock, f"{LOCK} is empty"
    assert "rayemb" not in lock, "the lock must not pin rayemb itself"
    assert lock.get("torch", "").endswith("+cpu"), f"the lock's torch must be the CPU build, not {lock.get('torch')}"
    problems = []
    for where, req in _requirements():
        name = canonicalize_name(req.name)
        lock_name = name
        if name == "fbgemm-gpu" and where == "extra gpu":
            lock_name = "fbgemm-gpu-cpu"  # the CPU lock has the CPU build: the CUDA one must be the same release
        if lock_name not in lock:
            problems.append(f"{where}: {req} is not in {LOCK.name}")
            continue
        version = Version(lock[lock_name])
        if lock_name != name:
            version = Version(version.public)
        if not req.specifier.contains(version, prereleases=True):
            problems.append(f"{where}: {req} but {LOCK.name} has {lock_name}=={lock[lock_name]}")
    assert not problems, "pyproject.toml and the lock disagree (fix one, or run scripts/update_lock.sh):\n  " + \
        "\n  ".join(problems)


def test_requires_python_admits_this_interpreter():
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert spec.contains(f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} exited {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_clean_venv_installs_from_lock_and_runs(tmp_path):
    """What a user does on a fresh machine: a clean venv, the lock as constraints, the cpu extra, torchrec --no-deps."""
    # Install from a copy of the project, so that building it leaves nothing in the work tree.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / PACKAGE, src / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "--disable-pip-version-check", "install", "-q", "-c", str(LOCK)]
    nodeps = _pyproject()["tool"]["rayemb"]["install-no-deps"]
    timings = {}

    def step(label, cmd):
        t0 = time.monotonic()
        _run(cmd, env=env, cwd=tmp_path, timeout=1500)
        timings[label] = time.monotonic() - t0

    step("venv", [sys.executable, "-m", "venv", str(venv)])
    step("pip/setuptools/wheel", [*pip, "--upgrade", "pip", "setuptools", "wheel"])
    step("rayemb[cpu]", [*pip, f"{src}[cpu]"])
    step("torchrec --no-deps", [*pip, "--no-deps", *nodeps])
    print("clean-venv install timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items())
          + f"; total {sum(timings.values()):.0f}")

    # the venv is clean: nothing from the system or the project's .venv leaks in
    cfg = (venv / "pyvenv.cfg").read_text()
    assert re.search(r"include-system-site-packages\s*=\s*false", cfg), cfg

    p = _run([str(venv / "bin" / "rayemb"), "--help"], env=env, cwd=tmp_path, timeout=300)
    for cmd in CLI_COMMANDS:
        assert cmd in p.stdout, (cmd, p.stdout)

    p = _run([str(py), "-c", "import rayemb, torchrec, ray, mlflow, fbgemm_gpu, torch; "
              "print(rayemb.__file__); print(torch.__version__)"], env=env, cwd=tmp_path, timeout=300)
    rayemb_file, torch_version = p.stdout.split()[-2:]
    assert rayemb_file.startswith(str(venv)), rayemb_file  # the installed copy, not the work tree
    assert torch_version.endswith("+cpu"), torch_version

    # Every package in the venv is in the lock at the lock's version: the lock is complete.
    lock = _lock()
    p = _run([str(py), "-m", "pip", "--disable-pip-version-check", "freeze", "--all", "--exclude-editable"],
             env=env, cwd=tmp_path, timeout=300)
    extra = []
    for line in p.stdout.splitlines():
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+))?", line)
        name, version = canonicalize_name(m.group(1)), m.group(2)
        if name != "rayemb" and lock.get(name) != version:
            extra.append(f"{line} (lock: {lock.get(name, 'absent')})")
    assert not extra, "the clean venv has packages the lock does not pin as installed:\n  " + "\n  ".join(extra)
