"""A job's fixed cost next to Ray Train's own: ``rayemb train`` against a bare ``TorchTrainer``, same workers.

    python jobs/bench/fixed_cost.py --repeats 3 --out bench-results/fixed_cost_<date>_<commit>.json

Starts one local Ray on 127.0.0.1 (stopped by its handle at the end) and, ``--repeats`` times, interleaved:

* ``cold``: ``rayemb train --new-run`` of the config (default jobs/configs/synth_small.yaml, with
  ``train.epochs=1`` and ``train.max_steps_per_epoch=--steps``) into a fresh output folder;
* ``warm``: the same command again into that folder (its kept statistics, calibration and plan probe);
* ``bare``: a ``TorchTrainer`` whose loop does nothing, with the job's ScalingConfig (its workers, their CPUs
  as the job resolves them on this cluster, the placement strategy).

Each is its own process joining the cluster (``RAY_ADDRESS``), timed from its start to its exit, with the
host's load averages before and after it (``load_avg_before``, ``load_avg_after``: figures taken on a busy shared
host say so). A job's phases come from its ``--result-json`` (``phase_s.*``: rayemb.train.driver.phases; a job
whose plan measures nothing launches its workers first, and its ``plan`` and ``tracking`` then run beside
``workers``, ``plan_wait`` being what of them the workers waited for). ``--data`` is generated
with ``rayemb gen-data --rows 400000`` when absent. Writes ``{"schema_version": 1, "config", "overrides",
"data", "ray", "scaling", "runs": [{"repeat", "kind", "wall_s", "phases"}], "summary": {kind: {phase:
spread}}, "rayemb_fixed_minus_ray_s": {"warm", "cold"}, "target"}`` after every run and prints a table.
``rayemb_fixed_minus_ray_s``: the median over repeats of (job wall - its steps) - the same repeat's bare wall.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, spread, write_result  # noqa: E402

PHASES = ("checks", "ray", "statistics", "plan", "tracking", "workers", "plan_wait", "model", "data", "steps",
          "validation_and_checkpoints", "end", "wall")
KINDS = ("bare", "cold", "warm")
#: the fixed cost a job may add to Ray Train's own, in seconds
TARGETS = {"warm": 5.0, "cold": 30.0}
COLUMNS = [("kind", "<5", "{}"), ("n", ">2", "{}"), ("process", ">8", "{:.1f}"),
           *[(p[:10], ">10", "{:.1f}") for p in PHASES]]
KEYS = ["kind", "n", "process", *PHASES]
#: what a job run through this benchmark must not inherit from the shell
UNSET_ENV = ("MLFLOW_TRACKING_URI", "RAYEMB_WORKSPACE", "RAYEMB_FAULT_INJECTION", "RAY_AUTH_TOKEN",
             "RAY_AUTH_TOKEN_PATH")


def bare_trainer(workers: int, cpus_per_worker: float, strategy: str, storage: str) -> None:
    """Ray Train alone: the job's ScalingConfig, a loop that does nothing (run in a process of its own)."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="WARNING")
    TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=workers, use_gpu=False,
                                                            resources_per_worker={"CPU": cpus_per_worker},
                                                            placement_strategy=strategy),
                 run_config=RunConfig(name="bare", storage_path=storage)).fit()


