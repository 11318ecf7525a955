"""The two things every benchmark ends with: a JSON result file and a fixed-width table.

Example::

    write_result("bench-results/x.json", {"schema_version": 1, "results": rows})
    print_table(rows, [("method", "<16", "{}"), ("M ids/s", ">10", "{:.2f}")],
                keys=["method", "mips"])
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

#: (header, alignment+width as in format specs, value format)
Column = Tuple[str, str, str]


def write_result(path: str, doc: Dict[str, Any], indent: int = 2) -> str:
    """Writes the benchmark's JSON (creating its folder) and says where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=indent)
    os.replace(tmp, path)
    return path


def format_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column], keys: Sequence[str],
                 title: Optional[str] = None) -> str:
    """One header line and one line per row; ``keys[i]`` is the row key shown in ``columns[i]``."""
    lines: List[str] = [title] if title else []
    lines.append(" ".join(f"{h:{w}}" for h, w, _ in columns))
    for row in rows:
        cells = []
        for (_, width, fmt), key in zip(columns, keys):
            value = row.get(key)
            cells.append(f"{(fmt.format(value) if value is not None else '-'):{width}}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def alternating_rounds(sides: Mapping[str, Callable[[], Any]], rounds: int, iters: int) -> List[Dict[str, Any]]:
    """Times each side ``iters`` calls per round, the sides alternating round by round (so a slow phase of a
    shared host hits all of them); one row per side: median and min seconds per call in ms, and the speedup
    of its median over the first side's."""
    times: Dict[str, List[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            fn()  # warm
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            times[name].append((time.perf_counter() - t0) / iters)
    base = statistics.median(next(iter(times.values())))
    return [{"side": name, "ms": 1e3 * statistics.median(ts), "ms_min": 1e3 * min(ts),
             "speedup": base / statistics.median(ts)} for name, ts in times.items()]


def print_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column], keys: Sequence[str],
                title: Optional[str] = None) -> None:
    print(format_table(rows, columns, keys, title))


def report(path: str, doc: Dict[str, Any], rows: Iterable[Mapping[str, Any]], columns: Sequence[Column],
           keys: Sequence[str], footer: Optional[str] = None, indent: int = 2) -> int:
    """A benchmark's last step: write the JSON, print the table (and a footer line), say where; returns exit code 0."""
    write_result(path, doc, indent=indent)
    print()
    print_table(rows, columns, keys)
    if footer:
        print(footer)
    print(f"wrote {path}")
    return 0


def pool_by_plan(runs: Iterable[Mapping[str, Any]]) -> "tuple[Dict[str, Dict[str, Any]], Dict[str, str]]":
    """Runs of identical plans pooled: (plan key -> {summary, variants, runs, samples_per_s (median)}, variant ->
    its plan's key, the one most of its runs chose, the first of those on a tie). Runs without samples/s or plan
    are left out."""
    import json
    import statistics

    plans: Dict[str, Dict[str, Any]] = {}
    variant_runs: Dict[str, list] = {}
    for r in runs:
        if not r.get("samples_per_s") or not r.get("plan"):
            continue
        key = json.dumps(r["plan"], sort_keys=True)
        p = plans.setdefault(key, {"summary": r.get("plan_summary"), "variants": [], "runs": []})
        if r["variant"] not in p["variants"]:
            p["variants"].append(r["variant"])
        p["runs"].append(r["samples_per_s"])
        variant_runs.setdefault(r["variant"], []).append(key)
    for p in plans.values():
        p["samples_per_s"] = statistics.median(p["runs"])
    return plans, {v: max(keys, key=keys.count) for v, keys in variant_runs.items()}
