"""The repository speaks of the software only: no outside documents, tracker numbers or work logs, no stale paths.

Code, docs, tests and scripts are read by people who have only this repository. A comment saying "DESIGN §4"
or "issue 12" points at a text they cannot open, and "this session" or "the lead" narrates how the work was
organised instead of what the software does. Every tracked text file (``git ls-files``: code, tests, docs,
jobs, scripts, cluster files, configs and committed results; ignored and generated files are skipped, and
LICENSE, the Apache text as published) is searched for such citations, an issue named without its number
("(issue: ...)", "the issue's size") as much as one with it; legitimate technical uses of the same words (Ray's session
directories, POSIX sessions, pytest's session scope, ``AWS_SESSION_TOKEN``) are allowed by exact patterns.

The docs name modules and files (``rayemb/train/worker/loop.py``, ``rayemb.planner.split.HugeCTRSplitRule``); every
one must exist, so that the architecture and the how-tos never send a reader to a file that was moved or removed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve().relative_to(REPO).as_posix()

#: tracked files not searched: the license is the Apache text verbatim (it speaks of "issue tracking systems")
NOT_SEARCHED = ("LICENSE",)
TEXT_SUFFIXES = {"", ".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ".json"}

#: what no tracked file may say: (what it is, pattern)
BANNED: List[Tuple[str, "re.Pattern[str]"]] = [
    ("a design document outside the repository", re.compile(r"\bDESIGN\b|(?i:\bdesign\.md\b)")),
    ("a style guide outside the repository", re.compile(r"\bSTYLE\b|(?i:\bstyle\.md\b)")),
    ("a numbered section of an outside document", re.compile(r"§\s*\d")),
    ("an issue number", re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)),
    ("an issue of a tracker", re.compile(
        r"\b(?:the|this|that|these|those|an?|its|our|open|known|linked|github|jira|see|per|in|from|fixes|closes"
        r"|resolves)\s+issues?\b|\bissues?(?:'s\b|\s*[:#])|[(\[]\s*issues?\b|\bissue[- ]?(?:tracker|number|id)s?\b",
        re.IGNORECASE)),
    ("a tracker number", re.compile(r"(?:^|(?<=[\s(\[,;]))#\d{1,5}\b")),
    ("a pull request number", re.compile(r"\b(?:PR|pull request)\s*#?\d+", re.IGNORECASE)),
    ("a work session", re.compile(r"\bsessions?\b", re.IGNORECASE)),
    ("a result file named after a work session", re.compile(r"_s\d{2}(?!\d)")),
    ("a lent machine", re.compile(r"\blent\b|\blending\b", re.IGNORECASE)),
    ("the tool that lends machines", re.compile(r"\bdevice (?:tool|time|budget)\b", re.IGNORECASE)),
    ("who organised the work", re.compile(r"\bthe lead\b|\bhelper (?:session|agent|task)s?\b|\bsub-?agents?\b",
                                          re.IGNORECASE)),
]

#: legitimate uses of the same words, removed from a line before it is searched
ALLOWED = re.compile("|".join([
    r"\w*_session\w*", r"\bsession_\w*", r"\w*_SESSION_\w*",   # identifiers: start_new_session, session_latest, ...
    r"\bSparkSession\b", r"\bboto3\.session\.Session\b",
    r"scope=\"session\"", r"\bpytest session\b",                # pytest's session-scoped fixtures
    r"\bRay(?:'s)? (?:own )?sessions?\b",                       # a Ray session: its temp dir, logs and sockets
    r"\bsessions, (?:unix )?sockets\b",                         # what Ray keeps in RAY_TMPDIR
    r"\bsession's dashboard_agent\.log\b",
    r"\b(?:its|their) (?:own )?session\b",                      # POSIX sessions (setsid) of a process tree
    r"\bsession's process group\b", r"\bthe session the head leads\b",
    r"PODS 2012, §3",                                           # a published paper's section (the sketch's proof)
]))


#: any banned pattern: most lines match none and are passed over at once
ANY_BANNED = re.compile("|".join(f"(?i:{p.pattern})" if p.flags & re.IGNORECASE else f"(?:{p.pattern})"
                                 for _, p in BANNED))


def _tracked_files() -> List[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    files = [f for f in out.stdout.decode().split("\0") if f and f != SELF and f not in NOT_SEARCHED]
    return [f for f in files if Path(f).suffix in TEXT_SUFFIXES and (REPO / f).is_file()]


def _citations(path: str, text: str) -> Iterator[str]:
    last_word = ""
    for number, line in enumerate(text.splitlines(), 1):
        # the previous line's last word goes in front, so that a phrase wrapped over two lines ("the Ray /
        # session's logs", "issue / 12") reads as one; a hit inside that word alone was its own line's
        prefix = last_word + " "
        words = line.split()
        last_word = words[-1] if words else ""
        if not ANY_BANNED.search(prefix + line):
            continue
        cleaned = ALLOWED.sub(lambda m: " " * len(m.group(0)), prefix + line)
        for what, pattern in BANNED:
            m = next((m for m in pattern.finditer(cleaned) if m.end() > len(prefix)), None)
            if m:
                yield f"{path}:{number}: {what} ({m.group(0)!r}): {line.strip()[:160]}"
                break


def find_citations(files: Dict[str, str]) -> List[str]:
    """Every line of ``files`` (path -> text) that cites an outside document or narrates the work."""
    return [hit for path, text in files.items() for hit in _citations(path, text)]


def test_the_checker_finds_what_it_bans_and_allows_the_technical_uses():
    bad = {
        "a.py": "# why (DESIGN §4): hot rows\n",
        "b.md": "as STYLE.md asks\nsee issue 12\nfixed in #12\n",
        "c.md": "measured this\nsession\nsession 9's figure\n`--out multinode_s17.json`\n",
        "d.sh": "# on a lent GPU machine\n# device time: 8 min\n# as the lead said\n",
    }
    hits = find_citations(bad)
    assert len(hits) == 10, hits
    assert {h.split(":")[0] for h in hits} == set(bad)
    good = {
        "e.py": 'subprocess.Popen(cmd, start_new_session=True)\n@pytest.fixture(scope="session")\n'
                "path = ray._private.worker._global_node.get_session_dir_path()\n",
        "f.md": "see /tmp/ray/session_latest/logs\nthe Ray session's logs\nAWS_SESSION_TOKEN\n"
                "SIGTERM to its own session\ncolor=\"#888\"\n## Heading 2\nAgarwal et al. (PODS 2012, §3)\n"
                "checks the Ray\nsession's logs\n",
    }
    assert find_citations(good) == []


def test_an_issue_named_without_its_number_is_found_and_the_verb_is_not():
    bad = {
        "hybrid_auc.py": '"""Validation AUC with and without hybrid tables (issue: hybrid must not cost accuracy).\n',
        "test_outage.py": '"""A job survives its tracking server dying mid-run (issue: tracking never hurts training).\n',
        "test_compression.py": "V, E = 1_048_576, 512  # the issue's reference size\n",
        "a.md": "as this issue asks\nfixed, see\nissue #4\nthe issue tracker\n",
    }
    hits = find_citations(bad)
    assert len(hits) == 6, hits
    assert {h.split(":")[0] for h in hits} == set(bad)
    verbs = {"b.py": "# Python-level collectives are issued by our own DDP hook\n"
                     "DeviceFeed issues batch k+1's copy on its own stream\n"
                     "# also those DDP's C++ reducer issues without a comm hook\n"}
    assert find_citations(verbs) == []