def _timed(cmd: List[str], env: Dict[str, str], log: str) -> Dict[str, Any]:
    load_before = os.getloadavg()
    t0 = time.monotonic()
    with open(log, "w") as f:
        p = subprocess.run(cmd, cwd=_REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    out: Dict[str, Any] = {"wall_s": time.monotonic() - t0, "rc": p.returncode,
                           # the host's 1/5/15-minute load averages around the run (a shared host's other work)
                           "load_avg_before": list(load_before), "load_avg_after": list(os.getloadavg()),
                           "host_cpus": os.cpu_count()}
    if p.returncode:
        with open(log) as f:
            out["error"] = f.read()[-2000:]
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(_REPO, "jobs", "configs", "synth_small.yaml"))
    p.add_argument("--data", default=os.path.join(_REPO, "data", "synth_small"))
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=20, help="train.max_steps_per_epoch of the job (one epoch)")
    p.add_argument("--num-cpus", type=int, default=None, help="the local Ray's CPUs (default: this machine's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=False)
    p.add_argument("--bare", nargs=4, metavar=("WORKERS", "CPUS", "STRATEGY", "STORAGE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.bare:
        bare_trainer(int(args.bare[0]), float(args.bare[1]), args.bare[2], args.bare[3])
        return 0
    if not args.out:
        p.error("--out is required")

    import ray

    from rayemb.config import load_config
    from rayemb.train.driver.resources import resolve_cpus_per_worker

    data = os.path.abspath(args.data)
    if not os.path.exists(os.path.join(data, "schema.yaml")):
        subprocess.run([sys.executable, "-m", "rayemb.cli", "gen-data", "--out", data, "--rows", str(args.rows)],
                       cwd=_REPO, check=True)
    overrides = ["train.epochs=1", f"train.max_steps_per_epoch={args.steps}", *args.set, f"data.path={data}"]
    cfg = load_config(args.config, overrides)
    tmp = tempfile.mkdtemp(prefix="rayemb-fixed-cost-")
    # a private cluster on 127.0.0.1 that the runs' own processes join without a token
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 logging_level="WARNING")
    except BaseException:  # interrupted while it started: what it started goes with it
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    address = ray.get_runtime_context().gcs_address
    ray_info = {"cpus": ray.cluster_resources().get("CPU"), "version": ray.__version__}
    cpus = resolve_cpus_per_worker(cfg, float(ray_info["cpus"] or 1))
    env = {k: v for k, v in os.environ.items() if k not in UNSET_ENV}
    env.update(RAY_ADDRESS=address, PYTHONPATH=_REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    scaling = {"num_workers": cfg.scaling.num_workers, "cpus_per_worker": cpus,
               "placement_strategy": cfg.scaling.placement_strategy}
    runs: List[Dict[str, Any]] = []

    def fixed_minus_ray(kind: str) -> Dict[str, Any]:
        bare = {r["repeat"]: r["wall_s"] for r in runs if r["kind"] == "bare" and "error" not in r}
        vals = [r["wall_s"] - r["phases"].get("steps", 0.0) - bare[r["repeat"]] for r in runs
                if r["kind"] == kind and "error" not in r and r["repeat"] in bare]
        return spread(vals)

    def document() -> Dict[str, Any]:
        summary = {}
        for kind in KINDS:
            done = [r for r in runs if r["kind"] == kind and "error" not in r]
            summary[kind] = {"process": spread(r["wall_s"] for r in done),
                             **{ph: spread(r["phases"].get(ph) for r in done) for ph in PHASES}}
        fixed = {kind: fixed_minus_ray(kind) for kind in TARGETS}
        verdicts = {k: (None if fixed[k]["median"] is None else
                        "PASS" if fixed[k]["median"] <= TARGETS[k] else "FAIL") for k in TARGETS}
        return {"schema_version": 1, "config": os.path.relpath(args.config, _REPO), "overrides": overrides,
                "data": os.path.relpath(data, _REPO),
                "ray": ray_info,
                "scaling": scaling, "runs": runs, "summary": summary,
                "rayemb_fixed_minus_ray_s": {k: fixed[k]["median"] for k in TARGETS},
                "rayemb_fixed_minus_ray_spread": fixed,
                "target": {"rule": "median (job wall - job steps - bare TorchTrainer wall) <= "
                           + ", ".join(f"{v:g} s {k}" for k, v in TARGETS.items()), "verdict": verdicts}}

    try:
        for repeat in range(args.repeats):
            out_dir = os.path.join(tmp, f"out-{repeat}")
            job = [sys.executable, "-m", "rayemb.cli", "train", "--config", args.config, "--new-run",
                   *[a for o in [*overrides, f"tracking.output_dir={out_dir}"] for a in ("--set", o)]]
            for kind in ("cold", "bare", "warm"):  # the bare one between the two jobs: a slow spell hits all
                print(f"[{repeat + 1}/{args.repeats}] {kind}", flush=True)
                log = os.path.join(tmp, f"{kind}-{repeat}.log")
                if kind == "bare":
                    r = _timed([sys.executable, os.path.abspath(__file__), "--bare", str(cfg.scaling.num_workers),
                                str(cpus), cfg.scaling.placement_strategy, os.path.join(tmp, "bare")], env, log)
                    r["phases"] = {}
                else:
                    result_json = os.path.join(tmp, f"{kind}-{repeat}.json")
                    r = _timed([*job, "--result-json", result_json], env, log)
                    if "error" not in r:
                        with open(result_json) as f:
                            metrics = json.load(f)["metrics"]
                        r["phases"] = {k[len("phase_s."):]: v for k, v in metrics.items() if k.startswith("phase_s.")}
                runs.append({"repeat": repeat, "kind": kind, **r})
                write_result(args.out, document())
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    doc = document()
    rows = [{"kind": k, "n": doc["summary"][k]["process"]["n"],
             **{ph: v["median"] for ph, v in doc["summary"][k].items()}} for k in KINDS]
    fixed, verdict = doc["rayemb_fixed_minus_ray_s"], doc["target"]["verdict"]
    footer = "\nmedians; " + "; ".join(
        f"rayemb_fixed_minus_ray_s {k}: " + ("-" if fixed[k] is None else f"{fixed[k]:.1f} s") + f" ({verdict[k]})"
        for k in TARGETS)
    return report(args.out, doc, rows, COLUMNS, KEYS, footer=footer)


if __name__ == "__main__":
    sys.exit(main())
