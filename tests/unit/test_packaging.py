"""Packaging: pyproject.toml declares what rayemb/ imports as ranges that every pin of
both locks (requirements/lock-cpu.txt, requirements/lock-gpu.txt) satisfies, the GPU
lock is torch's CUDA build, scripts/install.sh picks the lock for the machine, and a
clean venv installs from the CPU lock and runs.

torchrec is the documented exception: its metadata demands the CUDA fbgemm-gpu, which
clashes with fbgemm-gpu-cpu, so it is in the ``gpu`` extra (where fbgemm-gpu satisfies
it) and, for CPU, named in ``[tool.rayemb] install-no-deps`` and installed with
``pip install --no-deps``; the fbgemm build comes from the ``cpu``/``gpu`` extra.
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
GPU_LOCK = REPO / "requirements" / "lock-gpu.txt"
#: which requirements each lock must satisfy: the dependencies, its own fbgemm extra, the test extra
#: (the CPU lock also torchrec, installed with --no-deps)
LOCK_SECTIONS = {
    "lock-cpu.txt": ("dependencies", "extra cpu", "extra test", "install-no-deps"),
    "lock-gpu.txt": ("dependencies", "extra gpu", "extra test"),
}
#: exact pins pyproject.toml keeps, and why: everything else is a range, so rayemb installs into an
#: existing Ray image without moving its packages
EXACT_PINS_ALLOWED = {"torchmetrics": "torchrec 1.8 requires exactly 1.0.3"}
#: the CPython versions rayemb is tested on (scripts/install.sh accepts them, .ci/run runs the unit tests on both)
TESTED_PYTHONS = ("3.11", "3.12")
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


def _lock(path: Path = LOCK) -> Dict[str, str]:
    pins: Dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line)
        assert m, f"{path.name}:{n}: not an exact `name==version` pin: {line!r}"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"{path.name}:{n}: {name} pinned twice"
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


def lock_problems(lock: Dict[str, str], lock_name: str) -> List[str]:
    """Requirements of pyproject.toml (those ``lock_name`` serves) that the lock's pins do not satisfy."""
    problems = []
    for where, req in _requirements():
        if where not in LOCK_SECTIONS[lock_name]:
            continue
        name = canonicalize_name(req.name)
        if name not in lock:
            problems.append(f"{where}: {req} is not in {lock_name}")
        elif not req.specifier.contains(Version(lock[name]), prereleases=True):
            problems.append(f"{where}: {req} but {lock_name} has {name}=={lock[name]}")
    return problems


@pytest.mark.parametrize("path", [LOCK, GPU_LOCK], ids=lambda p: p.name)
def test_every_lock_pin_satisfies_the_pyproject_ranges(path):
    lock = _lock(path)
    assert len(lock) > 100, f"{path} is nearly empty"
    assert "rayemb" not in lock, "the lock must not pin rayemb itself"
    problems = lock_problems(lock, path.name)
    assert not problems, "pyproject.toml and the lock disagree (fix one, or run scripts/update_lock.sh):\n  " + \
        "\n  ".join(problems)


def test_lock_check_catches_a_pin_outside_the_range():
    lock = _lock(GPU_LOCK)
    assert lock_problems({**lock, "ray": "2.59.0"}, "lock-gpu.txt") == \
        ["dependencies: ray[default,train]<2.61,>=2.60 but lock-gpu.txt has ray==2.59.0"]
    missing = {k: v for k, v in lock.items() if k != "torchrec"}
    assert lock_problems(missing, "lock-gpu.txt") == ["extra gpu: torchrec<1.9,>=1.8 is not in lock-gpu.txt"]


