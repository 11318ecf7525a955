"""Every benchmark figure in docs/benchmarks.md can be checked: the result file it came from is committed.

Every section names the committed JSON results its figures come from
(``bench-results/<benchmark>_<date>_<commit>.json``); figures recorded before results were committed are not
quoted at all.
"""

import json
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "benchmarks.md"
RESULT = re.compile(r"bench-results/([A-Za-z0-9_.-]+\.json)")
NAME = re.compile(r"^[a-z_]+_\d{4}-\d{2}-\d{2}_[0-9a-f]{7,}\.json$")


def _sections(text: str):
    parts = re.split(r"^## ", text, flags=re.M)
    return [("## " + p).split("\n", 1) for p in parts[1:]]


def _tracked() -> set:
    out = subprocess.run(["git", "ls-files", "bench-results"], cwd=REPO, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_results_directory_is_not_ignored():
    probe = "bench-results/throughput_2026-01-01_0000000.json"
    ignored = subprocess.run(["git", "check-ignore", "-q", probe], cwd=REPO).returncode == 0
    assert not ignored, ".gitignore must let benchmark results be committed"


def _unbacked(text: str) -> list:
    """The sections of ``text`` that name no result file."""
    return [heading for heading, body in _sections(text) if not RESULT.findall(body)]


def test_every_section_names_committed_results():
    tracked = _tracked()
    text = DOC.read_text()
    unbacked = _unbacked(text)
    assert not unbacked, f"sections that name no committed result (re-run and commit it, or drop them): {unbacked}"
    for heading, body in _sections(text):
        named = set(RESULT.findall(body))
        for name in sorted(named):
            assert NAME.match(name), f"{heading!r}: {name} is not <benchmark>_<date>_<commit>.json"
            path = f"bench-results/{name}"
            assert path in tracked, f"{heading!r}: {path} is quoted but not committed"
            version = json.loads((REPO / path).read_text()).get("schema_version")
            assert isinstance(version, int) and version >= 1, path  # each benchmark versions its own format


def test_committed_results_are_named_by_date_and_parse():
    for path in sorted(_tracked()):
        assert NAME.match(Path(path).name), f"{path} is not <benchmark>_<date>_<commit>.json"
        assert "schema_version" in json.loads((REPO / path).read_text()), path


def test_the_check_catches_a_section_without_results():
    text = ("# B\n\n## good\n\n1.2x (`bench-results/x_2026-01-01_0000000.json`)\n\n"
            "## old\n\n_No committed result: old._ 1.3x\n\n## bad\n\nfigures, no file\n")
    assert _unbacked(text) == ["## old", "## bad"]
