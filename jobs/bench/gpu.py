"""The training step on one device: rayemb's against two hand-written TorchRec loops, interleaved in one run.

Rows, at each global batch of ``--batches`` (default 512, 8192, 65536) on one rank (world size 1):

* ``rayemb``: the job's own model and step: the DLRM of ``--config`` (jobs/configs/synth_small.yaml) sharded by
  ``rayemb.train.worker.build.build_step`` with the plan the job's planner makes, stepped by its
  ``rayemb.train.worker.step.TrainStep`` with the loop's loss, prefetch, byte counter and timer, on the converted batches
  the loader holds in host memory (pinned on CUDA), each copied to the device by the loop's ``DeviceFeed``
  while the step before it runs;
* ``dmp_on_device``: TorchRec's ``DLRMTrain`` (same tables and MLPs) under ``DistributedModelParallel`` with
  TorchRec's planner, fused row-wise Adagrad, dense Adagrad, every batch on the device before any timing;
* ``torchrec_pipeline``: the same model stepped by TorchRec's ``TrainPipelineSparseDist`` over host batches
  (pinned on CUDA): it copies the next batch and starts its input exchange while the current one trains;
* ``rayemb_compiled`` (only with ``--compile MODE``): the ``rayemb`` row with the dense part of its model
  compiled in torch.compile's MODE (``train.compile: dense``, rayemb.train.worker.compile; ``reduce-overhead``: CUDA
  graphs). It starts from the same weights and steps the same batches as ``rayemb``, so its losses should
  match: ``loss_max_diff_vs_rayemb`` says by how much they differ.

The data is synthetic (``rayemb.data.synthetic``; ``--tiny``: small tables), made in a temp dir; each row
cycles ``--pool`` distinct batches. The rows of a batch size live side by side and are timed round-robin
(``rayemb.train.calibration.probes.Interleaved``: a round runs ``--steps`` steps of each row, the order rotated
each round, the device synchronised before the clock stops): ``--repeats`` rounds after one warm-up round, a
row the median per step over its rounds with their min-max, and its mean loss per round.

Verdicts (GPU targets, ``n/a (cpu)`` on a CPU; FAIL when a row they rest on is missing, failed or has fewer
than MIN_RUNS rounds): TARGETS, about the ``rayemb`` row only. ``--job`` also runs one default job (one epoch,
one rank on this device) through jobs/bench/job_phases.py and records its phases: submit -> first step -> last
step -> FINISHED.

Usage::

    python jobs/bench/gpu.py --out bench-results/gpu_<date>_<commit>.json [--batches 512,8192] [--job]
    python jobs/bench/gpu.py --compile reduce-overhead --out bench-results/gpu_compile_<date>_<commit>.json
    python jobs/bench/gpu.py --device cpu --tiny --out /tmp/gpu_tiny.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from _report import report, row_problem, spread  # noqa: E402
from gpu_job import device_name  # noqa: E402
from regression import _rev  # noqa: E402
from throughput import CONFIG  # noqa: E402

from rayemb.config import COMPILE_MODES  # noqa: E402

SCHEMA_VERSION = 1
RAYEMB, DMP, PIPELINE = "rayemb", "dmp_on_device", "torchrec_pipeline"
#: the rayemb row with its dense part compiled (--compile)
COMPILED = "rayemb_compiled"
#: rounds a row needs before a verdict rests on it
MIN_RUNS = 3
#: (name, global batch, what is compared, threshold): rayemb's samples/s, or its samples/s over a peer's
TARGETS = (("b8192_samples_per_s", 8192, "samples_per_s", 3.3e6),
           ("b8192_vs_dmp_on_device", 8192, DMP, 2.0),
           ("b512_vs_dmp_on_device", 512, DMP, 1.3))
#: tables of --tiny: the default job's cardinalities divided by this much more (at least 3 rows each)
TINY_SCALE = 50_000
COLUMNS = [("global batch", ">12", "{:,}"), ("row", "<17", "{}"), ("runs", ">4", "{}"), ("step ms", ">9", "{:.3f}"),
           ("min-max ms", "<17", "{}"), ("samples/s", ">12", "{:,.0f}"), ("rayemb/this", ">11", "{:.2f}"),
           ("loss first->last", "<17", "{}")]
KEYS = ["global_batch", "row", "runs", "step_ms", "spread_text", "samples_per_s", "rayemb_ratio", "loss_text"]


def default_out(commit: str, date: Optional[str] = None) -> str:
    """``bench-results/gpu_<YYYY-MM-DD>_<commit7>.json``."""
    return os.path.join("bench-results", f"gpu_{date or time.strftime('%Y-%m-%d')}_{commit[:7]}.json")


def commit() -> str:
    """This checkout's commit, "unknown" where the tree is no git checkout (a copy on another machine)."""
    try:
        return _rev("HEAD")
    except Exception:  # noqa: BLE001 - a name in the result, never a reason to fail the benchmark
        return "unknown"