def test_dependencies_are_ranges_not_pins():
    """rayemb installs into an existing Ray image: it states what it needs, the locks state exact versions."""
    d = _pyproject()
    exact = [r for r in map(Requirement, d["project"]["dependencies"])
             if any(s.operator in ("==", "===") for s in r.specifier) and r.name not in EXACT_PINS_ALLOWED]
    assert not exact, f"exact pins in [project] dependencies (use ranges; the locks pin): {exact}"
    by_name = {Requirement(r).name: Requirement(r) for r in d["project"]["dependencies"]}
    # the stack rayemb is built against: one minor release each, any patch release of it
    for name, inside, outside in (("torch", "2.13.9", "2.14.0"), ("ray", "2.60.3", "2.61.0")):
        assert by_name[name].specifier.contains(inside) and not by_name[name].specifier.contains(outside)


def test_gpu_extra_has_torchrec_and_the_cpu_path_installs_it_without_deps():
    d = _pyproject()
    gpu = {canonicalize_name(Requirement(r).name) for r in d["project"]["optional-dependencies"]["gpu"]}
    cpu = {canonicalize_name(Requirement(r).name) for r in d["project"]["optional-dependencies"]["cpu"]}
    assert {"torchrec", "fbgemm-gpu"} <= gpu and cpu == {"fbgemm-gpu-cpu"}
    assert [canonicalize_name(Requirement(r).name) for r in d["tool"]["rayemb"]["install-no-deps"]] == ["torchrec"]


def test_the_gpu_lock_is_the_cuda_build_of_the_cpu_locks_stack():
    cpu, gpu = _lock(LOCK), _lock(GPU_LOCK)
    assert cpu["torch"].endswith("+cpu") and gpu["torch"] == cpu["torch"].split("+")[0]
    assert gpu["cuda-toolkit"].startswith("13.0."), gpu["cuda-toolkit"]  # torch 2.13.0's CUDA 13.0 runtime
    assert {"nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cublas", "triton"} <= set(gpu)
    assert gpu["fbgemm-gpu"] == cpu["fbgemm-gpu-cpu"] == "1.8.0" and "fbgemm-gpu-cpu" not in gpu
    assert gpu["torchrec"] == cpu["torchrec"] == "1.8.0"
    # everything both environments have is at one version: the GPU lock is resolved against the CPU one
    differ = {n: (cpu[n], gpu[n]) for n in set(cpu) & set(gpu) if n != "torch" and cpu[n] != gpu[n]}
    assert not differ, f"the locks disagree on shared packages (bash scripts/update_lock.sh): {differ}"
    only_cpu = set(cpu) - set(gpu)
    assert only_cpu == {"fbgemm-gpu-cpu"}, only_cpu


def _fake_tools(tmp_path: Path, gpu: bool) -> Dict[str, str]:
    """A PATH with a stand-in nvidia-smi (``-L`` lists a GPU) when ``gpu``, and the plain tools install.sh uses."""
    bin_dir = tmp_path / ("bin-gpu" if gpu else "bin-cpu")
    bin_dir.mkdir()
    if gpu:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA A10G (UUID: GPU-0)'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu"])
def test_install_sh_uses_the_gpu_lock_where_nvidia_smi_sees_a_gpu(tmp_path, gpu):
    """install.sh's stamp hashes the lock it uses: an up-to-date stamp made with the expected lock is
    accepted, one made with the other lock is not (it then installs, which the stand-in python refuses)."""
    import hashlib

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 17\n")  # never installs anything
    (venv / "bin" / "python").chmod(0o755)
    env = {**_fake_tools(tmp_path, gpu), "RAYEMB_VENV": str(venv)}
    script = REPO / "scripts" / "install.sh"
    for lock, accepted in ((GPU_LOCK, gpu), (LOCK, not gpu)):
        stamp = hashlib.sha256(script.read_bytes() + PYPROJECT.read_bytes() + lock.read_bytes()).hexdigest()
        (venv / ".rayemb-install-stamp").write_text(stamp + "\n")
        p = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=120)
        if accepted:
            assert p.returncode == 0 and "environment up to date" in p.stdout, (lock.name, p.stdout, p.stderr)
        else:
            assert p.returncode != 0 and "up to date" not in p.stdout, (lock.name, p.stdout, p.stderr)
            assert f"from {(GPU_LOCK if gpu else LOCK).name}" in p.stdout, p.stdout


