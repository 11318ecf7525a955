"""The package's shape: imports go down the layers, no import cycles, no module too big to read, light packages
stay light.

The import graph is read from the source with ``ast`` (module-level and
function-level imports alike, ``TYPE_CHECKING`` blocks excluded), so a cycle or
an upward import is found even where a lazy import hides it at run time.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "rayemb"
#: a module this long mixes concerns: split it where its concepts part. A cap, not a size to fill: a module
#: that sits just under it commit after commit is kept there by moving lines, not by splitting concepts
MAX_MODULE_LINES = 800
#: "just under the cap": within this fraction of it
NEAR_CAP = 0.02
#: commits in a row (of those changing the module) that may leave it just under the cap
NEAR_CAP_COMMITS = 2


#: rayemb's top-level packages and modules, bottom layer first: each imports only from the layers below its own
#: (a name imported from the facade ``rayemb/__init__.py`` counts as the module that defines it). Packages that
#: share a layer do not import each other. A new top-level package or module gets its place here.
LAYERS: List[Tuple[str, ...]] = [
    ("errors", "units", "constants", "_version", "batch_shape", "placements", "logs", "multiprocess", "_ray",
     "s3_client"),
    ("storage",),
    ("publish",),
    ("embedding",),  # TorchRec modules: tables, hybrid, compression, sequences
    ("contract", "planner"),  # the model contract and factory; the pure planner (sizes tables with embedding/)
    ("config",),  # validates names against the model factory and the embedding's options
    ("config_reference", "tracking"),
    ("data",),
    ("checkpoint", "convert", "models"),
    ("train",),
    ("api", "serve"),
    ("sweep",),  # many jobs under Ray Tune: each trial runs the train driver; the best one exported by serve
    ("cli",),
    ("rayemb", "__main__"),  # the facade (rayemb/__init__.py) and `python -m rayemb`
]


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


def _imports(path: Path, module: str, known: Set[str], facade: Optional[Mapping[str, str]] = None) -> Set[str]:
    """rayemb modules that ``module`` imports anywhere in its body (TYPE_CHECKING blocks excluded).

    ``facade``: name -> defining module of what ``rayemb/__init__.py`` re-exports; given, ``from rayemb import
    Name`` is an import of the module defining ``Name``, and a bare ``import rayemb`` (the package, loaded with
    any of its modules) is none.
    """
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
                if facade is None or alias.name != "rayemb":
                    resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                if facade is not None and base == "rayemb" and alias.name in facade:
                    resolve(facade[alias.name])
                else:
                    resolve(f"{base}.{alias.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def _graph(facade: Optional[Mapping[str, str]] = None) -> Dict[str, Set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imports(p, m, known, facade) for m, p in mods.items()}


def _facade_names() -> Dict[str, str]:
    """Names ``rayemb/__init__.py`` re-exports -> the module defining them (its imports and its lazy-name map)."""
    names: Dict[str, str] = {}
    for node in ast.parse((PACKAGE / "__init__.py").read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rayemb."):
            names.update({a.asname or a.name: str(node.module) for a in node.names})
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            names.update({k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                          if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                          and str(v.value).startswith("rayemb.")})
    return names


def _top(module: str) -> str:
    """The top-level package or module of ``rayemb.a.b`` (``a``); ``rayemb`` for the facade itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


#: rayemb.train split by process, bottom first: what crosses the driver/worker seam (the WorkerJob, the
#: plan per world, the model built from a plan, where a split's rows are), what runs in a worker, the
#: measurements (which build the worker's step to time it), and the driver that runs them all
TRAIN_LAYERS: List[Tuple[str, ...]] = [("seam",), ("worker",), ("calibration",), ("driver",)]


def _train_part(module: str) -> Optional[str]:
    """``worker`` of ``rayemb.train.worker.loop``; ``seam`` of a module directly in rayemb.train; None outside it."""
    parts = module.split(".")
    if parts[:2] != ["rayemb", "train"] or len(parts) < 3:
        return None
    return parts[2] if len(parts) > 3 else "seam"


def upward_imports(graph: Mapping[str, Set[str]], layers: Sequence[Tuple[str, ...]] = LAYERS,
                   part: Callable[[str], Optional[str]] = _top) -> List[str]:
    """Imports of a module from a part (by default a top-level package) in its own layer or above, as
    ``a -> b (why)``; modules whose ``part`` is None are not looked at."""
    level = {name: i for i, group in enumerate(layers) for name in group}
    found = []
    for module, deps in sorted(graph.items()):
        here = part(module)
        if here is None:
            continue
        for dep in sorted(deps):
            there = part(dep)
            if there is None:
                continue
            if there != here and level.get(there, len(layers)) >= level.get(here, -1):
                found.append(f"{module} -> {dep} ({here!r} is layer {level.get(here)}, {there!r} layer "
                             f"{level.get(there)})")
    return found


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
    assert "rayemb.config" in graph["rayemb.train.driver.trainer"]  # the walker works at all
    assert len(graph) > 30


