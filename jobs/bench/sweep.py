"""A sweep against the same trials run one after another, and a sweep trial's fixed cost against Ray Train's own.

    python jobs/bench/sweep.py --out bench-results/sweep_<date>_<commit>.json
    python jobs/bench/sweep.py --quick --out /tmp/sweep_quick.json         # 3 trials of 60 steps, to try it

Starts one local Ray on 127.0.0.1 (stopped by its handle at the end); every run below is its own process
joining it (``RAY_ADDRESS``), timed from its start to its exit:

* ``bare``: jobs/bench/fixed_cost.py's ``TorchTrainer`` with an empty loop and the job's ScalingConfig, before
  the sweep and after it;
* ``sweep``: ``rayemb sweep`` of the config (default jobs/configs/synth_small.yaml, one epoch, a validation every
  ``--eval-every`` steps so ASHA has rungs inside it) over ``model.embedding_dim`` (grid ``--dims``) x
  ``train.dense_lr`` (loguniform ``--lr``), ``--trials-per-dim`` samples per dim, ASHA, the trials at once the
  sweep's default allows on this cluster;
* ``default``: a plain ``rayemb train`` of the config (its own data and output folder, and ``--set``, only);
* ``sequential`` (``--no-sequential`` skips it): ``rayemb train`` of each trial's config, the values read back from
  the trial's MLflow run, one after another into one output folder (kept statistics and calibrations, as the
  sweep's trials share theirs).

The shipped DLRM's config refuses an embedding dim other than ``model.bottom_mlp``'s last size, and a space's grid
keys are crossed, so ``model.embedding_dim`` cannot be swept with ``model.bottom_mlp`` following it. Every job here
(the default one aside) is therefore the DLRM through :func:`dlrm_to_embedding_dim` (``model.factory``), whose
bottom MLP ends at the tables' dim: at dim 16 the model of the config.

After the runs: the trials and the parent from the sweep's MLflow store (checked: one parent, one child per trial,
each with every swept key as a param), ``rayemb compare --sweep`` into ``--keep``, and the verdicts
(:data:`TARGETS`). ``rayemb_fixed_minus_ray_s`` of a trial: its job's wall - its steps (the ``phase_s.*`` its
driver logs, as ``rayemb: phases:`` prints them) - the median bare wall; the sweep's first trial pays the statistics
pass, the calibration and the plan probe, the later ones (warm) read them. A trial stopped by ASHA has no epoch
end and so no steps phase: it has no row. Writes the JSON after every stage and prints a table; interrupted (Ctrl-C), it judges the runs it made, and
``--summarize`` judges those of a JSON an interrupted run left.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, spread, write_result  # noqa: E402
from fixed_cost import UNSET_ENV, _timed  # noqa: E402

FIXED_COST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixed_cost.py")
KEYS = ("model.embedding_dim", "train.dense_lr")
FACTORY = "jobs.bench.sweep:dlrm_to_embedding_dim"
#: name -> (comparison, bound, what it says)
TARGETS: Dict[str, tuple] = {
    "stopped_early_fraction": (">=", 0.5, "trials ASHA stopped before the last validation / trials"),
    "sweep_over_sequential": ("<=", 0.5, "sweep wall / wall of the same configs run one after another"),
    "best_minus_default_auc": (">=", -0.001, "best trial's valid AUC - the default config's"),
    "mlflow_complete": ("==", True, "1 parent + one child per trial, each with every swept key"),
    "rayemb_fixed_minus_ray_s.first": ("<=", 30.0, "the first trial's job wall - steps - bare wall"),
    "rayemb_fixed_minus_ray_s.warm": ("<=", 5.0, "median of the same over the later trials of a dim run before"),
}
COLUMNS = [("target", "<32", "{}"), ("value", ">10", "{}"), ("bound", ">9", "{}"), ("verdict", "<8", "{}")]


def dlrm_to_embedding_dim(embeddings: Any, schema: Any, bottom_hidden: Sequence[int] = (64,),
                          top_mlp: Sequence[int] = (64, 32, 1), sequence_tower: str = "none") -> Any:
    """The shipped DLRM with its bottom MLP ending at the tables' dim (``bottom_hidden`` then the dim)."""
    from rayemb.models.dlrm import dlrm

    return dlrm(embeddings, schema, bottom_mlp=[*bottom_hidden, int(embeddings.dims[0])], top_mlp=top_mlp,
                sequence_tower=sequence_tower)