def test_requires_python_admits_this_interpreter_and_the_tested_versions():
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert spec.contains(f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}")
    assert all(spec.contains(f"{v}.0") for v in TESTED_PYTHONS) and not spec.contains("3.13.0"), spec


def test_license_is_apache_2_and_the_built_metadata_carries_it(tmp_path):
    """LICENSE holds the Apache License 2.0 (as TorchRec's dependencies Ray and MLflow), pyproject.toml names it,
    and setuptools puts both into the distribution's metadata."""
    text = (REPO / "LICENSE").read_text()
    for needle in ("Apache License", "Version 2.0, January 2004", "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND",
                   "9. Accepting Warranty or Additional Liability.", "END OF TERMS AND CONDITIONS"):
        assert needle in text, f"LICENSE lacks {needle!r}: not the full Apache-2.0 text"
    project = _pyproject()["project"]
    assert project.get("license") == "Apache-2.0" and project.get("license-files") == ["LICENSE"], \
        (project.get("license"), project.get("license-files"))

    # the metadata of a copy of the project, as pip builds it (no code needed for that)
    src = tmp_path / "src"
    (src / PACKAGE).mkdir(parents=True)
    (src / PACKAGE / "__init__.py").touch()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    (tmp_path / "meta").mkdir()
    p = _run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
              "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))", str(tmp_path / "meta")],
             cwd=src, timeout=300)
    dist_info = tmp_path / "meta" / p.stdout.split()[-1]
    metadata = (dist_info / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata.splitlines(), metadata[:2000]
    assert "License-File: LICENSE" in metadata.splitlines(), metadata[:2000]
    assert (dist_info / "licenses" / "LICENSE").read_text() == text


def _python(version: str):
    """An interpreter of that version that runs: on PATH, or pyenv's (its shims fail for versions it has not
    selected, and CI empties HOME, so $PYENV_ROOT/versions is looked at directly); None when there is none."""
    import glob

    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")]
    candidates = [shutil.which(f"python{version}")]
    for root in filter(None, roots):
        candidates += sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")))
    for exe in filter(None, candidates):
        p = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, timeout=60)
        if p.returncode == 0 and p.stdout.strip() == version:
            return exe
    return None


