"""Full ``rayemb train`` jobs on this machine's GPU: step time measured against the step-time model's prediction.

Each job is the default config (``--config``) on one GPU rank (``scaling.use_gpu=true``, one worker) on a
private local Ray, run through the CLI exactly as a user runs it (``throughput.py``'s runner: HOME, TMPDIR and
RAY_TMPDIR in a temp dir), one epoch (``--steps`` caps it), at each global batch of ``--batches``. Per job:

* ``samples_per_s``, the measured step (``step_time_s``) and its split (``time_s.data_wait/forward/backward/
  optimizer``): medians over the windows of ``--window`` steps after the first, from the job's MLflow store;
* plan.json's ``predicted_step_time_s`` (the model's, before any timing of the plan) and ``probed_step_time_s``
  (the plan probe's), each over the measured step;
* the job's wall time, its training steps' share of it, and its validation AUC.

The ratios are recorded, not judged: the model is judged on CPU ranks by ``throughput.py`` and
``multinode.py``. Usage (``scripts/gpu_job.sh`` runs it on an offline GPU machine)::

    python jobs/bench/gpu_job.py --out bench-results/gpu_job.json [--batches 512,8192] [--repeats 1]

Writes ``{"schema_version": 1, "results": [...], "runs": [...], "device": ...}`` and prints a table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from _report import report  # noqa: E402
from throughput import CONFIG, aggregate, ensure_data, reuse_auto_outputs, run_rayemb, schema_tables  # noqa: E402

SCHEMA_VERSION = 1
COLUMNS = [("global batch", ">12", "{:,}"), ("runs", ">4", "{}"), ("samples/s (min-max)", "<26", "{}"),
           ("step ms", ">7", "{:.2f}"), ("fwd/bwd/opt/wait ms", "<22", "{}"), ("model/meas", ">10", "{:.2f}"),
           ("probe/meas", ">10", "{:.2f}"), ("job s", ">6", "{:.0f}"), ("steps s", ">7", "{:.1f}"),
           ("AUC", ">6", "{:.4f}")]
KEYS = ["global_batch", "runs", "samples_per_s_text", "step_ms", "phases_ms", "predicted_over_measured",
        "probed_over_measured", "wall_s", "training_s", "valid_auc"]


def device_name() -> Optional[str]:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a report field, never a reason to fail the benchmark
        return None


def training_seconds(run: Mapping[str, Any], window: int) -> Optional[float]:
    """Seconds the job spent in training steps: its steady step times the steps it logged (whole windows)."""
    windows, step = run.get("windows"), run.get("step_time_s")
    return step * (len(windows) + 1) * window if windows and step else None


def summarise(runs: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """One row per global batch: ``throughput.aggregate``'s medians over its runs (samples/s with min-max, the
    model's and the probe's step over each run's measured step, the phases), plus the job-level figures."""
    rows = aggregate([{**r, "variant": r["global_batch"], "kind": "auto"} for r in runs])
    out = []
    for b in sorted(rows):
        row = rows[b]
        ok = [r for r in runs if r["global_batch"] == b and r.get("samples_per_s") is not None]

        def med(key: str) -> Optional[float]:
            vals = [x[key] for x in ok if x.get(key) is not None]
            return float(statistics.median(vals)) if vals else None

        sps, step, ph = row["samples_per_s"], med("step_time_s"), row.get("time_s") or {}
        row.update(global_batch=b,
                   samples_per_s_text=(f"{sps:,.0f} ({row['samples_per_s_min']:,.0f}-{row['samples_per_s_max']:,.0f})"
                                       if sps else "FAILED"),
                   step_time_s=step, step_ms=1e3 * step if step else None,
                   phases_ms="/".join(f"{1e3 * ph[p]:.2f}" if p in ph else "-"
                                      for p in ("forward", "backward", "optimizer", "data_wait")),
                   predicted_step_time_s=med("predicted_step_time_s"), probed_step_time_s=med("probed_step_time_s"),
                   wall_s=med("wall_s"), training_s=med("training_s"), valid_auc=med("valid_auc"))
        out.append(row)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join("bench-results", "gpu_job.json"), help="JSON result file")
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "rayemb-gpu-data", "synth_small"),
                    help="one-hot dataset (made with `rayemb gen-data --rows GEN_ROWS` when missing)")
    ap.add_argument("--gen-rows", type=int, default=400000)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--batches", default="512,8192", help="global batches, comma-separated (one rank: per rank)")
    ap.add_argument("--steps", type=int, default=100000, help="cap on steps per job (default: one whole epoch)")
    ap.add_argument("--window", type=int, default=20, help="steps per throughput window")
    ap.add_argument("--repeats", type=int, default=1, help="jobs per batch, interleaved")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (job outputs, Ray logs)")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    args.data, args.config, args.world = os.path.abspath(args.data), os.path.abspath(args.config), 1
    ensure_data(args.data, args.gen_rows)
    tables = schema_tables(args.data)
    tmp = tempfile.mkdtemp(prefix="rbg-")
    runs: List[Dict[str, Any]] = []
    stats_path: Optional[str] = None
    t0 = time.monotonic()
    try:
        for r in range(args.repeats):
            for b in (batches if r % 2 == 0 else batches[::-1]):
                args.batch_size = b
                print(f"gpu_job: round {r + 1}/{args.repeats}: global batch {b} ...", flush=True)
                run = run_rayemb("auto", args, tmp, r, tables, None, stats_path,
                                 extra_overrides=["scaling.use_gpu=true"], tag=f"-b{b}")
                _, stats_path = reuse_auto_outputs(run, tmp, None, stats_path)
                run["global_batch"] = b
                run["training_s"] = training_seconds(run, args.window)
                runs.append(run)
                print(f"gpu_job:   {b}: " + (f"{run['samples_per_s']:,.0f} samples/s, step "
                                            f"{1e3 * run['step_time_s']:.2f} ms, model "
                                            f"{1e3 * (run.get('predicted_step_time_s') or float('nan')):.2f} ms"
                                            if run.get("samples_per_s") else "FAILED")
                      + f" ({run['wall_s']:.0f}s)", flush=True)
                if run.get("error"):
                    print("gpu_job:   error:\n" + run["error"], flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = summarise(runs)
    doc = {"schema_version": SCHEMA_VERSION, "benchmark": "gpu_job", "device": device_name(),
           "config": {"data": args.data, "config": args.config, "batches": batches, "repeats": args.repeats,
                      "window": args.window, "steps_cap": args.steps, "wall_s": time.monotonic() - t0},
           "results": rows, "runs": runs}
    report(args.out, doc, rows, COLUMNS, KEYS,
           footer="model/meas: plan.json's predicted_step_time_s over the measured step (recorded, not judged)")
    return 0 if rows and all(r["runs"] and not r["failed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