def test_every_tracked_text_file_is_searched():
    files = _tracked_files()
    for path in ("README.md", "Makefile", "pyproject.toml", "examples/deepfm.py", ".gitignore"):
        assert path in files, path
    assert any(f.startswith("bench-results/") for f in files) and any(f.startswith("cluster/") for f in files)
    assert "LICENSE" not in files


def test_no_tracked_file_cites_outside_documents_issues_or_work_sessions():
    files = {}
    for path in _tracked_files():
        try:
            files[path] = (REPO / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    assert len(files) > 100  # the scan really read the repository
    hits = find_citations(files)
    assert not hits, "state the fact itself instead of citing or narrating:\n" + "\n".join(hits)


# ---- paths and modules the docs name ---- #

#: a repository path in a doc: rayemb/..., jobs/..., tests/..., scripts/..., cluster/... (no placeholders)
DOC_PATH = re.compile(r"(?<![\w./-])((?:rayemb|jobs|tests|scripts|cluster)/[\w./-]*\w)")
#: a dotted rayemb module (optionally with an attribute): rayemb.train.worker.build.sharded_model
DOC_MODULE = re.compile(r"(?<![\w./-])(rayemb(?:\.\w+)+)")


def _doc_files() -> List[Path]:
    return sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]


def _module_file(parts: List[str]) -> Optional[Path]:
    base = REPO.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _key_names() -> Set[str]:
    """``rayemb.*`` strings of the package that are names, not modules: MLflow tags (``rayemb.git_commit``,
    ``rayemb.lib.<dist>``), registry tags."""
    names = set()
    for source in (REPO / "rayemb").rglob("*.py"):
        names.update(k.rstrip(".") for k in re.findall(r"[\"']rayemb\.[\w.]*", source.read_text(encoding="utf-8")))
    return {k[1:] for k in names}


def missing_module(dotted: str, keys: Set[str] = frozenset()) -> Optional[str]:
    """Why ``dotted`` (a module, or a module's attribute) does not exist; None when it does, or when it is one of
    ``keys`` (a tag name) or under one."""
    if any(dotted == k or dotted.startswith(k + ".") for k in keys):
        return None
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        source = _module_file(parts[:cut])
        if source is None:
            continue
        if cut == len(parts):
            return None
        name = parts[cut]
        defined = re.compile(rf"^\s*(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|\bimport\b.*\b{name}\b"
                             rf"|^\s+{name},?$|^\s*\"{name}\"", re.MULTILINE)
        if defined.search(source.read_text(encoding="utf-8")):
            return None
        return f"{'.'.join(parts[:cut])} ({source.relative_to(REPO)}) defines no {name!r}"
    return "no such module"


