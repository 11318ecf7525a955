"""The package's shape: no import cycles, no module too big to read, light packages stay light.

The import graph is read from the source with ``ast`` (module-level and
function-level imports alike, ``TYPE_CHECKING`` blocks excluded), so a cycle is
found even where a lazy import hides it at run time.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "rayemb"
MAX_MODULE_LINES = 450
#: modules that are one concept and may run to ONE_CONCEPT_MAX_LINES: splitting them would scatter one thing
ONE_CONCEPT = {
    "rayemb.config": "the job config: every section's frozen dataclass with its checks, and the YAML reading it",
}
ONE_CONCEPT_MAX_LINES = 600


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, module: str, known: Set[str]) -> Set[str]:
    """rayemb modules that ``module`` imports anywhere in its body (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: Set[str] = set()

    def resolve(name: str) -> None:
        # the longest known module prefix: `rayemb.planner.types.X` -> rayemb.planner.types
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            candidate = ".".join(parts[:i])
            if candidate in known:
                found.add(candidate)
                return

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                resolve(f"{base}.{alias.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def _graph() -> Dict[str, Set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imports(p, m, known) for m, p in mods.items()}


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_the_import_graph_sees_imports():
    graph = _graph()
    assert "rayemb.config" in graph["rayemb.train.trainer"]  # the walker works at all
    assert len(graph) > 30


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles among rayemb modules: {cycles}"


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_too_long_to_read():
    """A long module usually mixes concerns: over MAX_MODULE_LINES it is split by concept, unless it is one
    concept (ONE_CONCEPT, up to ONE_CONCEPT_MAX_LINES)."""
    def limit(module: str) -> int:
        return ONE_CONCEPT_MAX_LINES if module in ONE_CONCEPT else MAX_MODULE_LINES

    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > limit(m)}
    assert not long, f"modules over their limit ({MAX_MODULE_LINES}, one-concept {ONE_CONCEPT_MAX_LINES}): {long}"
    assert set(ONE_CONCEPT) <= set(_modules()), "ONE_CONCEPT names a module that does not exist"


@pytest.mark.parametrize("module,forbidden", [
    ("rayemb", ["torch", "torchrec", "ray", "mlflow"]),
    ("rayemb.config", ["torch", "ray", "mlflow"]),
    ("rayemb.planner", ["torch", "torchrec", "fbgemm_gpu"]),
    ("rayemb.tracking", ["torch", "mlflow", "ray"]),
])
def test_light_packages_import_without_heavy_dependencies(module, forbidden):
    code = (f"import sys, {module}; heavy = [m for m in {forbidden!r} if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"`import {module}` loaded {p.stdout.strip()} {p.stderr[-2000:]}"
