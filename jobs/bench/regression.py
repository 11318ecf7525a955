"""DLRM training throughput of two commits, interleaved: did a change make the step slower?

    python jobs/bench/regression.py --old c25cd18 --new HEAD --out bench-results/regression_<date>_<commit>.json

Each commit is checked out into its own git worktree and trained through its own ``rayemb train`` (the
worktree first on ``PYTHONPATH``, the same virtual environment), the way ``jobs/bench/throughput.py``
trains its rayemb rows: the default synthetic job (jobs/configs/synth_small.yaml on ``--data``), one epoch
of a warm-up window + ``--steps`` steps, a private local Ray and a hermetic HOME/TMPDIR per run, throughput
= the median of the run's per-window ``samples_per_s`` after the warm-up window, read from its MLflow store.
The plan is the cost model's with its built-in constants (``planner.calibrate=false``), the same for both
commits, so that what differs between them is the code that trains it, not a plan choice.

The commits alternate, round r starting with the old one when r is even, ``--repeats`` rounds (default 5).
A side is the median of its runs with their min-max; the verdict is new/old >= ``--min-ratio`` (0.97) on
the medians, and FAILs when a side has a failed run or fewer than 5 runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Optional

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, spread, write_result  # noqa: E402
from throughput import _hermetic_env, _read_mlflow, common_overrides, ensure_data, steady_median  # noqa: E402

COLUMNS = [("side", ">4", "{}"), ("commit", ">9", "{}"), ("runs", ">5", "{}"), ("samples/s", ">10", "{:,.0f}"),
           ("min", ">10", "{:,.0f}"), ("max", ">10", "{:,.0f}")]
KEYS = ["side", "commit", "runs", "median", "min", "max"]
MIN_RUNS = 5


def _rev(ref: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", ref], cwd=_REPO, check=True, capture_output=True,
                          text=True).stdout.strip()


def run_once(tree: str, side: str, r: int, args: argparse.Namespace, tmp: str) -> Dict[str, Any]:
    out_dir = os.path.join(tmp, f"{side}-{r}")
    overrides = common_overrides(args.data, out_dir, args.steps, args.window, args.batch_size, 2,
                                 f"{side}-r{r}") + ["planner.calibrate=false"]
    cmd = [sys.executable, "-m", "rayemb.cli", "train", "--config", os.path.join(tree, "jobs", "configs",
                                                                                  "synth_small.yaml")]
    for o in overrides:
        cmd += ["--set", o]
    env = _hermetic_env(os.path.join(tmp, f"e{side[0]}{r}"))  # short: Ray's socket paths must fit 107 bytes
    env["PYTHONPATH"] = tree  # this commit's rayemb, not the checkout the script runs from
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    run: Dict[str, Any] = {"side": side, "repeat": r, "returncode": p.returncode, "wall_s": time.monotonic() - t0,
                           "samples_per_s": None}
    db = os.path.join(out_dir, "mlflow.db")
    if p.returncode == 0 and os.path.exists(db):
        _, reports, _ = _read_mlflow(f"sqlite:///{db}", None)
        run["samples_per_s"] = steady_median(reports)
        run["step_time_s"] = steady_median(reports, "step_time_s")
    if run["samples_per_s"] is None:
        run["error"] = (p.stdout + p.stderr)[-2000:]
    return run


def summarize(runs: List[Dict[str, Any]], commits: Dict[str, str], min_ratio: float) -> Dict[str, Any]:
    rows = {}
    for side in ("old", "new"):
        mine = [r for r in runs if r["side"] == side]
        rows[side] = {"side": side, "commit": commits[side], "runs": len(mine),
                      "failed": sum(r["samples_per_s"] is None for r in mine),
                      **spread(r["samples_per_s"] for r in mine)}
    problems = [f"{s}: {row['failed']} failed run(s)" for s, row in rows.items() if row["failed"]]
    problems += [f"{s}: {row['runs']} runs (< {MIN_RUNS})" for s, row in rows.items() if row["runs"] < MIN_RUNS]
    ratio = (rows["new"]["median"] / rows["old"]["median"]
             if rows["new"].get("median") and rows["old"].get("median") else None)
    ok = not problems and ratio is not None and ratio >= min_ratio
    return {"rows": rows, "ratio": ratio, "rule": f"new / old >= {min_ratio}", "problems": problems,
            "verdict": "PASS" if ok else "FAIL"}


def commit_pair_arguments(description: str, steps: int, window: int) -> argparse.ArgumentParser:
    """The arguments of a benchmark that runs the default job at two commits (this one, jobs/bench/plan_identity.py)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the baseline commit")
    ap.add_argument("--new", default="HEAD", help="the commit under test (default HEAD)")
    ap.add_argument("--data", default=os.path.join(_REPO, "data", "synth_small"))
    ap.add_argument("--gen-rows", type=int, default=400000)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--window", type=int, default=window)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--out", required=True)
    return ap


@contextlib.contextmanager
def worktrees(commits: Dict[str, str], tmp: str) -> Iterator[Dict[str, str]]:
    """Each side's commit checked out in a git worktree under ``tmp``, removed (with ``tmp``) at exit."""
    trees: Dict[str, str] = {}
    try:
        for side, commit in commits.items():
            trees[side] = os.path.join(tmp, f"tree-{side}")
            subprocess.run(["git", "worktree", "add", "--detach", trees[side], commit], cwd=_REPO, check=True,
                           capture_output=True)
        yield trees
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=_REPO, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Optional[List[str]] = None) -> int:
    ap = commit_pair_arguments(__doc__, steps=200, window=20)
    ap.add_argument("--repeats", type=int, default=MIN_RUNS)
    ap.add_argument("--min-ratio", type=float, default=0.97)
    args = ap.parse_args(argv)
    ensure_data(args.data, args.gen_rows)
    commits = {"old": _rev(args.old), "new": _rev(args.new)}
    tmp = tempfile.mkdtemp(prefix="rg-")
    with worktrees(commits, tmp) as trees:
        runs: List[Dict[str, Any]] = []
        for r in range(args.repeats):
            for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                print(f"round {r + 1}/{args.repeats}: {side} ({commits[side]})", flush=True)
                runs.append(run_once(trees[side], side, r, args, tmp))
                write_result(args.out, {"schema_version": 1, "commits": commits, "runs": runs, "complete": False,
                                        **summarize(runs, commits, args.min_ratio)})
        doc = {"schema_version": 1, "commits": commits, "steps": args.steps, "window": args.window,
               "batch_size": args.batch_size, "data": args.data, "runs": runs, "complete": True,
               **summarize(runs, commits, args.min_ratio)}
    footer = (f"\nnew / old = {doc['ratio']:.3f} ({doc['rule']}) {doc['verdict']}" if doc["ratio"] is not None
              else f"\n{doc['verdict']}: {doc['problems']}")
    return report(args.out, doc, list(doc["rows"].values()), COLUMNS, KEYS, footer=footer)


if __name__ == "__main__":
    sys.exit(main())
