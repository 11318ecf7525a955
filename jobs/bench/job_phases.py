"""Where a whole job's wall time goes: the default job run several times into one output folder.

    python jobs/bench/job_phases.py --runs 4 --out bench-results/job_phases_<date>_<commit>.json

The config (default jobs/configs/synth_small.yaml, with ``train.epochs=1``; ``--data`` generated with ``rayemb
gen-data --rows 400000`` when absent) runs ``--runs`` times on one local Ray cluster started before the first
(as a job submitted to a running cluster), every run into the same fresh output folder: the first measures
the calibration and probes the plans, the later ones find both kept there (``planner.calibration_max_age_h``).
Each run's phases come from the job itself (``phase_s.*``: rayemb.train.driver.phases). Writes ``{"schema_version": 1,
"config", "overrides", "data", "runs": [{"run", "phases", "calibration_source", "probe_kept", "wall_s",
"outside_steps_fraction", "valid_auc"}], "warm": {phase: {"median", "min", "max"}}, "target"}`` after every run
and prints a table. ``target``: the warm runs' median share of the wall outside training steps against 40 %.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Optional

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, spread, write_result  # noqa: E402

PHASES = ("checks", "ray", "statistics", "plan", "tracking", "workers", "model", "data", "steps",
          "validation_and_checkpoints", "end", "wall")
COLUMNS = [("run", ">3", "{}"), *[(p[:10], ">10", "{:.1f}") for p in PHASES], ("outside", ">7", "{:.0%}"),
           ("calibration", ">11", "{}")]
KEYS = ["run", *PHASES, "outside_steps_fraction", "calibration_source"]
TARGET = 0.40


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(_REPO, "jobs", "configs", "synth_small.yaml"))
    p.add_argument("--data", default=os.path.join(_REPO, "data", "synth_small"))
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import ray

    from rayemb.config import load_config
    from rayemb.data.synthetic import SyntheticSpec, generate
    from rayemb.train.driver.trainer import run_training

    data = os.path.abspath(args.data)
    if not os.path.exists(os.path.join(data, "schema.yaml")):
        generate(SyntheticSpec(rows=args.rows), data)
    outputs = tempfile.mkdtemp(prefix="rayemb-phases-")
    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")
    runs: List[Dict[str, Any]] = []

    def document() -> Dict[str, Any]:
        warm = [r for r in runs[1:] if "error" not in r]
        summary = {ph: spread([r["phases"].get(ph) for r in warm]) for ph in (*PHASES, "outside_steps_fraction")}
        median = summary["outside_steps_fraction"].get("median")
        return {"schema_version": 1, "config": args.config, "overrides": ["train.epochs=1", *args.set],
                "data": data, "runs": runs, "warm": summary,
                "target": {"rule": f"warm runs' median share of the wall outside steps <= {TARGET:.0%}",
                           "value": median, "verdict": "PASS" if median is not None and median <= TARGET
                           else "FAIL"}}

    try:
        for i in range(args.runs):
            print(f"[{i + 1}/{args.runs}]", flush=True)
            cfg = load_config(args.config, ["train.epochs=1", *args.set, f"data.path={data}",
                                            f"tracking.output_dir={outputs}"])
            try:
                r = run_training(cfg, new_run=True)  # each repeat is a run of its own
            except Exception as e:  # noqa: BLE001 - recorded: the warm summary then lacks it
                runs.append({"run": i, "error": f"{type(e).__name__}: {e}"})
                write_result(args.out, document())
                continue
            phases = {k[len("phase_s."):]: v for k, v in r.metrics.items() if k.startswith("phase_s.")}
            runs.append({"run": i, "phases": phases, "wall_s": r.wall_time_s,
                         "outside_steps_fraction": phases.get("outside_steps_fraction"),
                         "calibration_source": (r.plan.get("calibration") or {}).get("source"),
                         "probed_step_time_s": r.plan.get("probed_step_time_s"),
                         "valid_auc": r.metrics.get("valid_auc"), "run_id": r.run_id})
            write_result(args.out, document())
    finally:
        shutil.rmtree(outputs, ignore_errors=True)
    out = document()
    rows = [{"run": r["run"], **r["phases"], "outside_steps_fraction": r["outside_steps_fraction"],
             "calibration_source": r["calibration_source"]} for r in runs if "error" not in r]
    t = out["target"]
    return report(args.out, out, rows, COLUMNS, KEYS, footer=f"\n{t['rule']}: {t['value']} {t['verdict']}")


if __name__ == "__main__":
    sys.exit(main())
