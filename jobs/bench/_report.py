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


def spread(values: Iterable[Optional[float]]) -> Dict[str, Any]:
    """``{"median", "min", "max", "n"}`` of the values that are not None (None figures where there are none)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def _plan_key(plan: Mapping[str, str]) -> str:
    return json.dumps(dict(plan), sort_keys=True)


def _mode(keys: Sequence[str]) -> str:
    """The most frequent key, the first of those on a tie."""
    return max(keys, key=keys.count)


def auto_plan_check(runs: Iterable[Mapping[str, Any]], auto: str = "auto") -> Dict[str, Any]:
    """Whether auto trained the fastest plan, and how its own runs compare with forced runs of that same plan.

    ``runs``: one comparison's runs (``variant``, ``plan``: {table: placement}, ``plan_summary``,
    ``samples_per_s``); failed runs (no samples/s or plan) are left out. A row is a variant; its median
    samples/s ranks it and its plan is the one most of its runs trained. Returns ``auto_chose_fastest_plan``
    ("yes": auto's plan is the fastest row's plan, auto's own row included; "no" also when auto has no run),
    the fastest row and both plans, and ``auto_vs_same_plan``: auto's runs of its plan against every other
    row's runs of that plan, ``ratio`` of their medians with each side's median, min and max (None when no
    other row trained it). Runs of one plan are never pooled across rows: a row of auto's slower runs
    reads slower whichever forced row ran the same placements faster.
    """
    by_variant: Dict[str, List[Mapping[str, Any]]] = {}
    for r in runs:
        if r.get("samples_per_s") and r.get("plan"):
            by_variant.setdefault(r["variant"], []).append(r)
    summaries = {_plan_key(r["plan"]): r.get("plan_summary") for rs in by_variant.values() for r in rs}
    plan_of = {v: _mode([_plan_key(r["plan"]) for r in rs]) for v, rs in by_variant.items()}
    median = {v: statistics.median(r["samples_per_s"] for r in rs) for v, rs in by_variant.items()}
    fastest = max(median, key=median.get) if median else None
    out: Dict[str, Any] = {"auto_chose_fastest_plan": "no", "fastest_row": fastest,
                           "fastest_plan": summaries.get(plan_of[fastest]) if fastest else None,
                           "auto_plan": None, "auto_vs_same_plan": None}
    if auto not in plan_of:
        return out
    mine = plan_of[auto]
    out["auto_plan"] = summaries.get(mine)
    out["auto_chose_fastest_plan"] = "yes" if fastest is not None and plan_of[fastest] == mine else "no"
    auto_runs = [r["samples_per_s"] for r in by_variant[auto] if _plan_key(r["plan"]) == mine]
    forced = {v: [r["samples_per_s"] for r in rs if _plan_key(r["plan"]) == mine]
              for v, rs in by_variant.items() if v != auto}
    forced = {v: vals for v, vals in forced.items() if vals}
    if forced:
        a, f = spread(auto_runs), spread(x for vals in forced.values() for x in vals)
        out["auto_vs_same_plan"] = {"forced_rows": sorted(forced), "auto": a, "forced": f,
                                    "ratio": a["median"] / f["median"]}
    return out


def auto_plan_line(check: Mapping[str, Any]) -> str:
    """One printed line of :func:`auto_plan_check`."""
    line = (f"auto chose the fastest plan: {check['auto_chose_fastest_plan']} (auto's plan: "
            f"{check.get('auto_plan') or '-'}; fastest row {check.get('fastest_row') or '-'}: "
            f"{check.get('fastest_plan') or '-'})")
    same = check.get("auto_vs_same_plan")
    if same:
        a, f = same["auto"], same["forced"]
        line += (f"; auto's runs of its plan {same['ratio']:.3f}x the forced runs of it ({', '.join(same['forced_rows'])}): "
                 f"median {a['median']:,.0f} [{a['min']:,.0f}-{a['max']:,.0f}] vs {f['median']:,.0f} "
                 f"[{f['min']:,.0f}-{f['max']:,.0f}] samples/s")
    return line


def uncalibrated(run: Mapping[str, Any]) -> bool:
    """Whether a run's predicted step was priced with the built-in constants, not the step-time model's figure
    for the cluster: plan.json ``prediction`` says so; in a plan from before it, ``calibration.source`` does."""
    if run.get("prediction"):
        return run["prediction"] == "uncalibrated"
    cal = run.get("calibration")
    return isinstance(cal, Mapping) and cal.get("source", "default") == "default"


def link_measured(run: Mapping[str, Any]) -> bool:
    """Whether a run's prediction priced its plan with the link measured and the compute figures built in
    (plan.json ``prediction: link-measured``: every table pinned, nothing to calibrate the rest for). It is the
    job's prediction for the cluster, judged like a calibrated one, and listed so a reader knows its kind."""
    return run.get("prediction") == "link-measured"


def row_problem(row: Optional[Mapping[str, Any]], min_runs: int, needs_prediction: bool) -> Optional[str]:
    """Why a row cannot carry a verdict, or None: it is missing, a run of it failed, none succeeded, it has
    fewer runs than ``min_runs``, or (``needs_prediction``) fewer than ``min_runs`` of its runs have a
    predicted-over-measured step (``predicted_runs``): a median ratio over 1 run of 5 is 1 run's figure. A row
    whose runs' predictions were uncalibrated (built-in constants) is no broken row: its throughput stands, and
    only :func:`prediction_problem` holds it against the prediction verdict."""
    if row is None:
        return "missing"
    if row.get("failed"):
        return f"{row['failed']} failed run(s)"
    runs = int(row.get("runs") or 0)
    if runs == 0 or row.get("samples_per_s") is None:
        return "no run"
    if runs < min_runs:
        return f"{runs} run(s), fewer than the {min_runs} it needs"
    if needs_prediction and _uncalibrated_problem(row, min_runs) is None:
        predicted = _predicted_runs(row)
        if predicted == 0:
            return "no predicted step time"
        if predicted < min_runs:
            return f"{predicted} of {runs} run(s) with a predicted step time, fewer than the {min_runs} it needs"
    return None


def _predicted_runs(row: Mapping[str, Any]) -> int:
    return int(row.get("predicted_runs") or 0) if row.get("predicted_over_measured") is not None else 0


def _uncalibrated_problem(row: Mapping[str, Any], min_runs: int) -> Optional[str]:
    """The row's runs lack the model's prediction because some were priced with the built-in constants."""
    runs, predicted = int(row.get("runs") or 0), _predicted_runs(row)
    if row.get("uncalibrated_runs") and predicted < min_runs:
        return f"uncalibrated prediction in {row['uncalibrated_runs']} of {runs} run(s) (built-in constants)"
    return None


def prediction_problem(row: Optional[Mapping[str, Any]], min_runs: int) -> Optional[str]:
    """Why a row cannot carry the prediction verdict, or None: :func:`row_problem`'s reasons, or runs whose
    prediction was uncalibrated (``uncalibrated_runs``: built-in constants), which the prediction verdict lists
    and FAILs on, never judging their figure as the step-time model's."""
    return row_problem(row, min_runs, needs_prediction=True) or (
        None if row is None else _uncalibrated_problem(row, min_runs))
