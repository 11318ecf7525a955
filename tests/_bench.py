"""Load a benchmark script of jobs/bench/ as a module, for the tests of its pure parts (no Ray, no cluster)."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs", "bench")


def load_bench(name: str) -> ModuleType:
    """``jobs/bench/<name>.py`` as a fresh module; the bench folder joins ``sys.path`` for its sibling imports."""
    if BENCH_DIR not in sys.path:
        sys.path.insert(0, BENCH_DIR)
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", os.path.join(BENCH_DIR, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