# ---- data: the job's schema, synthetic rows, the batches each row holds ---- #


def make_data(root: str, rows: int, tiny: bool) -> Any:
    """Writes a synthetic one-hot dataset of at least ``rows`` train rows under ``root``; returns its schema."""
    from rayemb.constants import DEFAULT_CARDINALITY_SCALE
    from rayemb.data.synthetic import SyntheticSpec, generate

    train_share = 1.0 - SyntheticSpec.valid_fraction  # the rest goes to the valid split, unused here
    spec = SyntheticSpec(rows=math.ceil(rows / train_share) + 1,
                         scale=TINY_SCALE if tiny else DEFAULT_CARDINALITY_SCALE)
    return generate(spec, root)


def host_tables(data_dir: str, batch: int, pool: int) -> List[Any]:
    """``pool`` pyarrow slices of ``batch`` train rows (fewer when the split holds fewer)."""
    import pyarrow.parquet as pq

    from rayemb.constants import TRAIN_SPLIT
    from rayemb.data.schema import parquet_files

    table = pq.read_table(parquet_files(data_dir, TRAIN_SPLIT))
    return [table.slice(i * batch, batch) for i in range(min(pool, table.num_rows // batch))]


# ---- the three rows: each a callable running n training steps and returning their summed loss ---- #


def rayemb_row(cfg: Any, schema: Any, stats: Any, tables: Sequence[Any], device: Any,
               hbm_gib: Optional[float], compile_mode: Optional[str] = None) -> Dict[str, Any]:
    """The job's plan for one rank of this device (no calibration at one rank: a job makes none), then the
    loop's step (rayemb.train.worker.loop.train_loop_per_worker) on the loader's host batches; ``compile_mode``: the
    dense part compiled in that mode, as ``train.compile: dense`` compiles it."""
    import dataclasses

    import torch

    from rayemb.data.batching import BatchConverter
    from rayemb.embedding.comm import CommCounter
    from rayemb.planner.tables import split_rule
    from rayemb.planner.topology import described_topology
    from rayemb.train.worker.build import build_step
    from rayemb.train.worker.device_feed import DeviceFeed, pinned
    from rayemb.train.worker.loop import _step_batch
    from rayemb.train.sharding import make_job_plan
    from rayemb.train.worker.step import LossWindow, StepTimer

    topology = described_topology(1, 1, hbm_gib=hbm_gib, compute_device=device.type)
    split = split_rule(topology, cfg.data.batch_size, cfg.model.embedding_dim).split(stats)
    job_plan = make_job_plan(cfg, schema, stats, split, topology)
    torch.manual_seed(cfg.train.seed)  # the plain and the compiled row start from the same weights
    # the plain row eager whatever the config says, the compiled row in --compile's mode
    cfg = cfg.replace(train=dataclasses.replace(cfg.train, compile="none" if compile_mode is None else "dense",
                                                compile_mode=compile_mode or cfg.train.compile_mode))
    built = build_step(cfg, schema, job_plan, device, table_stats=dict(stats.tables))
    compiled = None if compile_mode is None else built.compiled
    convert = BatchConverter(schema, cfg.data.id_policy, remap=built.remapper.remap)
    if device.type == "cuda":  # as the loop converts them: pinned, for asynchronous copies
        convert = pinned(convert)
    held = [convert(t) for t in tables]  # as RankBatches holds them in memory: converted, on the host
    timer = StepTimer()
    step = built.train_step(counter=CommCounter(), timer=timer)
    # each batch copied to the device while the step before it runs, as in the loop
    losses = step.steps(DeviceFeed(itertools.cycle(held), functools.partial(_step_batch, device=device), device))
    phases: List[Dict[str, float]] = []

    def run(n: int) -> Any:
        window = LossWindow(device, 1)
        timer.reset()
        for _ in range(n):
            window.add(next(losses))
        phases.append({p: v / n for p, v in timer.totals.items()})
        return window.sum

    return {"run": run, "finish": step.finish if built.prefetch is not None else None, "phases": phases,
            "plan": _counts([str(t["placement"]) for t in job_plan.summary["tables"].values()]),
            "compiled": compiled}


def peer_model(cfg: Any, schema: Any, batch: int, device: Any) -> Tuple[Any, Any, Dict[str, int]]:
    """peer_torchrec.py's model (TorchRec's DLRM of the job's tables and MLPs under DMP with TorchRec's planner)
    wrapped in DLRMTrain, as TrainPipelineSparseDist wants; its optimizer; its sharding types counted."""
    from peer_torchrec import build_model, sharding_of

    m = cfg.model
    model, optimizer, plan = build_model(
        [(f.name, int(f.num_embeddings)) for f in schema.sparse], len(schema.dense),
        embedding_dim=m.embedding_dim, bottom_mlp=m.bottom_mlp, top_mlp=m.top_mlp, batch_size=batch,
        world_size=1, device=device, embedding_lr=cfg.train.embedding_lr, dense_lr=cfg.train.dense_lr,
        train_wrapper=True)
    types = [v["sharding_type"] for v in sharding_of(plan).values()]
    return model, optimizer, _counts(types)


def peer_row(kind: str, cfg: Any, schema: Any, batch: int, tables: Sequence[Any], device: Any) -> Dict[str, Any]:
    """``dmp_on_device``: the hand-written loop (forward and loss, backward with the fused embedding update, the
    dense step) on batches put on the device beforehand; ``torchrec_pipeline``: TorchRec's TrainPipelineSparseDist
    over host batches (pinned on CUDA, as its copy stream wants). Both take the same rows as TorchRec ``Batch``es
    of raw ids (the peers have no remap)."""
    import torch
    from torchrec.datasets.utils import Batch
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    from rayemb.data.batching import BatchConverter

    model, optimizer, plan = peer_model(cfg, schema, batch, device)
    host = [Batch(dense_features=b.dense, sparse_features=b.sparse, labels=b.labels)
            for b in map(BatchConverter(schema, cfg.data.id_policy), tables)]
    if kind == DMP:
        on_device = itertools.cycle([b.to(device) for b in host])

        def one() -> Any:
            loss, _ = model(next(on_device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss.detach()
    else:
        pipeline = TrainPipelineSparseDist(model, optimizer, device)
        source = itertools.cycle([b.pin_memory() for b in host] if device.type == "cuda" else host)

        def one() -> Any:
            return pipeline.progress(source)[0]  # DLRMTrain's (loss, logits, labels), detached

    def run(n: int) -> Any:
        total = torch.zeros((), dtype=torch.float64, device=device)
        for _ in range(n):
            total += one()
        return total

    return {"run": run, "finish": None, "plan": plan}


def _counts(values: Sequence[str]) -> Dict[str, int]:
    return {v: values.count(v) for v in sorted(set(values))}


class _Timed:
    """One row as an Interleaved step: ``steps`` training steps, their mean loss kept on the device; a row that
    raises is marked failed and does nothing from then on (the other rows go on)."""

    def __init__(self, build: Callable[[], Dict[str, Any]], steps: int) -> None:
        self.steps, self.losses, self.error, self.built = steps, [], None, {}
        try:
            self.built = build()
        except Exception as e:  # noqa: BLE001 - a row that cannot be built is reported failed, not fatal
            self.error = f"build: {type(e).__name__}: {e}"

    def __call__(self) -> None:
        if self.error is None:
            try:
                self.losses.append(self.built["run"](self.steps) / self.steps)
            except Exception as e:  # noqa: BLE001 - recorded: the row reads failed
                self.error = f"step: {type(e).__name__}: {e}"

    def finish(self) -> None:
        if self.error is None and self.built.get("finish") is not None:
            self.built["finish"]()


def time_batch(builders: Mapping[str, Callable[[], Dict[str, Any]]], steps: int, repeats: int,
               device: Any) -> Dict[str, Tuple[_Timed, List[float]]]:
    """Every row built, then timed round-robin: ``repeats`` rounds after one warm-up round."""
    import torch

    from rayemb.train.calibration.probes import Interleaved

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    rows = {name: _Timed(build, steps) for name, build in builders.items()}
    iv = Interleaved(sync)
    for name, row in rows.items():
        iv.add(name, row, row.finish)
    iv.run(rounds=repeats, warmup=1)
    return {name: (row, iv.times[name]) for name, row in rows.items()}


def summarise(batch: int, name: str, row: _Timed, times: Sequence[float]) -> Dict[str, Any]:
    """One table row: per-step milliseconds over the rounds (median, min, max), samples/s, the losses."""
    losses = [float(x) for x in row.losses]  # read back here, after the timing
    out: Dict[str, Any] = {"global_batch": batch, "row": name, "steps_per_round": row.steps, "runs": 0,
                           "failed": 1 if row.error else 0, "error": row.error, "plan": row.built.get("plan"),
                           "samples_per_s": None, "losses": losses}
    if row.error is None:
        ms = spread(1e3 * t / row.steps for t in times)
        out.update(runs=ms["n"], step_ms=ms["median"], step_ms_min=ms["min"], step_ms_max=ms["max"],
                   samples_per_s=batch / (ms["median"] / 1e3), samples_per_s_min=batch / (ms["max"] / 1e3),
                   samples_per_s_max=batch / (ms["min"] / 1e3), steps_timed=ms["n"] * row.steps,
                   spread_text=f"{ms['min']:.3f}-{ms['max']:.3f}")
    if losses:
        out.update(loss_first=losses[0], loss_last=losses[-1], losses_finite=all(map(math.isfinite, losses)),
                   loss_text=f"{losses[0]:.4f}->{losses[-1]:.4f}")
    phases = row.built.get("phases")
    if phases:  # the loop's StepTimer per step (host wall clock: on a GPU, what the host waited for)
        out["phases_ms"] = {p: 1e3 * spread(ph[p] for ph in phases[1:] or phases)["median"] for p in phases[0]}
    if row.built.get("compiled") is not None:
        out["compiled_modules"] = row.built["compiled"]
    return out


def add_ratios(rows: List[Dict[str, Any]]) -> None:
    """Each row's ``rayemb_ratio``: rayemb's samples/s over this row's at the same batch (None if either failed)."""
    for r in rows:
        mine = next((x for x in rows if x["global_batch"] == r["global_batch"] and x["row"] == RAYEMB), None)
        ok = mine is not None and mine["samples_per_s"] and r["samples_per_s"]
        r["rayemb_ratio"] = mine["samples_per_s"] / r["samples_per_s"] if ok else None


def add_loss_diffs(rows: List[Dict[str, Any]]) -> None:
    """Each compiled row's ``loss_max_diff_vs_rayemb``: the largest gap between its per-round losses and the
    ``rayemb`` row's at the same batch (the same start, the same batches: only the compiled code differs)."""
    for r in rows:
        if r["row"] != COMPILED:
            continue
        mine = next((x for x in rows if x["global_batch"] == r["global_batch"] and x["row"] == RAYEMB), None)
        ok = mine is not None and r["losses"] and len(mine["losses"]) == len(r["losses"])
        r["loss_max_diff_vs_rayemb"] = max(abs(a - b) for a, b in zip(r["losses"], mine["losses"])) if ok else None


def verdicts(rows: Sequence[Mapping[str, Any]], device_type: str) -> Dict[str, Dict[str, Any]]:
    """TARGETS against the rows: PASS/FAIL with the value; FAIL when a row they rest on cannot carry a verdict
    (``_report.row_problem``); ``n/a (cpu)`` on a CPU, where these GPU targets do not apply."""
    def find(batch: int, name: str) -> Optional[Mapping[str, Any]]:
        return next((r for r in rows if r["global_batch"] == batch and r["row"] == name), None)

    out = {}
    for key, batch, what, threshold in TARGETS:
        needed = [RAYEMB] if what == "samples_per_s" else [RAYEMB, what]
        problems = {n: p for n in needed if (p := row_problem(find(batch, n), MIN_RUNS, False))}
        value = None
        if not problems:
            mine = find(batch, RAYEMB)["samples_per_s"]
            value = mine if what == "samples_per_s" else mine / find(batch, what)["samples_per_s"]
        rule = (f"batch {batch}: rayemb " + (f">= {threshold:,.0f} samples/s" if what == "samples_per_s"
                                             else f">= {threshold}x {what}"))
        verdict = ("n/a (cpu)" if device_type != "cuda" else "FAIL" if problems
                   else "PASS" if value >= threshold else "FAIL")
        out[key] = {"rule": rule, "value": value, "threshold": threshold, "verdict": verdict,
                    "problems": problems or None}
    return out


def verdict_line(v: Mapping[str, Any]) -> str:
    value = "-" if v["value"] is None else f"{v['value']:,.2f}"
    return f"{v['rule']}: {value} {v['verdict']}"


# ---- --job: one default job's phases ---- #

JOB_PHASES = ("submit_to_first_step_s", "first_to_last_step_s", "last_step_to_finished_s", "wall_s")


def job_phases(device_type: str, tmp: str) -> Dict[str, Any]:
    """One default job, one epoch, one rank on this device (jobs/bench/job_phases.py's run), its phases as
    submit -> first step -> last step -> FINISHED."""
    import json

    import ray

    import job_phases as jp

    path = os.path.join(tmp, "job_phases.json")
    overrides = ["scaling.num_workers=1", f"scaling.use_gpu={str(device_type == 'cuda').lower()}"]
    try:  # its own table and its warm-runs target (which one run cannot meet) print first
        jp.main(["--runs", "1", "--out", path, *[a for o in overrides for a in ("--set", o)]])
    finally:
        ray.shutdown()
    with open(path) as f:
        run = json.load(f)["runs"][0]
    if "error" in run:
        return {"error": run["error"]}
    ph = run["phases"]
    after = ph.get("steps", 0.0) + ph.get("validation_and_checkpoints", 0.0) + ph.get("end", 0.0)
    return {"phases": ph, "wall_s": run["wall_s"], "valid_auc": run.get("valid_auc"),
            "submit_to_first_step_s": ph["wall"] - after if "steps" in ph else None,
            "first_to_last_step_s": ph.get("steps"), "last_step_to_finished_s": ph.get("end")}


# ---- main ---- #


def row_builders(compile_mode: Optional[str], cfg: Any, schema: Any, stats: Any, batch: int, tables: Sequence[Any],
                 device: Any, hbm: Optional[float]) -> Dict[str, Callable[[], Dict[str, Any]]]:
    """The rows of one batch size, by name: rayemb's, the two peers', and with ``compile_mode`` rayemb's
    compiled one."""
    builders = {RAYEMB: lambda: rayemb_row(cfg, schema, stats, tables, device, hbm),
                DMP: lambda: peer_row(DMP, cfg, schema, batch, tables, device),
                PIPELINE: lambda: peer_row(PIPELINE, cfg, schema, batch, tables, device)}
    if compile_mode is not None:
        builders[COMPILED] = lambda: rayemb_row(cfg, schema, stats, tables, device, hbm, compile_mode)
    return builders


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small tables, batches 64,256 and a few steps (CPU)")
    ap.add_argument("--batches", default=None, help="global batches, comma-separated (default 512,8192,65536)")
    ap.add_argument("--steps", type=int, default=None, help="steps per row per round (default 50; tiny 4)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 7; tiny 3)")
    ap.add_argument("--pool", type=int, default=8, help="distinct batches each row cycles through")
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--job", action="store_true", help="also run one default job and record its phases")
    ap.add_argument("--compile", default=None, choices=COMPILE_MODES, metavar="MODE",
                    help=f"also time rayemb with its dense part compiled in torch.compile's MODE {COMPILE_MODES}")
    ap.add_argument("--out", default=None, help="JSON result (default bench-results/gpu_<date>_<commit7>.json)")
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in (args.batches or ("64,256" if args.tiny else "512,8192,65536")).split(",") if b]
    args.steps = args.steps or (4 if args.tiny else 50)
    args.repeats = args.repeats or (3 if args.tiny else 7)
    args.out = args.out or default_out(commit())
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    import fbgemm_gpu
    import torch
    import torchrec

    from rayemb.config import load_config
    from rayemb.data.stats import compute_stats
    from rayemb.logs import quiet_third_party_logs
    from rayemb.multiprocess import free_port, process_group

    quiet_third_party_logs()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu: --device cuda, but torch sees no CUDA device")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    hbm = torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tmp = tempfile.mkdtemp(prefix="rayemb-gpu-bench-")
    rows: List[Dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        data_dir = os.path.join(tmp, "data")
        schema = make_data(data_dir, max(args.batches) * args.pool, args.tiny)
        stats = compute_stats(data_dir, in_process=True)
        with process_group(0, 1, free_port(), "nccl" if device.type == "cuda" else "gloo"):
            for batch in args.batches:
                cfg = load_config(args.config, [f"data.batch_size={batch}", "scaling.num_workers=1",
                                                f"scaling.use_gpu={str(device.type == 'cuda').lower()}"])
                tables = host_tables(data_dir, batch, args.pool)
                torch.manual_seed(cfg.train.seed)
                timed = time_batch(row_builders(args.compile, cfg, schema, stats, batch, tables, device, hbm),
                                   args.steps, args.repeats, device)
                rows.extend(summarise(batch, name, row, times) for name, (row, times) in timed.items())
                print(f"gpu: batch {batch}: " + ", ".join(
                    f"{r['row']} {r['samples_per_s'] or 0:,.0f}/s" for r in rows[-len(timed):]), flush=True)
                del timed
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        job = job_phases(device.type, tmp) if args.job else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    add_ratios(rows)
    add_loss_diffs(rows)
    verdict = verdicts(rows, device.type)
    doc = {"schema_version": SCHEMA_VERSION, "benchmark": "gpu", "commit": commit(),
           "device": {"type": device.type, "name": device_name() if device.type == "cuda" else
                      f"cpu ({os.cpu_count()} cores)", "torch_threads": torch.get_num_threads()},
           "versions": {"torch": torch.__version__, "fbgemm_gpu": getattr(fbgemm_gpu, "__version__", None),
                        "torchrec": getattr(torchrec, "__version__", None)},
           "config": {"config": args.config, "batches": args.batches, "steps_per_round": args.steps,
                      "repeats": args.repeats, "warmup_rounds": 1, "pool": args.pool, "tiny": args.tiny,
                      "compile": args.compile,
                      "world_size": 1, "tables": len(schema.sparse), "wall_s": time.monotonic() - t0},
           "rows": rows, "verdicts": verdict, "job": job}
    footer = "\n".join(verdict_line(v) for v in verdict.values())
    if job:
        footer += "\njob: " + ", ".join(f"{k} {job[k]:.1f} s" for k in JOB_PHASES if job.get(k) is not None)
    report(args.out, doc, rows, COLUMNS, KEYS, footer=footer)
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