def _simple_index(root: Path, wheels: Iterable[str]) -> str:
    """A PEP 503 index on disk serving ``torch`` with these wheel file names (the files need not exist: pip only
    reads the listing to see what it offers)."""
    (root / "torch").mkdir(parents=True)
    links = "".join(f'<a href="../files/{w}">{w}</a>\n' for w in wheels)
    (root / "torch" / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return root.as_uri()


def _install_dry_run(tmp_path: Path, python: str, **env) -> subprocess.CompletedProcess:
    """``install.sh --dry-run`` on a CPU machine with pip kept off the network: no configuration, an empty index,
    find-links and RAYEMB_TORCH_INDEX_URL as given (None: unset)."""
    empty = tmp_path / "empty-index"
    empty.mkdir(exist_ok=True)
    no_gpu = tmp_path / "bin-no-gpu"
    no_gpu.mkdir(exist_ok=True)
    (no_gpu / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")  # sees no GPU, even on a GPU machine: the CPU lock
    (no_gpu / "nvidia-smi").chmod(0o755)
    run_env = {"PATH": f"{no_gpu}:/usr/bin:/bin", "HOME": str(tmp_path),
               "PYTHON": python, "RAYEMB_VENV": str(tmp_path / "no-venv"),
               "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": empty.as_uri()}
    run_env.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run(["bash", str(REPO / "scripts" / "install.sh"), "--dry-run"],
                          capture_output=True, text=True, env=run_env, timeout=300)


#: a wheel any interpreter takes, named as the CPU lock's torch build
def _torch_cpu_wheel() -> str:
    return f"torch-{_lock()['torch']}-py3-none-any.whl"


def test_install_sh_adds_the_torch_cpu_index_only_where_pip_cannot_find_the_build(tmp_path):
    """PyPI serves no +cpu torch: install.sh adds RAYEMB_TORCH_INDEX_URL (PyTorch's CPU index by default) only
    when pip's own find-links and indexes lack the CPU lock's build, and says so; empty never adds one."""
    pin = _lock()["torch"]
    assert pin.endswith("+cpu")
    links = tmp_path / "links"
    links.mkdir()
    (links / _torch_cpu_wheel()).touch()
    # another build of the same version in find-links is not the pinned one
    (tmp_path / "links-other").mkdir()
    (tmp_path / "links-other" / f"torch-{pin.split('+')[0]}-py3-none-any.whl").touch()
    serving = _simple_index(tmp_path / "torch-index", [_torch_cpu_wheel()])
    lacking = _simple_index(tmp_path / "other-index", [f"torch-{pin.split('+')[0]}-py3-none-any.whl"])

    # found in pip's find-links (a local wheel, offline): no index added, even with one named
    p = _install_dry_run(tmp_path, sys.executable, PIP_FIND_LINKS=str(links), RAYEMB_TORCH_INDEX_URL=serving)
    assert p.returncode == 0 and f"torch=={pin} for Python" in p.stderr, (p.stdout, p.stderr)
    assert "pip finds it as configured (no extra index)" in p.stderr, p.stderr

    # not found: the index named by RAYEMB_TORCH_INDEX_URL is added, and it serves the build
    p = _install_dry_run(tmp_path, sys.executable, PIP_FIND_LINKS=str(tmp_path / "links-other"),
                         RAYEMB_TORCH_INDEX_URL=serving)
    assert p.returncode == 0 and f"from the extra index {serving}" in p.stderr, (p.stdout, p.stderr)

    # not found, and the named index lacks the build too: exit 3 before anything is installed, naming the variable
    p = _install_dry_run(tmp_path, sys.executable, RAYEMB_TORCH_INDEX_URL=lacking)
    assert p.returncode == 3 and f"RAYEMB_TORCH_INDEX_URL={lacking}" in p.stderr, (p.stdout, p.stderr)

    # empty: never an index; the message says what the default would have been
    p = _install_dry_run(tmp_path, sys.executable, RAYEMB_TORCH_INDEX_URL="")
    assert p.returncode == 3 and "RAYEMB_TORCH_INDEX_URL is empty" in p.stderr, (p.stdout, p.stderr)
    assert "https://download.pytorch.org/whl/cpu" in p.stderr, p.stderr
    assert not (tmp_path / "no-venv").exists()


@pytest.mark.parametrize("version,accepted", [("3.12", True), ("3.13", False)])
def test_install_sh_accepts_python_3_11_and_3_12_only(tmp_path, version, accepted):
    python = _python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    p = _install_dry_run(tmp_path, python, PIP_FIND_LINKS=str(tmp_path))
    if accepted:
        # the version passes; whether a +cpu torch wheel exists for it (exit 3) is the index's matter
        assert p.returncode in (0, 3) and "needs Python" not in p.stderr, (p.stdout, p.stderr)
        assert f"with Python {version}." in p.stdout, p.stdout
    else:
        assert p.returncode == 1 and "needs Python 3.11 or 3.12" in p.stderr, (p.stdout, p.stderr)


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
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / PACKAGE, src / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    py = venv / "bin" / "python"
    # --no-compile: byte-compiling torch's and ray's thousands of modules takes much of the install's time and
    # checks nothing here (the venv is thrown away)
    pip = [str(py), "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-compile", "-c", str(LOCK)]
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