def _num(v: Any) -> Any:
    try:
        return json.loads(v)
    except (TypeError, ValueError):
        return v


def trial_rows(runs: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> List[Dict[str, Any]]:
    """One row per child run (``run_id``, ``status``, ``start_ms``, ``end_ms``, ``params``, ``metrics``: last
    values, ``valid_auc_history``), in start order: its swept values, best and last valid AUC, wall and phases."""
    rows = []
    for r in sorted(runs, key=lambda r: r["start_ms"]):
        hist = [float(v) for v in r.get("valid_auc_history") or []]
        m = r.get("metrics") or {}
        rows.append({"run_id": r["run_id"], "trial_id": r.get("trial_id"), "status": r["status"],
                     **{k: _num(r["params"].get(k)) for k in keys},
                     "validations": len(hist), "best_valid_auc": max(hist) if hist else None,
                     "last_valid_auc": hist[-1] if hist else None,
                     "run_wall_s": (r["end_ms"] - r["start_ms"]) / 1e3 if r.get("end_ms") else None,
                     "phases": {k[len("phase_s."):]: v for k, v in m.items() if k.startswith("phase_s.")},
                     "stopped_reason": r.get("stopped_reason"),
                     "stopped_at_validation": _stopped_at(r.get("stopped_reason"))})
    return rows


def _stopped_at(reason: Optional[str]) -> Optional[int]:
    """The validation ASHA stopped a trial at, from its ``rayemb.stopped_reason`` (the run's own history may
    lack the last validations it reported to Tune)."""
    m = re.search(r"at validation (\d+)", reason or "")
    return int(m.group(1)) if m else None


def mlflow_check(parents: int, children: Sequence[Mapping[str, Any]], keys: Sequence[str], expected: int
                 ) -> Dict[str, Any]:
    """Whether the store holds one sweep parent and ``expected`` children, each with a param for every key."""
    missing = {c["run_id"]: [k for k in keys if k not in c["params"]] for c in children}
    missing = {r: ks for r, ks in missing.items() if ks}
    return {"parents": parents, "children": len(children), "expected_children": expected,
            "children_missing_params": missing,
            "complete": parents == 1 and len(children) == expected and not missing}


def fixed_minus_ray(trials: Sequence[Mapping[str, Any]], bare_walls: Sequence[float]) -> Dict[str, Any]:
    """A trial's (job wall - steps) - the median bare wall: ``first`` the sweep's first trial's (None when it has
    no phases of a whole epoch); ``warm`` the spread over the later trials of a dim an earlier trial ran (kept
    statistics, calibration and plan probe); ``first_of_shape`` over the later trials of a dim not run before
    (the plan probe of their shape, and its calibration when calibrating); ``later``: both."""
    bare = statistics.median(bare_walls) if bare_walls else None

    def value(t: Mapping[str, Any]) -> Optional[float]:
        ph = t.get("phases") or {}
        if bare is None or "wall" not in ph or "steps" not in ph:
            return None
        return ph["wall"] - ph["steps"] - bare

    values = [value(t) for t in trials]
    shapes = [t.get("model.embedding_dim") for t in trials]
    warm = [v for i, v in enumerate(values) if i and shapes[i] in shapes[:i]]
    new_shape = [v for i, v in enumerate(values) if i and shapes[i] not in shapes[:i]]
    return {"bare_s": bare, "first": values[0] if values else None, "warm": spread(warm),
            "first_of_shape": spread(new_shape), "later": spread(values[1:]), "per_trial": values}


def summarize(trials: Sequence[Mapping[str, Any]], sweep_wall: Optional[float], sequential_walls: Sequence[float],
              expected_trials: int, default_auc: Optional[float], mlflow: Mapping[str, Any],
              fixed: Mapping[str, Any]) -> Dict[str, Any]:
    """The figures the targets judge. A figure whose runs are missing (a failed sequential run, fewer trials
    than asked) is None."""
    scored = [t for t in trials if t["status"] != "FAILED" and t["best_valid_auc"] is not None]
    best = max(scored, key=lambda t: t["best_valid_auc"]) if scored else None
    complete_seq = len(sequential_walls) == expected_trials and expected_trials > 0
    seq = sum(sequential_walls) if complete_seq else None
    # a trial ASHA stopped at the last validation any trial reached ran its whole epoch: not stopped early
    last = max([t["validations"] for t in trials] + [t.get("stopped_at_validation") or 0 for t in trials] or [0])
    killed = [t for t in trials if t["status"] == "KILLED"]
    early = [t for t in killed if (t.get("stopped_at_validation") or t["validations"]) < last]
    return {
        "trials": len(trials),
        "stopped_early": len(early), "stopped_at_last_validation": len(killed) - len(early),
        "stopped_early_fraction": (len(early) / expected_trials
                                   if len(trials) == expected_trials and expected_trials else None),
        "sweep_wall_s": sweep_wall, "sequential_wall_s": seq,
        "sweep_over_sequential": sweep_wall / seq if seq and sweep_wall is not None else None,
        "best_trial": None if best is None else {k: best[k] for k in ("run_id", "trial_id", "status", *KEYS,
                                                                      "best_valid_auc", "last_valid_auc")},
        "default_valid_auc": default_auc,
        "best_minus_default_auc": (best["best_valid_auc"] - default_auc
                                   if best is not None and default_auc is not None else None),
        "mlflow_complete": bool(mlflow.get("complete")),
        "rayemb_fixed_minus_ray_s.first": fixed.get("first"),
        "rayemb_fixed_minus_ray_s.warm": (fixed.get("warm") or {}).get("median"),
    }


def verdicts(summary: Mapping[str, Any], targets: Mapping[str, tuple] = TARGETS) -> Dict[str, str]:
    """PASS or FAIL per target; a figure that is missing (None) is a FAIL."""
    out = {}
    for name, (op, bound, _) in targets.items():
        v = summary.get(name)
        ok = v is not None and {">=": lambda: v >= bound, "<=": lambda: v <= bound, "==": lambda: v == bound}[op]()
        out[name] = "PASS" if ok else "FAIL"
    return out


def _read_store(uri: str, experiment: str, keys: Sequence[str]) -> Dict[str, Any]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    parents = client.search_runs([exp.experiment_id], "tags.`rayemb.kind` = 'sweep'") if exp else []
    out: Dict[str, Any] = {"parents": len(parents), "parent_run_id": None, "parent_params": {}, "children": []}
    if len(parents) != 1:
        return out
    parent = parents[0]
    out["parent_run_id"], out["parent_params"] = parent.info.run_id, dict(parent.data.params)
    for c in client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
                                max_results=1000):
        out["children"].append({
            "run_id": c.info.run_id, "status": c.info.status, "start_ms": c.info.start_time,
            "end_ms": c.info.end_time, "params": dict(c.data.params), "metrics": dict(c.data.metrics),
            "trial_id": c.data.tags.get("rayemb.sweep.trial_id"),
            "stopped_reason": c.data.tags.get("rayemb.stopped_reason"),
            "valid_auc_history": [m.value for m in sorted(client.get_metric_history(c.info.run_id, "valid_auc"),
                                                          key=lambda m: m.step)]})
    return out


