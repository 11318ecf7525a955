"""Every test directory is collected by `make test`.

pytest's default ``norecursedirs`` contains ``dist`` and ``build``; with it, ``tests/dist``
(the multi-process equivalence and checkpoint tests) was silently skipped by CI. This
checks the configured patterns against every directory under tests/ that holds tests, and
asks pytest itself which test files it collects from there.
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def _test_dirs():
    return sorted({p.parent for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts})


def test_no_test_directory_matches_norecursedirs(pytestconfig):
    patterns = pytestconfig.getini("norecursedirs")
    dirs = _test_dirs()
    assert TESTS / "dist" in dirs and len(dirs) >= 6, dirs
    for d in dirs:
        for part in d.relative_to(REPO).parts:
            hits = [p for p in patterns if fnmatch.fnmatch(part, p)]
            assert not hits, f"{d.relative_to(REPO)} is skipped by norecursedirs {hits}: its tests never run"


def _collected_by_a_new_pytest() -> set:
    """The test files `pytest --collect-only` from the repo root (what `make test` runs) reaches."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-rs", "-p", "no:cacheprovider"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    collected = {line.split("::", 1)[0] for line in out.stdout.splitlines() if "::" in line}
    # "SKIPPED [1] tests/gpu/test_cuda_path.py:35: needs a CUDA GPU ..."
    collected |= {line.split()[2].split(":", 1)[0] for line in out.stdout.splitlines() if line.startswith("SKIPPED [")}
    return collected


def test_pytest_collects_every_test_file(pytestconfig):
    """pytest, run from the repo root with no paths (as `make test` runs it), reaches every test file.

    Reached: it collects a test of the file, or the file skipped itself at import (tests/gpu without CUDA). A
    pytest run started that way has just done this collection, so its own is checked (tests/_collected.py);
    a run given paths asks a new pytest.
    """
    import _collected

    whole_suite = (pytestconfig.args_source == pytest.Config.ArgsSource.TESTPATHS
                   and pytestconfig.invocation_params.dir == REPO)
    collected = set(_collected.FILES) if whole_suite else _collected_by_a_new_pytest()
    print(f"collection checked: {'this run' if whole_suite else 'a new pytest'}'s, {len(collected)} files")
    files = {str(p.relative_to(REPO)) for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts}
    missing = sorted(files - collected)
    assert not missing, f"test files pytest does not collect: {missing}"
