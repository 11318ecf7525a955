"""Does a change plan the default job differently? The plan.json of two commits, for the same calibration.

    python jobs/bench/plan_identity.py --old b068381 --new HEAD --out bench-results/plan_identity_<date>_<commit>.json

A refactoring of the driver must leave the plan a job trains alone. Each commit is checked out into its own git
worktree and runs the default synthetic job (jobs/configs/synth_small.yaml on ``--data``) through its own
``rayemb train``, as ``jobs/bench/regression.py`` does, a few steps long. The old commit runs first and measures
(calibration and plan probe); its kept measurements (``<output_dir>/calibrations``) are copied into the new
commit's output folder, so the new one plans from the same figures (its plan.json says ``cached``).

The two plan.json files are compared key by key, leaving out what depends on the moment rather than on the code:
how long the calibration and the plan probe took, how old the kept measurements are and their source, and the
memory Ray reports free on the node (``topology.ddr_bytes``, the ranks' ``capacity_bytes``). Any other difference is listed and FAILs the verdict, as does a run that failed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, write_result  # noqa: E402
from regression import _rev, commit_pair_arguments, worktrees  # noqa: E402
from throughput import _hermetic_env, common_overrides, ensure_data  # noqa: E402

#: what a plan.json holds that differs from one run to the next on the same code
VOLATILE = ("calibration.age_s", "calibration.source", "calibration.seconds", "plan_probe.age_s",
            "plan_probe.source", "plan_probe.seconds", "topology.ddr_bytes", "capacity_bytes",
            # where the learned step ratio is kept and how many jobs it holds; what it does to the prediction
            # (predicted_step_time_s) is compared
            "learned_ratio", "calibration.step_ratio")
COLUMNS = [("side", ">4", "{}"), ("commit", ">9", "{}"), ("rc", ">3", "{}"), ("calibration", ">12", "{}"),
           ("predicted ms", ">13", "{:.3f}"), ("placements", "<40", "{}")]
KEYS = ["side", "commit", "returncode", "calibration_source", "predicted_ms", "placements"]


def flatten(doc: Any, prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}, "c": [{"d": 2}]}`` -> ``{"a.b": 1, "c.0.d": 2}``."""
    if isinstance(doc, dict):
        out: Dict[str, Any] = {}
        for k, v in doc.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(doc, list):
        out = {}
        for i, v in enumerate(doc):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: doc}


def differences(old: Dict[str, Any], new: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Keys whose values differ (or exist on one side only), volatile keys left out."""
    a, b = flatten(old), flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if any(key == v or key.endswith("." + v) or key.startswith(v + ".") for v in VOLATILE):
            continue
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            out.append({"key": key, "old": a.get(key, "<absent>"), "new": b.get(key, "<absent>")})
    return out


def run_job(tree: str, side: str, out_dir: str, args: argparse.Namespace, tmp: str) -> Dict[str, Any]:
    overrides = common_overrides(args.data, out_dir, args.steps, args.window, args.batch_size, 2, f"plan-{side}")
    cmd = [sys.executable, "-m", "rayemb.cli", "train", "--config",
           os.path.join(tree, "jobs", "configs", "synth_small.yaml")]
    for o in overrides:
        cmd += ["--set", o]
    env = _hermetic_env(os.path.join(tmp, f"e{side[0]}"))  # short: Ray's socket paths must fit 107 bytes
    env["PYTHONPATH"] = tree
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    plans = sorted(glob.glob(os.path.join(out_dir, "jobs", "*", "plan.json")))
    row: Dict[str, Any] = {"side": side, "returncode": p.returncode, "plan": None}
    if p.returncode == 0 and plans:
        with open(plans[-1]) as f:
            row["plan"] = json.load(f)
    else:
        row["error"] = (p.stdout + p.stderr)[-3000:]
    return row


def main(argv: Optional[List[str]] = None) -> int:
    args = commit_pair_arguments(__doc__, steps=10, window=5).parse_args(argv)
    ensure_data(args.data, args.gen_rows)
    commits = {"old": _rev(args.old), "new": _rev(args.new)}
    tmp = tempfile.mkdtemp(prefix="pi-")
    rows: List[Dict[str, Any]] = []
    with worktrees(commits, tmp) as trees:
        outs = {side: os.path.join(tmp, f"out-{side}") for side in commits}
        print(f"old ({commits['old']}): measures and plans", flush=True)
        rows.append(run_job(trees["old"], "old", outs["old"], args, tmp))
        kept = os.path.join(outs["old"], "calibrations")
        if os.path.isdir(kept):
            # the measurements, not the old job's learned step ratio (``*.ratio``): that would scale the new
            # job's prediction by the old one's history, not by the code
            shutil.copytree(kept, os.path.join(outs["new"], "calibrations"), ignore=shutil.ignore_patterns("*.ratio"))
        print(f"new ({commits['new']}): plans from the old one's kept measurements", flush=True)
        rows.append(run_job(trees["new"], "new", outs["new"], args, tmp))
    problems = [f"{r['side']}: run failed (exit {r['returncode']})" for r in rows if r["plan"] is None]
    diffs = differences(rows[0]["plan"], rows[1]["plan"]) if not problems else []
    if not problems and rows[1]["plan"].get("calibration", {}).get("source") != "cached":
        problems.append("new: did not plan from the kept calibration (calibration.source is not 'cached')")
    for r in rows:
        r["commit"] = commits[r["side"]]
        plan = r["plan"] or {}
        r["calibration_source"] = plan.get("calibration", {}).get("source")
        r["predicted_ms"] = 1e3 * plan["predicted_step_time_s"] if "predicted_step_time_s" in plan else None
        counts: Dict[str, int] = {}
        for t in plan.get("tables", {}).values():
            counts[t["placement"]] = counts.get(t["placement"], 0) + 1
        r["placements"] = ", ".join(f"{p} x{n}" for p, n in sorted(counts.items()))
    verdict = "PASS" if not problems and not diffs else "FAIL"
    doc = {"schema_version": 1, "commits": commits, "data": args.data, "steps": args.steps, "volatile": list(VOLATILE),
           "runs": rows, "differences": diffs, "problems": problems, "verdict": verdict}
    write_result(args.out, doc)
    footer = "\n".join([f"{d['key']}: {d['old']!r} -> {d['new']!r}" for d in diffs[:30]] + problems
                       + [f"plan.json identical but for {', '.join(VOLATILE)}: {verdict}" if not diffs and not problems
                          else f"{len(diffs)} difference(s): {verdict}"])
    return report(args.out, doc, rows, COLUMNS, KEYS, footer="\n" + footer)


if __name__ == "__main__":
    sys.exit(main())
