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


# ---- every figure quoted beside a result file occurs in it ---- #

#: a quoted figure: a number with a fractional part (results are measured, counts and sizes are settings),
#: optionally followed by ``%``; thousands separators allowed
FIGURE = re.compile(r"(?<![\w.§/#-])([+\-−]?\d{1,3}(?:,\d{3})*\.\d+|[+\-−]?\d+\.\d+)(?![\w.]*\d)(\s?%|x\b|(?=[-–]\d[\d.]*x\b))?")
#: spans whose numbers are not quoted results: inline code, links, result file names, versions (2.60.0)
NOT_FIGURES = re.compile(r"`[^`]*`|\]\([^)]*\)|bench-results/\S+|\d+\.\d+\.\d+"
                         r"|\b(?:Python|CUDA|Ray|torch|TorchRec|MLflow|driver) \d+\.\d+")
#: a figure's scales from a JSON value: as is, percent, milli/kilo, mega, Mi/Gi, and for a percentage the
#: relative difference from 1 a ratio stands for (1.12 -> 12 %, 0.97 -> -3 %)
SCALES = (1.0, 100.0, 1e3, 1e-3, 1e-6, 1e6, 1e-9, 2.0 ** -20, 2.0 ** -30)
#: a ratio is looked for between two values of one key only where the key has at most this many values (a
#: row per side or per setting); between every pair of a long series nearly any figure would be found
MAX_SERIES = 60


def _blocks(text: str):
    """(first line number, text) of each paragraph or table outside code fences; a heading ends a block and is
    an empty one (so a table's caption is looked for within its section)."""
    block, start, fenced = [], 0, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            line = ""
        if fenced or not line.strip() or line.startswith("#"):
            if block:
                yield start, "\n".join(block)
            if line.startswith("#"):
                yield number, ""
            block = []
            continue
        if not block:
            start = number
        block.append(line)
    if block:
        yield start, "\n".join(block)


def _numbers(doc) -> list:
    """Every number in a JSON document (strings that hold numbers too: a figure is a figure)."""
    out = []
    stack = [doc]
    while stack:
        x = stack.pop()
        if isinstance(x, bool) or x is None:
            continue
        if isinstance(x, (int, float)):
            out.append(float(x))
        elif isinstance(x, str):
            out += [float(m.replace(",", "")) for m in re.findall(r"-?\d[\d,]*\.?\d*(?:e-?\d+)?", x)[:50]
                    if re.fullmatch(r"-?\d+(?:\.\d*)?(?:e-?\d+)?", m.replace(",", ""))]
        elif isinstance(x, dict):
            stack += list(x.values())
        elif isinstance(x, list):
            stack += x
    return out


def _by_key(doc) -> dict:
    """key -> the numbers found under that key anywhere in a JSON document (a ratio is quoted between two)."""
    out: dict = {}
    stack = [("", doc)]
    while stack:
        key, x = stack.pop()
        if isinstance(x, dict):
            stack += list(x.items())
        elif isinstance(x, list):
            stack += [(key, v) for v in x]
        elif isinstance(x, (int, float)) and not isinstance(x, bool) and x:
            out.setdefault(key, []).append(float(x))
    return out


def _between(docs: list, difference: bool = False) -> set:
    """Ratios between two values of one key (``37.6 ms against 39.7 ms, 1.05x``; their medians' included) or
    of one object (``planner/meas``), or (``difference``) their differences (``bf16 - fp32 = +0.0010``)."""
    import statistics

    groups = []
    for doc in docs:
        groups += [vals + [statistics.median(vals)] for vals in _by_key(doc).values() if len(vals) <= MAX_SERIES]
        stack = [doc]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                groups.append([float(v) for v in x.values() if isinstance(v, (int, float)) and not isinstance(v, bool)])
            if isinstance(x, (dict, list)):
                stack += list(x.values()) if isinstance(x, dict) else x
    out = set()
    for vals in groups:
        out |= {a - b for a in vals for b in vals} if difference else {a / b for a in vals for b in vals if b}
    return out


def _candidates(values: list, percent: bool) -> set:
    """The figures ``values`` can be quoted as (:data:`SCALES`; for a percentage also ``(v - 1) * 100``)."""
    out = {v * s for v in values for s in SCALES}
    if percent:
        out |= {(v - 1.0) * 100.0 for v in values} | {(1.0 - v) * 100.0 for v in values}
    out |= {-v for v in out}
    return out


def _matches(figure: str, candidates) -> bool:
    """Whether a value rounds to ``figure`` at the figure's precision (round-half either way, or cut)."""
    digits = len(figure.split(".")[1])
    x = float(figure)
    tol = 0.5 * 10 ** -digits * (1 + 1e-9)
    return any(abs(c - x) <= tol or 0 <= abs(x) - abs(c) < 2 * tol and c * x >= 0 for c in candidates)


