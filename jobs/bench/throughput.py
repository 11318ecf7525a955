"""Training throughput of rayemb vs a hand-written TorchRec + torchrun peer, side by side on one node.

Same data (``--data``, one-hot), same model (DLRM: bottom MLP [64, 16], dim 16,
dot interaction, top MLP [64, 32, 1]), same optimizers, same global batch
(512 per rank x 2 ranks) and the same cores, in one run:

* ``peer``: ``jobs/bench/peer_torchrec.py`` under ``torchrun`` (TorchRec's
  default planner and sharders, data in memory before timing);
* ``auto``: ``rayemb train`` with the default config (the cost-model plan);
* forced plans, through ``--set`` overrides of ``jobs/configs/synth_small.yaml``:
  ``no_hybrid`` (``planner.hybrid=false``: the auto plan without hybrid),
  ``data_parallel``, ``table_wise``, ``row_wise`` and ``column_wise`` (every table pinned to it), and
  ``hybrid`` (every table with a hot set and a cold remainder pinned
  ``hybrid: true``; the hot sets are read from the first auto run's ``split.json``).
  ``table_wise_no_prefetch`` is available through ``--variants``.

rayemb runs through its CLI in a subprocess on a private local Ray, with HOME,
TMPDIR and RAY_TMPDIR in a temp dir (``RAY_ADDRESS``, ``MLFLOW_TRACKING_URI``,
``RAYEMB_WORKSPACE`` unset), one epoch of ``--steps`` + one window steps, early
stopping off; the first run's ``stats.json`` is reused by the later ones
(``data.stats_path``) so only the first pays for the statistics pass.

Throughput of a run = the median of its per-window ``samples_per_s`` (windows
of ``--window`` steps = ``train.log_every_n_steps``) after the first (warm-up)
window, read from the run's MLflow store; the step-time breakdown
(``time_s.data_wait/forward/backward/optimizer``) is the median over the same
windows. The peer is measured with the same estimator (median over windows of
``--window`` steps after ``--window`` warm-up steps). Each side runs
``--repeats`` times (default 5), interleaved (round r rotates the order), and a row is the
median over its runs, with their min-max. Per rayemb row also the step-time model's prediction for its
plan (plan.json ``predicted_step_time_s``) and the plan probe's step (``probed_step_time_s``), each over
the run's measured step (median window), as the median of the runs' ratios with min-max.

Acceptance (printed PASS/FAIL; exit 0 unless ``--check``), on the rows' medians:

* ``auto_vs_peer = auto / peer`` >= 1.0;
* ``auto_vs_best_pure = auto / max(forced plans)`` >= 0.95;
* the model's prediction within 20 % of the measured step on every rayemb row.

A verdict FAILs when a row it rests on is missing, had a failed run, has fewer than 5 runs, or (rayemb rows)
fewer than 5 runs with a prediction: ``--quick`` (one run per side) is a smoke run whose verdicts FAIL. Reported beside
them: whether auto trained the fastest row's plan, and auto's own runs against the forced runs of that plan.
The default run (8 sides x 5 runs of 200 steps) takes 45-90 min on a 2-core host, depending on its speed.

Usage::

    python jobs/bench/throughput.py --out bench-results/throughput.json [--quick] [--repeats 5] [--steps 200]

Writes ``{"schema_version": 2, "results": [...], "acceptance": {...}, "plan_choice": {...}, "runs": [...]}``,
a bar chart next to it (``.png``) and prints a table.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from _report import (auto_plan_check, auto_plan_line, link_measured, prediction_problem, report,  # noqa: E402
                     row_problem, spread, uncalibrated)

SCHEMA_VERSION = 2
CONFIG = os.path.join(_REPO, "jobs", "configs", "synth_small.yaml")
PEER_SCRIPT = os.path.join(_HERE, "peer_torchrec.py")
#: rayemb variants: the cost-model plan, then the forced plans it is compared against
AUTO = "auto"
FORCED = ("no_hybrid", "data_parallel", "table_wise", "hybrid", "row_wise", "column_wise")
#: table_wise_no_prefetch: the table_wise plan with the next batch's input exchange not prefetched
#: (train.prefetch_input_dist=false), to measure what the prefetch brings on one plan
EXTRA = ("table_wise_no_prefetch",)
#: variants that are not a placement of their own: never the "best pure" plan auto is held to
NOT_PURE = ("table_wise_no_prefetch",)
PEER = "peer"
DEFAULT_VARIANTS = (AUTO,) + FORCED
TARGET_VS_PEER = 1.0
TARGET_VS_BEST_PURE = 0.95
TARGET_PREDICTION = 0.20
#: runs every row needs before a verdict rests on it (each row here enters one)
MIN_RUNS = 5
PHASES = ("data_wait", "forward", "backward", "optimizer")
#: metric histories read from each rayemb run
RUN_METRICS = ("samples_per_s", *(f"time_s.{p}" for p in PHASES), "bytes_per_step.total", "valid_auc",
               "step_time_s", "step_time_measured_s", "step_time_predicted_s", "step_time_uncalibrated_s",
               "step_time_probed_s")
#: environment variables that would point a rayemb run at something outside its temp dir
UNSET_ENV = ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "RAYEMB_WORKSPACE", "RAYEMB_FAULT_INJECTION")


# ---- pure pieces (unit-tested) ---- #


def steady_windows(reports: Sequence[Mapping[str, Any]], key: str = "samples_per_s") -> List[float]:
    """The values of ``key`` in step order, without the first (warm-up) window; epoch-end reports (no ``key``)
    are skipped. With a single window that one is returned (there is nothing steady to prefer)."""
    vals = [float(r[key]) for r in sorted(reports, key=lambda r: r.get("step", 0))
            if key in r and r[key] is not None and not r.get("epoch_end")]
    return vals[1:] if len(vals) > 1 else vals


def steady_median(reports: Sequence[Mapping[str, Any]], key: str = "samples_per_s") -> Optional[float]:
    """Median of ``key`` over the steady windows (None when no report has it)."""
    vals = steady_windows(reports, key)
    return float(statistics.median(vals)) if vals else None


def reports_from_histories(histories: Mapping[str, Sequence[Tuple[int, float]]]) -> List[Dict[str, Any]]:
    """``{metric: [(step, value), ...]}`` (an MLflow run's histories) -> step-ordered report dicts."""
    by_step: Dict[int, Dict[str, Any]] = {}
    for key, points in histories.items():
        for step, value in points:
            by_step.setdefault(int(step), {"step": int(step)})[key] = float(value)
    return [by_step[s] for s in sorted(by_step)]


def variant_overrides(variant: str, tables: Sequence[str], hot_tables: Optional[Sequence[str]] = None) -> List[str]:
    """The ``--set`` overrides that force a variant's plan.

    ``hybrid`` pins ``hybrid: true`` on every table in ``hot_tables`` (those whose
    frequent-category split found a hot set); the other tables keep the auto choice.
    """
    if variant == AUTO:
        return []
    if variant == "no_hybrid":
        return ["planner.hybrid=false"]
    if variant in ("data_parallel", "table_wise", "row_wise", "column_wise"):
        return [f"planner.tables.{t}.sharding={variant}" for t in tables]
    if variant == "table_wise_no_prefetch":
        return variant_overrides("table_wise", tables) + ["train.prefetch_input_dist=false"]
    if variant == "hybrid":
        if hot_tables is None:
            raise ValueError("the hybrid variant needs the tables with a hot set (from an auto run's split.json)")
        return [f"planner.tables.{t}.hybrid=true" for t in hot_tables]
    raise ValueError(f"unknown variant {variant!r}; known: {(AUTO,) + FORCED + EXTRA}")


def common_overrides(data_dir: str, output_dir: str, steps: int, window: int, batch_size: int, world: int,
                     run_name: str, stats_path: Optional[str] = None) -> List[str]:
    """Overrides every rayemb run gets: one epoch of warm-up window + ``steps`` steps, no early stopping,
    no restarts, outputs in ``output_dir``."""
    out = [
        f"data.path={data_dir}", f"data.batch_size={batch_size}", f"scaling.num_workers={world}",
        "scaling.max_failures=0", "train.epochs=1", f"train.max_steps_per_epoch={steps + window}",
        "train.early_stopping_patience=null", f"train.log_every_n_steps={window}",
        f"tracking.output_dir={output_dir}", "tracking.experiment=bench-throughput", f"tracking.run_name={run_name}",
    ]
    if stats_path:
        out.append(f"data.stats_path={stats_path}")
    return out


def hot_tables_of(split: Mapping[str, Any]) -> List[str]:
    """Tables of a ``split.json`` document with a hot set and a cold remainder (0 < |F| < V), in table order.

    A table whose hot set is the whole table is data-parallel already (and rayemb
    rejects a hybrid pin on it: its empty cold half gets no EmbeddingCollection
    sharding), so the ``hybrid`` variant leaves those to the auto choice.
    """
    names = []
    for name, t in split.get("tables", {}).items():
        hot, rows = int(t.get("num_hot", 0)), t.get("num_embeddings")
        if hot > 0 and (rows is None or hot < int(rows)):
            names.append(name)
    return sorted(names, key=_natural_key)


def infrequent_tables_of(split: Mapping[str, Any]) -> List[str]:
    """Tables of a ``split.json`` document with *infrequent* rows: a hot set and a cold remainder that the
    frequency threshold left (``limited_by`` ``threshold`` or ``memory``), in table order.

    These are the tables HugeCTR's hybrid embedding splits: it applies one
    frequency threshold to every category of every table. A table whose hot set
    was cut short by the candidate list (``limited_by`` ``candidates``: e.g. a
    3-row table at W = 2, whose 3 frequent rows round down to 2) has no
    infrequent row, only a rounding remainder, and stays as it was.
    """
    return [name for name in hot_tables_of(split)
            if split["tables"][name].get("limited_by", "threshold") != "candidates"]


def _natural_key(name: str) -> Tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def plan_summary(placements: Mapping[str, str]) -> str:
    """``{table: placement}`` -> ``"data_parallel x20, hybrid x6"`` (most common first)."""
    counts: Dict[str, int] = {}
    for p in placements.values():
        counts[p] = counts.get(p, 0) + 1
    return ", ".join(f"{p} x{c}" for p, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def aggregate(runs: Sequence[Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Per variant: median and min-max of the runs' ``samples_per_s`` (failed runs, None, are counted in
    ``failed`` and left out), of their predicted- and probed-over-measured steps, and the median step-time
    breakdown."""
    out: Dict[str, Dict[str, Any]] = {}
    for r in runs:
        out.setdefault(r["variant"], {"variant": r["variant"], "kind": r["kind"], "values": [], "failed": 0,
                                      "plan": r.get("plan"), "phases": [], "step_ms": [], "pred": [], "probed": [],
                                      "uncalibrated_runs": 0, "link_measured_runs": 0})
        row = out[r["variant"]]
        if r.get("samples_per_s") is None:
            row["failed"] += 1
            continue
        row["values"].append(float(r["samples_per_s"]))
        if r.get("time_s"):
            row["phases"].append(r["time_s"])
        if r.get("step_ms_mean") is not None:
            row["step_ms"].append(float(r["step_ms_mean"]))
        meas = r.get("step_time_s")
        if uncalibrated(r):  # built-in constants' figure: counted, never judged as the model's
            row["uncalibrated_runs"] += 1
        row["link_measured_runs"] += int(link_measured(r))
        row["pred"].append(r["predicted_step_time_s"] / meas if r.get("predicted_step_time_s") and meas
                           and not uncalibrated(r) else None)
        row["probed"].append(r["probed_step_time_s"] / meas if r.get("probed_step_time_s") and meas else None)
        row["plan"] = r.get("plan") or row["plan"]
        row["plan_summary"] = r.get("plan_summary") or row.get("plan_summary")
    for row in out.values():
        v, phases, step_ms = row.pop("values"), row.pop("phases"), row.pop("step_ms")
        pred, probed = spread(row.pop("pred")), spread(row.pop("probed"))
        if step_ms:
            row["step_ms_mean"] = statistics.median(step_ms)
        sps = spread(v)
        row.update(runs=len(v), samples_per_s=sps["median"], samples_per_s_min=sps["min"],
                   samples_per_s_max=sps["max"], samples_per_s_runs=v,
                   predicted_over_measured=pred["median"], predicted_over_measured_min=pred["min"],
                   predicted_over_measured_max=pred["max"], predicted_runs=pred["n"],
                   probed_over_measured=probed["median"],
                   probed_over_measured_min=probed["min"], probed_over_measured_max=probed["max"])
        if phases:
            row["time_s"] = {p: statistics.median(ph[p] for ph in phases if ph.get(p) is not None)
                             for p in PHASES if any(ph.get(p) is not None for ph in phases)}
    return out


def acceptance(rows: Mapping[str, Mapping[str, Any]], forced: Sequence[str] = FORCED,
               extra: Sequence[str] = (), min_runs: int = MIN_RUNS) -> Dict[str, Any]:
    """auto / peer, auto / best forced plan and the model's worst prediction error over the rayemb rows, with
    PASS/FAIL against the targets. A verdict is False (never None) unless every row it rests on is there, ran
    without a failure, has ``min_runs`` runs and, for rayemb rows, a prediction (``row_problems``). A row whose
    prediction was uncalibrated (built-in constants: e.g. every table pinned) fails the prediction verdict only
    (``prediction_problems``): its throughput is as measured as any row's."""
    rayemb = [AUTO, *forced, *extra]
    problems = {v: row_problem(rows.get(v), min_runs, needs_prediction=v != PEER) for v in [PEER, *rayemb]}
    ok = {v: p is None for v, p in problems.items()}
    predicting = {v: prediction_problem(rows.get(v), min_runs) for v in rayemb}

    def sps(name: str) -> Optional[float]:
        row = rows.get(name)
        return row.get("samples_per_s") if row else None

    auto, peer = sps(AUTO), sps(PEER)
    pure = {n: sps(n) for n in forced if sps(n) is not None}
    best = max(pure, key=pure.get) if pure else None
    vs_peer = auto / peer if auto is not None and peer else None
    vs_best = auto / pure[best] if auto is not None and best is not None and pure[best] else None
    errors = {v: abs(rows[v]["predicted_over_measured"] - 1.0) for v in rayemb
              if rows.get(v) and rows[v].get("predicted_over_measured") is not None}
    worst = max(errors, key=errors.get) if errors else None
    return {
        "uncalibrated_rows": [v for v in rayemb if (rows.get(v) or {}).get("uncalibrated_runs")],
        "link_measured_rows": [v for v in rayemb if (rows.get(v) or {}).get("link_measured_runs")],
        "row_problems": {v: p for v, p in problems.items() if p}, "rows_pass": all(ok.values()),
        "prediction_problems": {v: p for v, p in predicting.items() if p and not problems[v]},
        "auto_vs_peer": vs_peer, "auto_vs_peer_target": TARGET_VS_PEER,
        "auto_vs_peer_pass": bool(ok[AUTO] and ok[PEER] and vs_peer is not None and vs_peer >= TARGET_VS_PEER),
        "auto_vs_best_pure": vs_best, "auto_vs_best_pure_target": TARGET_VS_BEST_PURE,
        "auto_vs_best_pure_pass": bool(forced and all(ok[v] for v in (AUTO, *forced)) and vs_best is not None
                                       and vs_best >= TARGET_VS_BEST_PURE),
        "best_pure": best,
        "worst_prediction_error": errors[worst] if worst else None, "worst_prediction_row": worst,
        "prediction_target": TARGET_PREDICTION,
        "prediction_pass": bool(not any(predicting.values()) and len(errors) == len(rayemb)
                                and errors[worst] <= TARGET_PREDICTION),
    }


def plan_choice(runs: Sequence[Mapping[str, Any]], forced: Sequence[str] = FORCED) -> Dict[str, Any]:
    """:func:`_report.auto_plan_check` over auto's and the forced rows' runs: did auto train the plan of the
    fastest row, and auto's own runs against the forced runs of that plan (reported beside the verdicts)."""
    return auto_plan_check(r for r in runs if r.get("variant") in (AUTO, *forced))


def table_rows(rows: Mapping[str, Mapping[str, Any]], acc: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The printed/JSON rows: peer, auto, then the forced plans, with ratios to the peer and the best forced plan."""
    peer = (rows.get(PEER) or {}).get("samples_per_s")
    best = (rows.get(acc.get("best_pure")) or {}).get("samples_per_s") if acc.get("best_pure") else None
    order = [PEER, AUTO] + [n for n in rows if n not in (PEER, AUTO)]
    out = []
    for name in order:
        if name not in rows:
            continue
        r = dict(rows[name])
        s = r.get("samples_per_s")
        lo, hi = r.get("samples_per_s_min"), r.get("samples_per_s_max")
        r["spread_pct"] = 100.0 * (hi - lo) / s if s and lo is not None and hi is not None else None
        r["vs_peer"] = s / peer if s is not None and peer else None
        r["vs_best_pure"] = s / best if s is not None and best else None
        t = r.get("time_s") or {}
        r["step_ms"] = 1e3 * sum(t.values()) if t else r.get("step_ms_mean")
        r["phases_ms"] = "/".join(f"{1e3 * t[p]:.1f}" if t.get(p) is not None else "-" for p in PHASES) if t else None
        r["plan_summary"] = r.get("plan_summary") or (plan_summary(r["plan"]) if r.get("plan") else "-")
        out.append(r)
    return out


VERDICTS = (("auto_vs_peer", TARGET_VS_PEER), ("auto_vs_best_pure", TARGET_VS_BEST_PURE))


def verdict(acc: Mapping[str, Any]) -> str:
    def one(name: str, target: float) -> str:
        v = acc.get(name)
        return f"{name} = {'-' if v is None else f'{v:.3f}'} (target >= {target}): " + \
            ("PASS" if acc.get(f"{name}_pass") else "FAIL")

    worst = acc.get("worst_prediction_error")
    text = "; ".join(one(n, t) for n, t in VERDICTS) + \
        (f" [best forced plan: {acc['best_pure']}]" if acc.get("best_pure") else "") + \
        f"; the model's prediction within {100 * TARGET_PREDICTION:.0f}% on every rayemb row: " + \
        ("PASS" if acc.get("prediction_pass") else "FAIL") + \
        (f" (worst {acc['worst_prediction_row']}: {100 * worst:.0f}% off)" if worst is not None else "") + \
        (f" (link measured, compute built in: {', '.join(acc['link_measured_rows'])})"
         if acc.get("link_measured_rows") else "") + \
        "".join(f" [{v}: {p}]" for v, p in (acc.get("prediction_problems") or {}).items()) + \
        f"; rows complete ({MIN_RUNS}+ runs, none failed): {'PASS' if acc.get('rows_pass') else 'FAIL'}"
    if acc.get("row_problems"):
        text += " [" + "; ".join(f"{v}: {p}" for v, p in acc["row_problems"].items()) + "]"
    return text


def round_order(variants: Sequence[str], r: int) -> List[str]:
    """Round ``r``'s run order over the peer and the rayemb variants: round 0 is peer, auto, then the forced
    plans (auto's split.json and stats.json feed the later runs); round r rotates it by r, so no side always
    runs first or last."""
    seq = [PEER, AUTO] + [v for v in variants if v not in (PEER, AUTO)]
    k = r % len(seq)
    return seq[k:] + seq[:k]


# ---- running the sides ---- #


def _hermetic_env(tmp: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in UNSET_ENV}
    for sub in ("home", "tmp", "ray", "xdg-cache", "xdg-config"):
        os.makedirs(os.path.join(tmp, sub), exist_ok=True)
    env.update(HOME=os.path.join(tmp, "home"), TMPDIR=os.path.join(tmp, "tmp"), RAY_TMPDIR=os.path.join(tmp, "ray"),
               XDG_CACHE_HOME=os.path.join(tmp, "xdg-cache"), XDG_CONFIG_HOME=os.path.join(tmp, "xdg-config"),
               PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = _REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _tail(text: str, n: int = 15) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and "PlacementGroupCleaner" not in ln]
    return "\n".join(lines[-n:])


def run_peer(args: argparse.Namespace, tmp: str, r: int) -> Dict[str, Any]:
    out = os.path.join(tmp, f"peer-{r}.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.world}",
           PEER_SCRIPT, "--data", args.data, "--batch-size", str(args.batch_size), "--steps", str(args.steps),
           "--warmup", str(args.window), "--window", str(args.window), "--out", out]
    if args.peer_threads:
        cmd += ["--threads", str(args.peer_threads)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=_REPO, env=_hermetic_env(tmp), capture_output=True, text=True)
    run: Dict[str, Any] = {"variant": PEER, "kind": "peer", "repeat": r, "wall_s": time.monotonic() - t0,
                           "returncode": p.returncode, "samples_per_s": None}
    if p.returncode != 0 or not os.path.exists(out):
        run["error"] = _tail(p.stdout + "\n" + p.stderr)
        return run
    with open(out) as f:
        run.update(peer_fields(json.load(f)))
    return run


def peer_fields(res: Mapping[str, Any]) -> Dict[str, Any]:
    """A run's figures from peer_torchrec.py's result JSON: samples/s (window median), the step times, the
    sharding TorchRec's planner chose."""
    plan = {t: v["sharding_type"] for t, v in res["sharding"].items()}
    return dict(samples_per_s=res["samples_per_s_window_median"] or res["samples_per_s"],
                samples_per_s_whole_window=res["samples_per_s"], step_ms=res["step_ms"],
                step_ms_mean=res["step_ms"]["mean"], step_time_s=res["step_ms"]["p50"] / 1e3,
                threads_per_rank=res["threads_per_rank"], loss_last=res["loss_last"],
                plan=plan, plan_detail=res["sharding"], plan_summary=plan_summary(plan))


def _read_mlflow(tracking_uri: str, run_id: Optional[str]) -> Tuple[Optional[str], List[Dict[str, Any]], Dict[str, str]]:
    """(run id, step-ordered reports, params); params gain ``_steady_span_s``: the wall-clock seconds from the
    end of the warm-up window to the last window (what :func:`steady_windows` measures), when there are two."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    if run_id is None:
        exp = client.get_experiment_by_name("bench-throughput")
        runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1) \
            if exp else []
        if not runs:
            return None, [], {}
        run_id = runs[0].info.run_id
    points = {k: client.get_metric_history(run_id, k) for k in RUN_METRICS}
    histories = {k: [(m.step, m.value) for m in ms] for k, ms in points.items()}
    params = dict(client.get_run(run_id).data.params)
    stamps = [m.timestamp / 1000.0 for m in sorted(points.get("samples_per_s", []), key=lambda m: m.step)]
    if len(stamps) > 1:
        params["_steady_span_s"] = [stamps[0], stamps[-1]]
    return run_id, reports_from_histories(histories), params


def run_rayemb(variant: str, args: argparse.Namespace, tmp: str, r: int, tables: Sequence[str],
               hot_tables: Optional[Sequence[str]], stats_path: Optional[str],
               wrap: Optional[Any] = None, extra_overrides: Sequence[str] = (), tag: str = "") -> Dict[str, Any]:
    """One ``rayemb train`` run of ``variant``; ``wrap(argv) -> argv`` runs it elsewhere (e.g. inside an
    emulated cluster's head namespace, joined to that cluster), ``extra_overrides`` are appended."""
    out_dir = os.path.join(tmp, f"{variant}-{r}{tag}")
    overrides = common_overrides(args.data, out_dir, args.steps, args.window, args.batch_size, args.world,
                                 f"{variant}-r{r}{tag}", stats_path) + variant_overrides(variant, tables, hot_tables)
    overrides += list(extra_overrides)
    cmd = [sys.executable, "-m", "rayemb.cli", "train", "--config", args.config]
    for o in overrides:
        cmd += ["--set", o]
    if wrap is not None:
        cmd = wrap(cmd)
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=_REPO, env=_hermetic_env(tmp), capture_output=True, text=True)
    run: Dict[str, Any] = {"variant": variant, "kind": "auto" if variant == AUTO else "forced", "repeat": r,
                           "wall_s": time.monotonic() - t0, "returncode": p.returncode, "samples_per_s": None,
                           "overrides": variant_overrides(variant, tables, hot_tables)}
    m = re.search(r"rayemb: run (\w+) (FINISHED|FAILED)", p.stdout)
    if p.returncode != 0:
        run["error"] = _tail(p.stdout + "\n" + p.stderr)
    # job folders only: jobs/ also holds files beside them (e.g. <name>.json), which may sort after them
    jobs = sorted(d for d in glob.glob(os.path.join(out_dir, "jobs", "*")) if os.path.isdir(d))
    if jobs:
        run["job_dir"] = jobs[-1]
        plan_path = os.path.join(jobs[-1], "plan.json")
        if os.path.exists(plan_path):
            with open(plan_path) as f:
                plan = json.load(f)
            run["plan"] = {t: v["placement"] for t, v in plan["tables"].items()}
            run["plan_summary"] = plan_summary(run["plan"])
            run["predicted_bytes_per_step"] = plan.get("predicted_bytes_per_step")
            run["predicted_step_time_s"] = plan.get("predicted_step_time_s")  # the step-time model's
            run["probed_step_time_s"] = plan.get("probed_step_time_s")  # the plan probe's (rayemb.train.calibration.plan_probe)
            run["plan_probe"] = plan.get("plan_probe")
            run["calibration"] = plan.get("calibration")
            run["prediction"] = plan.get("prediction")
    db = os.path.join(out_dir, "mlflow.db")
    if p.returncode == 0 and os.path.exists(db):
        run_id, reports, params = _read_mlflow(f"sqlite:///{db}", m.group(1) if m else None)
        run["run_id"] = run_id
        run["windows"] = steady_windows(reports)
        run["samples_per_s"] = steady_median(reports)
        run["time_s"] = {p_: steady_median(reports, f"time_s.{p_}") for p_ in PHASES}
        run["bytes_per_step"] = steady_median(reports, "bytes_per_step.total")
        run["step_time_s"] = steady_median(reports, "step_time_s")
        auc = [x["valid_auc"] for x in reports if "valid_auc" in x]
        run["valid_auc"] = auc[-1] if auc else None
        run["cpus_per_worker"] = params.get("scaling.cpus_per_worker_resolved")
        run["steady_span_s"] = params.get("_steady_span_s")
        if run["samples_per_s"] is None:
            run["error"] = "the run reported no samples_per_s (fewer steps than train.log_every_n_steps?)"
    elif p.returncode == 0:
        run["error"] = f"no MLflow store at {db}"
    return run


def reuse_auto_outputs(run: Mapping[str, Any], tmp: str, hot: Optional[List[str]],
                       stats_path: Optional[str]) -> Tuple[Optional[List[str]], Optional[str]]:
    """(hybrid tables, stats.json copy) from an auto run's job dir, for the runs after it; kept if already known."""
    job_dir = run.get("job_dir")
    if not job_dir:
        return hot, stats_path
    split = os.path.join(job_dir, "split.json")
    if hot is None and os.path.exists(split):
        with open(split) as f:
            hot = hot_tables_of(json.load(f))
    st = os.path.join(job_dir, "stats.json")
    if stats_path is None and os.path.exists(st):
        stats_path = os.path.join(tmp, "stats.json")
        shutil.copy(st, stats_path)
    return hot, stats_path


def ensure_data(path: str, rows: int) -> None:
    if os.path.exists(os.path.join(path, "schema.yaml")):
        return
    print(f"throughput: generating {path} ({rows:,} rows) ...", flush=True)
    subprocess.run([sys.executable, "-m", "rayemb.cli", "gen-data", "--out", path, "--rows", str(rows)],
                   cwd=_REPO, check=True)


def schema_tables(path: str) -> List[str]:
    import yaml

    with open(os.path.join(path, "schema.yaml")) as f:
        return [t["name"] for t in yaml.safe_load(f)["sparse"]]


def plot(rows: Sequence[Mapping[str, Any]], acc: Mapping[str, Any], png: str,
         global_batch: int = 1024) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # a chart never fails the benchmark
        print(f"throughput: no chart ({e})")
        return None
    shown = [r for r in rows if r.get("samples_per_s") is not None]
    if not shown:
        return None
    names = [r["variant"] for r in shown]
    vals = [r["samples_per_s"] for r in shown]
    err = [[v - (r.get("samples_per_s_min") or v) for v, r in zip(vals, shown)],
           [(r.get("samples_per_s_max") or v) - v for v, r in zip(vals, shown)]]
    colors = ["#7f7f7f" if r["kind"] == "peer" else "#1f77b4" if r["kind"] == "auto" else "#aec7e8" for r in shown]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.bar(names, vals, yerr=err, capsize=4, color=colors)
    peer = next((r["samples_per_s"] for r in shown if r["kind"] == "peer"), None)
    if peer:
        ax.axhline(peer, color="#7f7f7f", linestyle="--", linewidth=1, label="hand-written TorchRec")
        ax.legend(loc="lower right")
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"samples/s (global batch {global_batch}, median of windows)")
    ax.set_title("Training throughput, 2 ranks on one node: rayemb plans vs hand-written TorchRec", fontsize=10)
    ax.tick_params(axis="x", labelrotation=20)
    fig.text(0.01, 0.01, verdict(acc), fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


COLUMNS = [("row", "<14", "{}"), ("kind", "<7", "{}"), ("samples/s", ">10", "{:,.0f}"), ("min", ">8", "{:,.0f}"),
           ("max", ">8", "{:,.0f}"), ("vs peer", ">8", "{:.3f}"), ("vs best", ">8", "{:.3f}"),
           ("step ms", ">8", "{:.1f}"), ("pred/meas", ">9", "{:.2f}"), ("min", ">5", "{:.2f}"), ("max", ">5", "{:.2f}"),
           ("probe/meas", ">10", "{:.2f}"), ("wait/fwd/bwd/opt ms", "<20", "{}"), ("runs", ">4", "{}"),
           ("plan", "<36", "{}")]
KEYS = ["variant", "kind", "samples_per_s", "samples_per_s_min", "samples_per_s_max", "vs_peer", "vs_best_pure",
        "step_ms", "predicted_over_measured", "predicted_over_measured_min", "predicted_over_measured_max",
        "probed_over_measured", "phases_ms", "runs", "plan_summary"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(_REPO, "bench-results", "throughput.json"), help="JSON result file")
    ap.add_argument("--data", default=os.path.join(_REPO, "data", "synth_small"),
                    help="one-hot dataset (made with `rayemb gen-data --out DATA --rows GEN_ROWS` when missing)")
    ap.add_argument("--gen-rows", type=int, default=400000, help="rows to generate when --data is missing")
    ap.add_argument("--config", default=CONFIG, help="rayemb job config the variants override")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run, after one warm-up window "
                                                           "(default 200, --quick 100)")
    ap.add_argument("--window", type=int, default=20, help="steps per throughput window (train.log_every_n_steps)")
    ap.add_argument("--repeats", type=int, default=None,
                    help=f"runs of each side, interleaved (default {MIN_RUNS}, --quick 1; fewer than {MIN_RUNS}: "
                         "the verdicts FAIL)")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"rayemb variants, comma-separated, from {(AUTO,) + FORCED + EXTRA} (auto always runs)")
    ap.add_argument("--batch-size", type=int, default=512, help="rows per rank per step")
    ap.add_argument("--world", type=int, default=2, help="ranks (both sides)")
    ap.add_argument("--peer-threads", type=int, default=None, help="torch threads per peer rank "
                                                                  "(default: its own, cores // world)")
    ap.add_argument("--quick", action="store_true", help="one run of 100 steps per side (a smoke run: the "
                                                         "verdicts FAIL on too few runs)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a verdict fails")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (run outputs, Ray logs)")
    args = ap.parse_args(argv)
    args.steps = args.steps or (100 if args.quick else 200)
    args.repeats = args.repeats or (1 if args.quick else MIN_RUNS)
    args.data = os.path.abspath(args.data)
    args.config = os.path.abspath(args.config)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in (AUTO,) + FORCED + EXTRA]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}")
    if AUTO not in variants:
        variants.insert(0, AUTO)
    forced = [v for v in variants if v != AUTO and v not in NOT_PURE]
    extra = [v for v in variants if v in NOT_PURE]

    ensure_data(args.data, args.gen_rows)
    tables = schema_tables(args.data)
    tmp = tempfile.mkdtemp(prefix="rbt-")  # short: Ray's socket paths live under it
    runs: List[Dict[str, Any]] = []
    hot: Optional[List[str]] = None
    stats_path: Optional[str] = None
    t_start = time.monotonic()
    try:
        for r in range(args.repeats):
            for name in round_order(variants, r):
                if name == "hybrid" and not hot:
                    print("throughput: skipping hybrid: " + ("no auto run produced split.json" if hot is None
                                                             else "no table has a hot set and a cold remainder"),
                          flush=True)
                    continue
                print(f"throughput: round {r + 1}/{args.repeats}: {name} ...", flush=True)
                if name == PEER:
                    run = run_peer(args, tmp, r)
                else:
                    run = run_rayemb(name, args, tmp, r, tables, hot, stats_path)
                    if name == AUTO:
                        hot, stats_path = reuse_auto_outputs(run, tmp, hot, stats_path)
                runs.append(run)
                sps = run.get("samples_per_s")
                print(f"throughput:   {name}: " + (f"{sps:,.0f} samples/s" if sps else "FAILED")
                      + (f", plan {run['plan_summary']}" if run.get("plan_summary") else "")
                      + f" ({run['wall_s']:.0f}s)", flush=True)
                if run.get("error"):
                    print("throughput:   error:\n" + run["error"], flush=True)
    finally:
        if args.keep:
            print(f"throughput: run outputs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    rows = aggregate(runs)
    acc = acceptance(rows, forced, extra)
    out_rows = table_rows(rows, acc)
    from rayemb.batch_shape import BatchShape

    batch = BatchShape(args.batch_size, args.world)
    png = plot(out_rows, acc, os.path.splitext(args.out)[0] + ".png", batch.global_size)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "throughput",
        "config": {"data": args.data, "config": args.config, "steps": args.steps, "window": args.window,
                   "repeats": args.repeats, "batch_size": args.batch_size, "world_size": args.world,
                   "global_batch": batch.global_size, "variants": variants, "hot_tables": hot,
                   "cpu_count": os.cpu_count(), "wall_s": time.monotonic() - t_start},
        "results": out_rows,
        "acceptance": acc,
        "chart": png,
        "runs": runs,
    }
    doc["plan_choice"] = choice = plan_choice(runs, forced)
    report(args.out, doc, out_rows, COLUMNS, KEYS, footer=verdict(acc) + "\n" + auto_plan_line(choice))
    if png:
        print(f"wrote {png}")
    if args.check and not all(acc[k] for k in ("rows_pass", "auto_vs_peer_pass", "auto_vs_best_pure_pass",
                                               "prediction_pass")):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