def _git_sha() -> str:
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_REPO, capture_output=True, text=True)
    return p.stdout.strip() or "unknown"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(_REPO, "jobs", "configs", "synth_small.yaml"))
    p.add_argument("--data", default=os.path.join(_REPO, "data", "synth_small"))
    p.add_argument("--dims", default="8,16,32", help="the grid of model.embedding_dim")
    p.add_argument("--trials-per-dim", type=int, default=4, help="samples of train.dense_lr per dim")
    p.add_argument("--lr", nargs=2, type=float, default=(0.0005, 0.02), metavar=("LO", "HI"),
                   help="train.dense_lr's loguniform range")
    p.add_argument("--eval-every", type=int, default=50, help="train.eval_every_n_steps (ASHA's rungs)")
    p.add_argument("--steps", type=int, default=None, help="train.max_steps_per_epoch (default: the whole epoch)")
    p.add_argument("--sequential", action=argparse.BooleanOptionalAction, default=True,
                   help="run the sweep's configs one after another with rayemb train (default: yes)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override of every job (the default one's too), e.g. planner.calibrate=false")
    p.add_argument("--quick", action="store_true", help="1 trial per dim, 60 steps, a validation every 20")
    p.add_argument("--keep", default=os.path.join(_REPO, "runs", "bench-sweep"),
                   help="where `rayemb compare --sweep` writes its table and charts")
    p.add_argument("--summarize", action="store_true",
                   help="only judge the runs an interrupted benchmark wrote to --out")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.summarize:
        with open(args.out) as f:
            return finish(json.load(f), args.out)
    if args.quick:
        args.trials_per_dim, args.steps, args.eval_every = 1, args.steps or 60, 20
    dims = [int(d) for d in args.dims.split(",")]

    import ray
    import yaml

    from rayemb.config import load_config
    from rayemb.train.driver.resources import resolve_cpus_per_worker

    data = os.path.abspath(args.data)
    if not os.path.exists(os.path.join(data, "schema.yaml")):
        subprocess.run([sys.executable, "-m", "rayemb.cli", "gen-data", "--out", data, "--rows", "400000"],
                       cwd=_REPO, check=True)
    steps = [f"train.max_steps_per_epoch={args.steps}"] if args.steps else []
    common = ["train.epochs=1", f"data.path={data}", *steps, *args.set]
    swept = [*common, f"train.eval_every_n_steps={args.eval_every}", f"model.factory={FACTORY}",
             "model.args={bottom_hidden: [64]}"]
    cfg = load_config(args.config, swept)
    tmp = tempfile.mkdtemp(prefix="rayemb-bench-sweep-")
    keep = os.path.join(os.path.abspath(args.keep), os.path.splitext(os.path.basename(args.out))[0])
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")
    except BaseException:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    ray_info = {"cpus": ray.cluster_resources().get("CPU"), "version": ray.__version__}
    cpus = resolve_cpus_per_worker(cfg, float(ray_info["cpus"] or 1))
    env = {k: v for k, v in os.environ.items() if k not in UNSET_ENV}
    env.update(RAY_ADDRESS=ray.get_runtime_context().gcs_address,
               PYTHONPATH=_REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    space = {"model.embedding_dim": {"grid": dims}, "train.dense_lr": {"loguniform": list(args.lr)}}
    doc: Dict[str, Any] = {
        "schema_version": 1, "commit": _git_sha(), "config": os.path.relpath(args.config, _REPO),
        "data": os.path.relpath(data, _REPO), "space": space, "num_samples": args.trials_per_dim,
        "overrides": {"all": common, "sweep_and_sequential": swept}, "model_note": (
            "the shipped DLRM refuses model.embedding_dim unless model.bottom_mlp ends at it, and grid keys are "
            f"crossed: the swept and sequential jobs build the DLRM through {FACTORY} (bottom MLP [64, dim])"),
        "ray": ray_info, "scaling": {"num_workers": cfg.scaling.num_workers, "cpus_per_worker": cpus,
                                     "placement_strategy": cfg.scaling.placement_strategy},
        "host": {"cpu_count": os.cpu_count(), "load_avg_1m": []}, "runs": []}

    def run(kind: str, cmd: List[str], **extra: Any) -> Dict[str, Any]:
        print(f"[{len(doc['runs']) + 1}] {kind} {extra or ''}", flush=True)
        doc["host"]["load_avg_1m"].append(round(os.getloadavg()[0], 2))
        r = {"kind": kind, **extra, **_timed(cmd, env, os.path.join(tmp, f"{len(doc['runs'])}-{kind}.log"))}
        doc["runs"].append(r)
        write_result(args.out, doc)
        return r

    def bare() -> Dict[str, Any]:
        return run("bare", [sys.executable, FIXED_COST, "--bare", str(cfg.scaling.num_workers), str(cpus),
                            cfg.scaling.placement_strategy, os.path.join(tmp, "bare")])

    def train(kind: str, overrides: Sequence[str], out_dir: str, **extra: Any) -> Dict[str, Any]:
        result = os.path.join(tmp, f"{len(doc['runs'])}-{kind}.json")
        r = run(kind, [sys.executable, "-m", "rayemb.cli", "train", "--config", args.config, "--new-run",
                       "--result-json", result, *[a for o in [*overrides, f"tracking.output_dir={out_dir}"]
                                                  for a in ("--set", o)]], **extra)
        if "error" not in r:
            with open(result) as f:
                metrics = json.load(f)["metrics"]
            r["valid_auc"] = metrics.get("valid_auc")
            r["phases"] = {k[len("phase_s."):]: v for k, v in metrics.items() if k.startswith("phase_s.")}
        return r

    try:
        bare()
        space_path = os.path.join(tmp, "space.yaml")
        with open(space_path, "w") as f:
            yaml.safe_dump(space, f)
        sweep_out = os.path.join(tmp, "sweep-out")
        run("sweep", [sys.executable, "-m", "rayemb.cli", "sweep", "--config", args.config, "--space",
                      space_path, "--num-samples", str(args.trials_per_dim), "--name", "bench",
                      *[a for o in [*swept, f"tracking.output_dir={sweep_out}"] for a in ("--set", o)]])
        bare()
        uri = f"sqlite:///{os.path.join(sweep_out, 'mlflow.db')}"
        store = _read_store(uri, cfg.tracking.experiment, KEYS)
        trials = trial_rows(store["children"], KEYS)
        doc["mlflow"] = mlflow_check(store["parents"], store["children"], KEYS, len(dims) * args.trials_per_dim)
        doc["mlflow"]["parent_params"] = store["parent_params"]
        doc["trials"] = trials
        write_result(args.out, doc)
        if store["parent_run_id"]:
            compare = os.path.join(keep, "compare")
            c = run("compare", [sys.executable, "-m", "rayemb.cli", "compare", "--sweep", store["parent_run_id"],
                                "--out", compare, "--tracking-uri", uri])
            doc["compare"] = {"rc": c["rc"], "files": sorted(os.path.relpath(os.path.join(compare, f), _REPO)
                                                             for f in os.listdir(compare)) if c["rc"] == 0 else []}
        train("default", [f"data.path={data}", *steps, *args.set], os.path.join(tmp, "default-out"))
        if args.sequential:
            seq_out = os.path.join(tmp, "sequential-out")
            for t in trials:
                train("sequential", [*swept, *(f"{k}={json.dumps(t[k])}" for k in KEYS)], seq_out,
                      **{"trial_id": t["trial_id"], **{k: t[k] for k in KEYS}})
    except KeyboardInterrupt:  # what ran is judged; the rest is missing
        doc["interrupted"] = f"after {len(doc['runs'])} run(s)"
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)

    return finish(doc, args.out)