def test_every_path_and_module_the_docs_name_exists():
    assert (REPO / "docs" / "architecture.md").is_file()
    problems, seen, keys = [], 0, _key_names()
    assert "rayemb.git_commit" in keys and "rayemb.lib" in keys
    for doc in _doc_files():
        text = doc.read_text(encoding="utf-8")
        for m in DOC_PATH.finditer(text):
            path = m.group(1).rstrip(".")
            if "*" in path or "..." in path or path.endswith("/"):
                continue
            seen += 1
            if not (REPO / path).exists():
                problems.append(f"{doc.name}: {path} does not exist")
        for m in DOC_MODULE.finditer(text):
            seen += 1
            why = missing_module(m.group(1), keys)
            if why:
                problems.append(f"{doc.name}: {m.group(1)}: {why}")
    assert seen > 50  # the docs were really read
    assert not problems, "\n".join(problems)


def test_the_module_check_tells_missing_modules_from_present_ones():
    assert missing_module("rayemb.train.worker.loop") is None
    assert missing_module("rayemb.planner.split.HugeCTRSplitRule") is None
    assert missing_module("rayemb.train.checkpoint") is not None
    assert missing_module("rayemb.planner.split.NoSuchRule") is not None
    assert missing_module("rayemb.git_commit") is not None
    assert missing_module("rayemb.git_commit", {"rayemb.git_commit"}) is None
    assert missing_module("rayemb.lib.torch", {"rayemb.lib"}) is None


# ---- docs/architecture.md's package tree ---- #

def _package_tree() -> List[str]:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    m = re.search(r"```\nrayemb/\n(.*?)```", text, re.DOTALL)
    assert m, "docs/architecture.md has no package tree (a ``` block starting with rayemb/)"
    return m.group(1).splitlines()


def test_the_architecture_tree_names_real_files_and_every_package():
    named_dirs, named_modules, problems = set(), set(), []
    folder = ""
    for line in _package_tree():
        # a top-level entry (" ├─ data/") or one nested in a folder (" │  ├─ worker/", under train/)
        entry = re.match(r"(\s*(?:│\s*)?)[├└]─ (\w+)(/|\.py)", line)
        if entry:
            nested = "│" in entry.group(1)
            name = entry.group(2) if entry.group(3) == "/" else ""
            if not nested:
                folder = name
                if folder:
                    named_dirs.add(folder)
            elif name:
                folder = f"{folder.split('/')[0]}/{name}"
        for name in re.findall(r"\b(\w+)\.py\b", line):
            if folder == "":
                named_modules.add(name)
            if not (REPO / "rayemb" / folder / f"{name}.py").is_file():
                problems.append(f"rayemb/{folder + '/' if folder else ''}{name}.py is named but does not exist")
    assert len(named_dirs) >= 5 and len(named_modules) >= 5  # the tree was really read
    try:
        out = subprocess.run(["git", "ls-files", "rayemb"], cwd=REPO, capture_output=True, text=True, check=True)
        tracked = out.stdout.split()
    except (OSError, subprocess.CalledProcessError):
        tracked = [p.relative_to(REPO).as_posix() for p in (REPO / "rayemb").rglob("*.py")]
    for path in tracked:
        parts = path.split("/")
        if len(parts) == 3 and parts[2] == "__init__.py" and parts[1] not in named_dirs:
            problems.append(f"package rayemb/{parts[1]}/ is missing from the tree")
        if len(parts) == 2 and parts[1].endswith(".py") and parts[1] not in ("__init__.py", "__main__.py") \
                and parts[1][:-3] not in named_modules:
            problems.append(f"module rayemb/{parts[1]} is missing from the tree")
    assert not problems, "\n".join(problems)


def test_every_file_name_in_the_architecture_exists():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    existing = {p.name for top in ("rayemb", "jobs", "tests", "cluster", "scripts") for p in (REPO / top).rglob("*")}
    missing = sorted({name for name in re.findall(r"\b\w+\.(?:py|sh|yaml)\b", text)} - existing
                     - {"schema.yaml", "config.yaml"})
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


# ---- the README's command table ---- #

def _options(parser) -> Set[str]:
    """Every option string of ``parser`` and of its subcommands."""
    import argparse

    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options(sub)
    return found


def test_the_readme_lists_every_command_with_real_flags():
    import argparse

    from rayemb.cli import COMMANDS, build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    rows = re.findall(r"^\| `rayemb ([\w-]+)([^`]*)` \|", (REPO / "README.md").read_text(encoding="utf-8"), re.MULTILINE)
    listed = {name: flags for name, flags in rows}
    assert set(listed) == set(COMMANDS), f"README's command table lists {sorted(listed)}, the CLI has {sorted(COMMANDS)}"
    unknown = [f"rayemb {name} {flag}" for name, usage in listed.items()
               for flag in re.findall(r"--[\w-]+", usage) if flag not in _options(commands[name])]
    assert not unknown, f"README's command table names flags the CLI does not take: {unknown}"
