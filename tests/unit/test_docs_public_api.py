"""The user pages teach the public API only: Python examples import names of ``rayemb.__all__``, shell examples
run commands the ``rayemb`` console script has.

A user page (README.md, docs/*.md; developer notes live in docs/dev/) that shows ``from rayemb.train.worker.loop import
...`` teaches a name that can move or change without notice; such an example is rewritten to the public name or
moved to docs/dev/.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator, List, Set, Tuple

import rayemb
from rayemb.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]

#: a fenced block: its language and its text
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: a shell line running the console script (``rayemb train``, ``.venv/bin/rayemb stats``)
SHELL_COMMAND = re.compile(r"^\s*(?:\$\s+)?(?:[\w./-]*/)?rayemb\s+([a-z][\w-]*)", re.MULTILINE)


def user_pages() -> List[Path]:
    return sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]


def blocks(text: str) -> Iterator[Tuple[str, str, int]]:
    """(language, code, line of the fence) of every fenced block."""
    for m in FENCE.finditer(text):
        yield m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1


def _parse(code: str) -> ast.AST:
    """The example's syntax tree; an example with placeholders (``f(x=1, ...)``) that Python cannot parse is read
    as its import lines."""
    try:
        return ast.parse(code)
    except SyntaxError:
        lines = [ln.strip() for ln in code.splitlines() if re.match(r"\s*(?:from|import)\s", ln)]
        return ast.parse("\n".join(lines))


def private_names(code: str, public: Set[str]) -> List[str]:
    """What a Python example uses of rayemb beyond ``public``: internal modules and names not in ``__all__``."""
    found = []
    for node in ast.walk(_parse(code)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("rayemb.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rayemb":
            if node.module != "rayemb":
                found.append(f"from {node.module} import ...")
            else:
                found += [f"rayemb.{a.name}" for a in node.names if a.name not in public]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "rayemb":
            if node.attr not in public:
                found.append(f"rayemb.{node.attr}")
    return found


def page_problems(page: Path, public: Set[str], commands: Set[str]) -> List[str]:
    problems = []
    for lang, code, line in blocks(page.read_text(encoding="utf-8")):
        where = f"{page.relative_to(REPO)}:{line}"
        if lang in ("python", "py"):
            problems += [f"{where}: {n} is not public (rayemb.__all__)" for n in private_names(code, public)]
        elif lang in ("bash", "sh", "shell", "console", ""):
            problems += [f"{where}: `rayemb {c}` is no rayemb command" for c in SHELL_COMMAND.findall(code)
                         if c not in commands]
    return problems


def test_user_pages_use_only_public_names_and_real_commands():
    public, commands = set(rayemb.__all__), set(COMMANDS)
    pages = user_pages()
    assert len(pages) > 15 and not any("dev" in p.relative_to(REPO / "docs").parts for p in pages[:-1])
    python_blocks = sum(1 for p in pages for lang, _, _ in blocks(p.read_text(encoding="utf-8")) if lang == "python")
    assert python_blocks >= 8  # the pages' examples really were read
    problems = [p for page in pages for p in page_problems(page, public, commands)]
    assert not problems, ("user pages teach internal names; use rayemb's public names (docs/api.md, \"The public "
                          "API\") or move the example to docs/dev/:\n" + "\n".join(problems))


def test_every_public_name_resolves_and_is_documented():
    api = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    for name in rayemb.__all__:
        assert getattr(rayemb, name) is not None
        assert f"`{name}" in api, f"rayemb.{name} is public but docs/api.md does not document it"


def test_the_checker_finds_internal_imports_and_allows_public_ones():
    public = set(rayemb.__all__)
    assert private_names("import rayemb\nfrom rayemb import Embeddings, InferenceModel\nrayemb.EmbeddingTrainer()",
                         public) == []
    assert private_names("from rayemb.train.worker.build import sharded_model", public) == [
        "from rayemb.train.worker.build import ..."]
    assert private_names("import rayemb.planner", public) == ["rayemb.planner"]
    assert private_names("from rayemb import plan", public) == ["rayemb.plan"]
    assert private_names("rayemb.train.run_training(cfg)", public) == ["rayemb.train"]
    assert private_names("from rayemb.serve import InferenceModel\nm = f(a=1, ...)\nm = g(x=1, 2)", public) == [
        "from rayemb.serve import ..."]
    assert SHELL_COMMAND.findall(".venv/bin/rayemb stats --data d\nrayemb train --config c\necho rayemb x") == [
        "stats", "train"]