def finish(doc: Dict[str, Any], out: str) -> int:
    """The figures and verdicts of the runs ``doc`` holds (all of them, or those before an interruption: what
    is missing fails its target), written to ``out`` and printed."""
    ok = [r for r in doc["runs"] if "error" not in r]
    expected = len(doc["space"]["model.embedding_dim"]["grid"]) * doc["num_samples"]
    fixed = fixed_minus_ray(doc.get("trials", []), [r["wall_s"] for r in ok if r["kind"] == "bare"])
    seq = [r["wall_s"] for r in ok if r["kind"] == "sequential"]
    sweep_wall = next((r["wall_s"] for r in ok if r["kind"] == "sweep"), None)
    default_auc = next((r.get("valid_auc") for r in ok if r["kind"] == "default"), None)
    summary = summarize(doc.get("trials", []), sweep_wall, seq, expected, default_auc, doc.get("mlflow", {}), fixed)
    summary["sequential_runs"] = len(seq)
    doc["rayemb_fixed_minus_ray_s"] = fixed
    doc["summary"] = summary
    doc["target"] = {"rules": {k: f"{v[2]} {v[0]} {v[1]}" for k, v in TARGETS.items()},
                     "verdict": verdicts(summary)}
    load = doc["host"]["load_avg_1m"]
    doc["host_note"] = (f"1-min load average {min(load):.1f}-{max(load):.1f} at the runs' starts, on "
                        f"{doc['host']['cpu_count']} cores")
    rows = [{"target": k, "value": None if summary[k] is None else
             (f"{summary[k]:.4f}" if isinstance(summary[k], float) else str(summary[k])),
             "bound": f"{TARGETS[k][0]} {TARGETS[k][1]}", "verdict": doc["target"]["verdict"][k]} for k in TARGETS]
    trial_lines = "\n".join(
        f"  {t['trial_id']} dim {t['model.embedding_dim']:>3} lr {t['train.dense_lr']:.5f} {t['status']:<8} "
        f"best auc {t['best_valid_auc'] if t['best_valid_auc'] is None else round(t['best_valid_auc'], 4)} "
        f"after {t['validations']} validation(s)" for t in doc.get("trials", []))
    nan = float("nan")
    footer = (f"\ntrials:\n{trial_lines}\nsweep {summary['sweep_wall_s'] or nan:.0f} s, one after another "
              f"{summary['sequential_wall_s'] or nan:.0f} s ({len(seq)} of {expected} run); default valid AUC "
              f"{summary['default_valid_auc']}; {doc['host_note']}"
              + (f"; interrupted {doc['interrupted']}" if doc.get("interrupted") else ""))
    return report(out, doc, rows, COLUMNS, ["target", "value", "bound", "verdict"], footer=footer)

if __name__ == "__main__":
    sys.exit(main())