def test_every_top_level_package_has_a_layer():
    unplaced = sorted({_top(m) for m in _modules()} - {name for group in LAYERS for name in group})
    assert not unplaced, f"top-level packages/modules without a layer (give each its place in LAYERS): {unplaced}"


def test_nothing_imports_upward():
    upward = upward_imports(_graph(_facade_names()))
    assert not upward, ("imports from the same layer or one above (move the shared name down, or the importing "
                        f"module up): {upward}")


def test_train_is_split_by_process():
    """A worker never reaches into the driver or the measurements; what crosses the seam imports neither side."""
    upward = upward_imports(_graph(), TRAIN_LAYERS, _train_part)
    assert not upward, f"rayemb.train imports against its split by process ({TRAIN_LAYERS}): {upward}"
    parts = {_train_part(m) for m in _modules()} - {None}
    assert parts == {p for group in TRAIN_LAYERS for p in group}, parts
    # the check itself: a worker reaching the driver, the seam reaching a worker
    assert len(upward_imports({"rayemb.train.worker.loop": {"rayemb.train.driver.trainer", "rayemb.train.worker_job"},
                               "rayemb.train.worker_job": {"rayemb.train.worker.step", "rayemb.config"}},
                              TRAIN_LAYERS, _train_part)) == 2


def test_upward_imports_are_found_lazy_and_through_the_facade_alike(tmp_path):
    """The check itself: a function-level import counts, a facade name is its defining module's, a bare
    ``import rayemb`` is no import, and a same-layer import is refused like an upward one."""
    source = tmp_path / "factory.py"
    source.write_text("import rayemb\nfrom rayemb import DatasetSchema\nfrom rayemb.errors import ConfigError\n\n\n"
                      "def build():\n    from rayemb.train.worker.retrieval import towers\n")
    known = set(_modules())
    deps = _imports(source, "rayemb.contract.factory", known, _facade_names())
    assert deps == {"rayemb.data.schema", "rayemb.errors", "rayemb.train.worker.retrieval"}
    assert [u.split(" (")[0] for u in upward_imports({"rayemb.contract.factory": deps})] == [
        "rayemb.contract.factory -> rayemb.data.schema", "rayemb.contract.factory -> rayemb.train.worker.retrieval"]
    assert upward_imports({"rayemb.planner.cost": {"rayemb.contract.factory"}}) != []  # the same layer
    assert upward_imports({"rayemb.planner.cost": {"rayemb.embedding.hybrid", "rayemb.placements"}}) == []


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles among rayemb modules: {cycles}"


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_too_long_to_read():
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them where their concepts part): {long}"


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


def near_cap_streaks(line_counts: Dict[str, List[int]], cap: int = MAX_MODULE_LINES) -> Dict[str, List[int]]:
    """Modules whose newest line counts (newest first) were all within NEAR_CAP of ``cap`` for more than
    NEAR_CAP_COMMITS commits."""
    floor = cap * (1 - NEAR_CAP)
    return {m: counts for m, counts in line_counts.items()
            if len(counts) > NEAR_CAP_COMMITS and all(floor <= n <= cap for n in counts[:NEAR_CAP_COMMITS + 1])}


def test_near_cap_streaks_are_found():
    cap = 100
    assert near_cap_streaks({"a": [99, 100, 98], "b": [99, 100, 90], "c": [99, 99]}, cap) == {"a": [99, 100, 98]}


def test_no_module_is_held_just_under_the_cap():
    """Trimmed to fit, commit after commit, is the cap fed rather than obeyed: split the module instead."""
    try:
        _git("rev-parse", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no history to read")
    floor = MAX_MODULE_LINES * (1 - NEAR_CAP)
    counts: Dict[str, List[int]] = {}
    for module, path in _modules().items():
        if len(path.read_text().splitlines()) < floor:
            continue
        rel = str(path.relative_to(REPO))
        revs = _git("log", f"-n{NEAR_CAP_COMMITS + 1}", "--format=%H", "--", rel).split()
        counts[module] = [len(_git("show", f"{rev}:{rel}").splitlines()) for rev in revs]
    held = near_cap_streaks(counts)
    assert not held, (f"modules within {NEAR_CAP:.0%} of {MAX_MODULE_LINES} lines for {NEAR_CAP_COMMITS + 1} "
                      f"commits: {held}")


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
