"""The two things every benchmark ends with: a JSON result file and a fixed-width table.

Example::

    write_result("bench-results/x.json", {"schema_version": 1, "results": rows})
    print_table(rows, [("method", "<16", "{}"), ("M ids/s", ">10", "{:.2f}")],
                keys=["method", "mips"])
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

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