def unbacked_figures(text: str, results: dict) -> list:
    """``"line N: figure"`` for each figure of a block naming result files (``results``: name -> parsed JSON)
    that no value of those files rounds to; a block naming a file that is not in ``results`` is reported."""
    import functools

    problems = []
    cache: dict = {}
    blocks = list(_blocks(text))
    ratios = functools.lru_cache(None)(lambda names: _between([results[n] for n in names]))
    differences = functools.lru_cache(None)(lambda names: _between([results[n] for n in names], difference=True))
    # a percentage quoted from a ratio: 1.0085 is "0.85 % off", 0.97 "3 % less", 0.25 "25 %"
    percent_of = functools.lru_cache(None)(lambda names: {f(r) for r in ratios(names) for f in (
        lambda r: (r - 1.0) * 100.0, lambda r: (1.0 - r) * 100.0, lambda r: r * 100.0)})
    for i, (start, block) in enumerate(blocks):
        named = sorted(set(RESULT.findall(block)))
        if not named and block.startswith("|"):  # a table is quoted from the file its caption names
            named = sorted({n for _, b in blocks[max(i - 1, 0):i] + blocks[i + 1:i + 2] for n in RESULT.findall(b)})
        if not named:
            continue
        missing = [n for n in named if n not in results]
        if missing:
            problems += [f"line {start}: {n} is named but not committed" for n in missing]
            continue
        key = tuple(named)
        if key not in cache:
            values = [v for n in named for v in _numbers(results[n])]
            cache[key] = (_candidates(values, False), _candidates(values, True), [results[n] for n in named])
        plain, percent = cache[key][:2]
        for offset, line in enumerate(block.splitlines()):
            own = sorted(set(RESULT.findall(line))) if line.startswith("|") else []
            if own and not set(own) - set(results):  # a table row naming its own results is checked on them
                values = [v for n in own for v in _numbers(results[n])]
                checked, sources = (_candidates(values, False), _candidates(values, True)), own
                docs = [results[n] for n in own]
            else:
                checked, sources, docs = (plain, percent), named, cache[key][2]
            for m in FIGURE.finditer(NOT_FIGURES.sub(" ", line)):
                figure = m.group(1).replace(",", "").replace("−", "-").lstrip("+")
                suffix = None if m.group(2) is None else m.group(2).strip()  # "%", "x", "" (a range's start)
                if not _matches(figure, checked[1] if suffix == "%" else checked[0]) \
                        and not _matches(figure, (percent_of if suffix == "%" else ratios)(tuple(sources))) \
                        and not (m.group(1)[0] in "+-−" and _matches(figure, differences(tuple(sources)))):
                    problems.append(f"line {start + offset}: {m.group(0).strip()} is in none of {', '.join(sources)}")
    return problems


def _doc_pages():
    return sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]


def test_every_figure_beside_a_result_file_occurs_in_it():
    tracked = _tracked()
    results = {Path(p).name: json.loads((REPO / p).read_text()) for p in tracked}
    problems, blocks = [], 0
    for page in _doc_pages():
        text = page.read_text()
        blocks += sum(1 for _, b in _blocks(text) if RESULT.search(b))
        problems += [f"{page.relative_to(REPO)} {p}" for p in unbacked_figures(text, results)]
    assert blocks > 30  # the pages really were read
    assert not problems, ("figures quoted beside a result file that the file does not hold (quote the file's "
                          "figure, name the file that holds it, or drop it):\n" + "\n".join(problems))


def test_the_figure_check_fails_on_a_made_up_number():
    results = {"x_2026-01-01_0000000.json": {"schema_version": 1, "rows": [{"auc": 0.91234, "ratio": 1.1234,
                                                                            "ms": 0.0421, "bytes": 6_390_123}]}}
    good = ("DCN-v2 reached 0.9123 (`bench-results/x_2026-01-01_0000000.json`), 1.12x the other, 12.3 % more,\n"
            "42.1 ms a step, 6.39 MB, in 2 runs of 400,000 rows; `train.dense_lr: 0.05`.\n")
    assert unbacked_figures(good, results) == []
    made_up = good.replace("0.9123", "0.9131")
    assert unbacked_figures(made_up, results) == ["line 1: 0.9131 is in none of x_2026-01-01_0000000.json"]
    table = ("| side | AUC |\n|---|---:|\n| a | 0.9123 |\n| b | 0.8883 |\n"
             "(`bench-results/x_2026-01-01_0000000.json`)\n")
    assert unbacked_figures(table, results) == ["line 4: 0.8883 is in none of x_2026-01-01_0000000.json"]
    assert unbacked_figures("0.5 s (`bench-results/y_2026-01-01_0000000.json`)\n", results) == [
        "line 1: y_2026-01-01_0000000.json is named but not committed"]
    assert unbacked_figures("0.8883, no file named here\n", results) == []
