"""Multi-node throughput on an emulated cluster: rayemb's plan vs forced plans vs TorchRec's own, per bandwidth
and wire precision.

For each ``--bandwidth-mbit`` B, ``cluster/emulate.py`` brings up ``--nodes``
network-namespace nodes on a bridge whose links are shaped to B mbit (tc tbf,
both directions), one Ray node each (token auth); every rayemb row then runs as a
real ``rayemb train`` job whose driver sits in the head's namespace, one
worker per node (``scaling.placement_strategy=SPREAD``), so every collective
crosses the shaped links. Same data, model, global batch, steps and cores for
every row of one bandwidth.

Workloads (``--workload``): ``synth-small`` (data/synth_small, jobs/configs/synth_small.yaml) and
``criteo-1tb-scaled`` (jobs/configs/criteo_1tb_scaled.yaml: Criteo 1TB's 26 tables divided by 16, 11.1M rows
at dim 64, each table Zipf with its own exponent; its data generated once by ``rayemb gen-data --profile
criteo-1tb-scaled --rows N`` into ``--data-cache``/criteo_1tb_scaled_N and reused after), and its CI-size twin
``criteo-1tb-tiny`` (the same config and model on the same 26 tables and exponents divided by 3000, largest
16,313 rows: the scaled workload's code paths end to end in a test's time, not a benchmark's figures).

Rows, each at every ``--precisions`` value (named ``variant@precision``: ``auto@bf16``; rayemb rows set
``train.comm_precision`` both ways, TorchRec's rows hand its ``QCommsConfig`` codecs to its sharder):

* ``auto``: rayemb's plan (step-time objective, calibrated on this cluster at job start);
* ``no_hybrid``: the plan without hybrid (data-parallel small tables, pooled
  model-parallel large ones), and ``table_wise``, ``row_wise``, ``column_wise``:
  every table pinned to that sharding -- the best of these is "the best pooled plan";
* ``hybrid``: HugeCTR's hybrid embedding -- one frequency threshold over every
  table: each table with infrequent rows (the first ``auto`` run's ``split.json`` at
  this bandwidth: a hot set the threshold sized and a cold remainder) is made
  hybrid, every other table stays where ``no_hybrid`` (same precision) put it;
* ``torchrec``: TorchRec as its docs teach it, without rayemb, ``jobs/bench/peer_torchrec.py`` (the stock
  ``EmbeddingShardingPlanner`` over the cluster's ``Topology`` with the link speed, ``DistributedModelParallel``,
  the fused embedding optimizer, ``TrainPipelineSparseDist``; ``torchrec@bf16``: ``get_qcomm_codecs_registry``
  + ``QCommsConfig``, which on gloo send fp16), one ``torchrun`` per node in its namespace, joined over the
  shaped links, one thread per rank as the rayemb workers have;
* not run by default (``--variants``): ``hybrid_mp`` (only ``no_hybrid``'s *model-parallel* tables with a
  hot set made hybrid), ``data_parallel`` (every table replicated: 1-2 s a step at <= 100 mbit) and
  ``hybrid_all`` (hybrid pinned on every table with a hot set).

Per row, over its ``--repeats`` runs (default 5) in interleaved rounds (every row once a round: one run of a
plan varies by up to ±15 % on a shared 2-core machine): samples/s (each run: the median of its log windows
after the first), its median with min-max, the measured step, the step-time model's prediction for that plan
(plan.json ``predicted_step_time_s``, made before any timing of the plan) and the plan probe's step, each over
the measured step (median of the runs' ratios, min-max), bytes per step counted from the collectives, the
validation AUC after ``--window`` + ``--steps`` steps (rayemb rows: the job's epoch-end ``valid_auc`` at
``train.max_steps_per_epoch``; TorchRec rows: the same valid split scored after as many steps), and where the
cores went in the run's timed windows (``host_cpu.py``).

Acceptance (``acceptance.per_bandwidth["100"]``, ...; printed with PASS/FAIL, exit 0 unless ``--check``):
``auto_vs_torchrec`` (the faster auto row over torchrec@fp32; target 2.0x at <= 100 mbit),
``auto_vs_torchrec_qcomm`` (over torchrec@bf16; 1.5x at <= 100 mbit), ``auto_vs_torchrec_best`` (over the
faster torchrec row; 1.2x above 100 mbit), ``hybrid_vs_pooled`` (per precision, hybrid over the best pooled row;
1.3x at <= 100 mbit), ``bf16_vs_fp32`` (per plan; 1.5x at <= 100 mbit, judged on the plans whose two rows
trained the same placements), ``auto_vs_best`` (auto within 5 % of the best rayemb row of its precision),
``prediction_pass`` (every rayemb row's predicted step within 20 % of its measured one; uncalibrated
predictions never pass), ``auc_bf16_vs_fp32`` (|diff| <= 0.002 on every plan), ``auc_auto_vs_torchrec``
and ``auto_chose_fastest_runs`` ("k of n" auto runs that trained the fastest row's plan) reported. A verdict
FAILs when a row it rests on is missing, had a failed run, has fewer than 5 runs, or (rayemb rows) fewer runs
with a prediction than that; the ratio is still reported, with whether it alone meets the target.

A rayemb job on criteo-1tb-scaled costs ~100-120 s whatever its steps (calibration and plan probe ~40 s,
its 2.7 GiB checkpoint ~30 s), a torchrec run ~30-40 s.

Usage (root: network namespaces)::

    python jobs/bench/multinode.py --out bench-results/multinode.json
    python jobs/bench/multinode.py --workload criteo-1tb-scaled --rows 2000000 --bandwidth-mbit 100 1000 \\
        --precisions fp32,bf16 --out bench-results/multinode_criteo_scaled.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path[:0] = [_HERE, _REPO]

from _report import (auto_plan_check, auto_plan_line, link_measured, prediction_problem, report,  # noqa: E402
                     row_problem, spread, uncalibrated)
from host_cpu import CLASSES, HostCpu  # noqa: E402
from throughput import (  # noqa: E402
    AUTO,
    CONFIG,
    PEER_SCRIPT,
    _hermetic_env,
    _tail,
    ensure_data,
    infrequent_tables_of,
    peer_fields,
    reuse_auto_outputs,
    run_rayemb,
    schema_tables,
)

SCHEMA_VERSION = 3
#: TorchRec's own training, as its docs teach it (peer_torchrec.py), across the nodes
TORCHREC = "torchrec"
VARIANTS = (AUTO, "no_hybrid", "hybrid", "hybrid_mp", "table_wise", "row_wise", "column_wise", "data_parallel",
            TORCHREC)
DEFAULT_VARIANTS = (AUTO, "no_hybrid", "hybrid", "table_wise", "row_wise", "column_wise", TORCHREC)
DEFAULT_BANDWIDTHS_MBIT = (100.0,)
#: ``train.comm_precision`` of a row (both directions); TorchRec's rows: its ``QCommsConfig`` codecs
PRECISIONS = ("fp32", "bf16")
DEFAULT_PRECISIONS = ("fp32",)
#: the rows built from the no_hybrid row's plan (run after it)
TWINS = ("hybrid", "hybrid_mp")
#: not run by default: every table with a hot set pinned hybrid (the ``hybrid`` row before 2026-11-24)
HYBRID_ALL = "hybrid_all"
POOLED = ("no_hybrid", "table_wise", "row_wise", "column_wise")
#: runs every row needs for a verdict to rest on it
MIN_RUNS_JUDGED = 5
SLOW_LINK_MBIT = 100
TARGET_PREDICTION = 0.20
TARGET_AUC_DIFF = 0.002
#: ratio targets: (at <= SLOW_LINK_MBIT, above it); None: reported there, not judged
TARGETS = {
    "auto_vs_best": (0.95, 0.95),              # auto within 5 % of the best rayemb row of its precision
    "hybrid_vs_pooled": (1.3, None),           # hybrid over the best pooled row, same precision
    "bf16_vs_fp32": (1.5, None),               # a plan's bf16 row over its fp32 row
    "auto_vs_torchrec": (2.0, None),           # the faster auto row over torchrec@fp32
    "auto_vs_torchrec_qcomm": (1.5, None),     # ... over torchrec@bf16 (TorchRec's own 16-bit codecs)
    "auto_vs_torchrec_best": (None, 1.2),      # ... over the faster torchrec row
}
VERDICTS = ("rows", "prediction", "auc_bf16_vs_fp32", *TARGETS)


def row_name(variant: str, precision: str) -> str:
    """``auto@bf16``: a plan (or ``torchrec``) at a wire precision."""
    return f"{variant}@{precision}"


def split_row(name: str) -> Tuple[str, str]:
    """``(variant, precision)`` of a row name (a bare variant is fp32)."""
    variant, _, precision = name.partition("@")
    return variant, precision or "fp32"


def row_names(variants: Sequence[str], precisions: Sequence[str]) -> List[str]:
    """Every variant at every precision, precisions inner (a twin row still follows no_hybrid's rows)."""
    return [row_name(v, p) for v in variants for p in precisions]


def target(key: str, bandwidth: float) -> Optional[float]:
    slow, fast = TARGETS[key]
    return slow if bandwidth <= SLOW_LINK_MBIT else fast


def _faster(sps: Mapping[str, float], names: Sequence[str]) -> Optional[str]:
    return max((n for n in names if n in sps), key=sps.get, default=None)


def acceptance(rows: Sequence[Mapping[str, Any]], variants: Optional[Sequence[str]] = None,
               bandwidths: Optional[Sequence[float]] = None, runs: Sequence[Mapping[str, Any]] = (),
               min_runs: int = MIN_RUNS_JUDGED) -> Dict[str, Any]:
    """The targets per bandwidth and overall, from the rows (:func:`median_row`) of every ``variants`` row name
    (``auto@bf16``; a bare name is fp32; default: the rows' own) at every bandwidth (default: the rows' own).

    A ratio is reported wherever its rows have a run; its verdict (``<key>_pass``) is judged where
    :data:`TARGETS` sets a target for that bandwidth and is False unless every row it rests on is there, ran
    without a failure, has ``min_runs`` runs and, for rayemb rows, predictions (``row_problems``);
    ``<key>_target_met`` says whether the ratio alone meets the target. Overall, a verdict judged at no
    bandwidth is None. ``runs`` (each run's ``variant`` row name, ``bandwidth_mbit``, ``plan``,
    ``samples_per_s``) give ``auto_chose_fastest_runs``."""
    names = list(variants) if variants is not None else list(dict.fromkeys(r["variant"] for r in rows))
    out: Dict[str, Any] = {"per_bandwidth": {}}
    ok_all: Dict[str, Optional[bool]] = {k: None for k in VERDICTS}
    bws = sorted(set(bandwidths) if bandwidths else {r["bandwidth_mbit"] for r in rows}, reverse=True)
    precisions = list(dict.fromkeys(split_row(n)[1] for n in names))
    rayemb = [n for n in names if split_row(n)[0] != TORCHREC]
    autos = [n for n in rayemb if split_row(n)[0] == AUTO]
    for bw in bws:
        mine = {r["variant"]: r for r in rows if r["bandwidth_mbit"] == bw}
        problems = {n: row_problem(mine.get(n), min_runs, needs_prediction=n in rayemb) for n in names}
        ok = {n: p is None for n, p in problems.items()}
        sps = {n: mine[n]["samples_per_s"] for n in names if n in mine and mine[n].get("samples_per_s")}
        # an uncalibrated prediction (built-in constants) fails the prediction verdict only: the row's throughput
        # is measured like any other's
        predicting = {n: prediction_problem(mine.get(n), min_runs) for n in rayemb}
        e: Dict[str, Any] = {"row_problems": {n: p for n, p in problems.items() if p},
                             "prediction_problems": {n: p for n, p in predicting.items() if p and not problems[n]}}
        verdicts: Dict[str, bool] = {"rows": all(ok.values()) and bool(names)}

        def judge(key: str, value: Optional[float], rests_on: Sequence[str], goal: Optional[float]) -> None:
            met = value is not None and goal is not None and value >= goal
            if goal is not None:
                e[f"{key}_target"], e[f"{key}_target_met"] = goal, met
                verdicts[key] = bool(met and rests_on and all(ok.get(n, False) for n in rests_on))

        # per precision: hybrid vs the best pooled row, auto vs the best rayemb row
        for key in ("hybrid_vs_pooled", "auto_vs_best"):
            e[key], e["best_pooled" if key == "hybrid_vs_pooled" else "best_row"] = {}, {}
        hyb_ok, best_ok = [], []
        for p in precisions:
            pooled = [row_name(v, p) for v in POOLED if row_name(v, p) in names]
            best_pooled = _faster(sps, pooled)
            hyb = row_name("hybrid", p)
            if hyb in sps and best_pooled:
                e["hybrid_vs_pooled"][p] = sps[hyb] / sps[best_pooled]
                e["best_pooled"][p] = best_pooled
            hyb_ok.append((e["hybrid_vs_pooled"].get(p), [hyb, *pooled] if pooled else []))
            mine_p = [n for n in rayemb if split_row(n)[1] == p]
            best = _faster(sps, mine_p)
            a = row_name(AUTO, p)
            if a in sps and best:
                e["auto_vs_best"][p], e["best_row"][p] = sps[a] / sps[best], best
            best_ok.append((e["auto_vs_best"].get(p), mine_p if a in mine_p else []))
        for key, parts in (("hybrid_vs_pooled", hyb_ok), ("auto_vs_best", best_ok)):
            goal = target(key, bw)
            worst = min((v for v, _ in parts if v is not None), default=None)
            complete = all(v is not None and names_ for v, names_ in parts)
            judge(key, worst if complete else None, [n for _, ns in parts for n in ns], goal)

        # a plan's bf16 row over its fp32 row, judged on the plans both rows trained alike
        e["bf16_vs_fp32"], e["bf16_vs_fp32_same_plan"] = {}, []
        pairs = [(split_row(n)[0], n, row_name(split_row(n)[0], "bf16")) for n in rayemb if split_row(n)[1] == "fp32"
                 and row_name(split_row(n)[0], "bf16") in names]
        for v, lo, hi in pairs:
            if lo in sps and hi in sps:
                e["bf16_vs_fp32"][v] = sps[hi] / sps[lo]
                if (mine[lo].get("plans") or ["?"]) == (mine[hi].get("plans") or ["!"]):
                    e["bf16_vs_fp32_same_plan"].append(v)
        same = [e["bf16_vs_fp32"][v] for v in e["bf16_vs_fp32_same_plan"]]
        judge("bf16_vs_fp32", min(same) if same else None, [n for _, lo, hi in pairs for n in (lo, hi)],
              target("bf16_vs_fp32", bw))

        # TorchRec's rows against the faster auto row
        auto = _faster(sps, autos)
        e["auto_row"] = auto
        for key, theirs in (("auto_vs_torchrec", [row_name(TORCHREC, "fp32")]),
                            ("auto_vs_torchrec_qcomm", [row_name(TORCHREC, "bf16")]),
                            ("auto_vs_torchrec_best", [row_name(TORCHREC, p) for p in PRECISIONS])):
            peer = _faster(sps, [n for n in theirs if n in names])
            e[key] = sps[auto] / sps[peer] if auto and peer else None
            if key == "auto_vs_torchrec_best":
                e["torchrec_best_row"] = peer
            judge(key, e[key], [*autos, *[n for n in theirs if n in names]] if autos and peer else [],
                  target(key, bw))

        # validation AUC after as many steps on every row
        auc = {n: mine[n].get("valid_auc") for n in names if n in mine}
        e["auc"] = auc
        e["auc_bf16_vs_fp32"] = {v: auc[hi] - auc[lo] for v, lo, hi in pairs
                                 if auc.get(lo) is not None and auc.get(hi) is not None}
        e["auc_auto_vs_torchrec"] = {
            p: auc[row_name(AUTO, p)] - auc[row_name(TORCHREC, p)] for p in precisions
            if auc.get(row_name(AUTO, p)) is not None and auc.get(row_name(TORCHREC, p)) is not None}
        diffs = e["auc_bf16_vs_fp32"]
        e["auc_bf16_vs_fp32_target_met"] = bool(pairs) and len(diffs) == len(pairs) and all(
            abs(d) <= TARGET_AUC_DIFF for d in diffs.values())
        verdicts["auc_bf16_vs_fp32"] = e["auc_bf16_vs_fp32_target_met"] and all(
            ok[n] for _, lo, hi in pairs for n in (lo, hi))

        # the step-time model's prediction on every rayemb row
        errors = {n: abs(mine[n]["predicted_over_measured"] - 1.0) for n in rayemb
                  if n in mine and mine[n].get("predicted_over_measured")}
        if errors:
            e["worst_prediction_error"] = max(errors.values())
            e["worst_prediction_row"] = max(errors, key=errors.get)
        e["uncalibrated_rows"] = [n for n in rayemb if (mine.get(n) or {}).get("uncalibrated_runs")]
        e["link_measured_rows"] = [n for n in rayemb if (mine.get(n) or {}).get("link_measured_runs")]
        verdicts["prediction"] = bool(rayemb and not any(predicting.values()) and len(errors) == len(rayemb)
                                      and max(errors.values()) <= TARGET_PREDICTION)
        e["auto_chose_fastest_runs"] = chose_fastest(
            [r for r in runs if r.get("bandwidth_mbit") == bw], {n: mine[n] for n in rayemb if n in mine})
        for k, v in verdicts.items():
            e[f"{k}_pass"] = v
            ok_all[k] = v if ok_all[k] is None else ok_all[k] and v
        out["per_bandwidth"][f"{bw:g}"] = e
    if not bws:
        ok_all = {k: False for k in VERDICTS}
    out.update({f"{k}_pass": v for k, v in ok_all.items()})
    return out


def chose_fastest(runs: Sequence[Mapping[str, Any]], rows: Mapping[str, Mapping[str, Any]]) -> str:
    """``"k of n"``: of the n auto runs (any precision), the k whose plan is the plan of the fastest rayemb row
    of their precision (the plan most of its runs trained)."""
    from _report import _mode, _plan_key

    fastest = {}
    for p in {split_row(n)[1] for n in rows}:
        mine = {n: r for n, r in rows.items() if split_row(n)[1] == p and r.get("samples_per_s")}
        best = _faster({n: r["samples_per_s"] for n, r in mine.items()}, list(mine))
        plans = [_plan_key(r["plan"]) for r in runs if r.get("variant") == best and r.get("plan")]
        if plans:
            fastest[p] = _mode(plans)
    auto_runs = [r for r in runs if split_row(r.get("variant", ""))[0] == AUTO and r.get("samples_per_s")
                 and r.get("plan")]
    k = sum(1 for r in auto_runs if fastest.get(split_row(r["variant"])[1]) == _plan_key(r["plan"]))
    return f"{k} of {len(auto_runs)}"


def plan_choice(runs: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Per bandwidth and precision, :func:`_report.auto_plan_check` over the rayemb rows' runs: did auto train
    the fastest row's plan, and auto's own runs against forced runs of that plan (reported beside the
    verdicts)."""
    out: Dict[str, Any] = {}
    for bw in sorted({r["bandwidth_mbit"] for r in runs}, reverse=True):
        mine = [r for r in runs if r["bandwidth_mbit"] == bw and split_row(r["variant"])[0] != TORCHREC]
        out[f"{bw:g}"] = {p: auto_plan_check(dict(r, variant=split_row(r["variant"])[0]) for r in mine
                                             if split_row(r["variant"])[1] == p)
                          for p in dict.fromkeys(split_row(r["variant"])[1] for r in mine)}
    return out


def hybrid_tables(name: str, pooled_plan: Mapping[str, str], hot: Sequence[str],
                  infrequent: Sequence[str]) -> List[str]:
    """The tables a twin row makes hybrid: ``hybrid`` every table with infrequent rows, ``hybrid_mp`` only the
    pooled plan's model-parallel tables with a hot set."""
    if name == "hybrid":
        return [t for t in infrequent if t in pooled_plan]
    return [t for t in hot if pooled_plan.get(t, "data_parallel") != "data_parallel"]


def hybrid_pins(pooled_plan: Mapping[str, str], hybrid: Sequence[str]) -> List[str]:
    """Overrides turning a pooled plan into a hybrid one: the ``hybrid`` tables hybrid, every other table pinned
    where the pooled plan put it."""
    out = []
    for t, p in sorted(pooled_plan.items()):
        if t in hybrid:
            out.append(f"planner.tables.{t}.hybrid=true")
        else:
            out.append(f"planner.tables.{t}.sharding={p}")
    return out


def precision_overrides(precision: str) -> List[str]:
    """``train.comm_precision`` of a rayemb row: both directions at ``precision``."""
    return [f"train.comm_precision.forward={precision}", f"train.comm_precision.backward={precision}"]


def run_variant(name: str, args: argparse.Namespace, tmp: str, tables: Sequence[str], hot: Optional[List[str]],
                stats_path: Optional[str], pooled_plan: Optional[Mapping[str, str]], cluster: Any,
                extra: Sequence[str], bw: float, repeat: int = 0,
                infrequent: Sequence[str] = ()) -> Optional[Dict[str, Any]]:
    """One run of row ``name`` (``variant@precision``) on ``cluster``; None when the row cannot be built (said
    why: the verdicts then FAIL on it). ``pooled_plan``: the no_hybrid row's plan at the row's precision."""
    variant, precision = split_row(name)
    tag = f"-{precision}-{bw:g}mbit"
    if variant == TORCHREC:
        return run_torchrec(args, tmp, cluster, repeat, tag, precision=precision, bandwidth_mbit=bw)
    extra = [*extra, *precision_overrides(precision)]
    if variant in (*TWINS, HYBRID_ALL) and not hot:
        print(f"multinode: skipping {name} (no table with a hot set and a cold remainder)")
        return None
    if variant in TWINS:
        if not pooled_plan:
            print(f"multinode: skipping {name} (it needs the no_hybrid row's plan: run no_hybrid first)")
            return None
        pins = hybrid_pins(pooled_plan, hybrid_tables(variant, pooled_plan, hot, infrequent))
        if not any(p.endswith(".hybrid=true") for p in pins):
            print(f"multinode: skipping {name} at {bw:g} mbit (no table to make hybrid)")
            return None
        # the auto variant's run with the row's pins (the variant name only names the run's folder)
        run = run_rayemb(AUTO, args, tmp, repeat, tables, hot, stats_path, wrap=cluster.exec_argv,
                         extra_overrides=[*extra, *pins], tag=f"-{variant}{tag}")
        run.update(variant=name, kind="forced", overrides=pins)
        return run
    return run_rayemb("hybrid" if variant == HYBRID_ALL else variant, args, tmp, repeat, tables, hot, stats_path,
                      wrap=cluster.exec_argv, extra_overrides=extra, tag=tag)


def peer_model_args(args: argparse.Namespace) -> List[str]:
    """The job config's model and learning rate (with ``--set``) for TorchRec's run of the same model."""
    from rayemb.config import load_config

    cfg = load_config(args.config, list(args.set))
    m = cfg.model
    if cfg.train.embedding_lr != cfg.train.dense_lr:
        print(f"multinode: TorchRec's rows train at one learning rate, train.dense_lr {cfg.train.dense_lr:g} "
              f"(the job's embedding_lr is {cfg.train.embedding_lr:g})")
    return ["--embedding-dim", str(m.embedding_dim), "--bottom-mlp", ",".join(map(str, m.bottom_mlp)),
            "--top-mlp", ",".join(map(str, m.top_mlp)), "--lr", f"{cfg.train.dense_lr:g}"]


def torchrec_argvs(args: argparse.Namespace, cluster: Any, out: str, port: int, precision: str = "fp32",
                   bandwidth_mbit: Optional[float] = None) -> List[List[str]]:
    """One ``torchrun`` per node, inside its namespace, joined by a static rendezvous on the head node's
    address: the peer's gloo collectives cross the shaped links as the rayemb jobs' do (one rank per node,
    one thread per rank, as the rayemb workers get one CPU each). The planner is told the links' speed, as a
    user who knows it would; ``precision`` goes to TorchRec's own codecs (``--qcomm``)."""
    from cluster.emulate import IFNAME

    model = getattr(args, "peer_model_args", None) or []
    argvs = []
    for k in range(args.nodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={args.nodes}", f"--node-rank={k}",
               "--nproc-per-node=1", f"--master-addr={cluster.head_ip}", f"--master-port={port}", PEER_SCRIPT,
               "--data", args.data, "--batch-size", str(args.batch_size), "--steps", str(args.steps),
               "--warmup", str(args.window), "--window", str(args.window), "--threads", "1", "--out", out,
               "--qcomm", precision, *model]
        if bandwidth_mbit:
            cmd += ["--inter-host-mbit", f"{bandwidth_mbit:g}"]
        argvs.append(cluster.node_exec_argv(k, ["env", f"GLOO_SOCKET_IFNAME={IFNAME}", *cmd]))
    return argvs


_PORTS = iter(range(29400, 29400 + 4000))


def run_torchrec(args: argparse.Namespace, tmp: str, cluster: Any, repeat: int, tag: str, precision: str = "fp32",
                 bandwidth_mbit: Optional[float] = None, timeout_s: float = 900.0) -> Dict[str, Any]:
    """One run of TorchRec's own training across the cluster's nodes (:func:`torchrec_argvs`)."""
    import subprocess

    name = row_name(TORCHREC, precision)
    out = os.path.join(tmp, f"{TORCHREC}-{repeat}{tag}.json")
    logs = [open(os.path.join(tmp, f"{TORCHREC}-{repeat}{tag}-n{k}.log"), "w+") for k in range(args.nodes)]
    t0 = time.monotonic()
    # a fresh port per run: the last run's listening socket may linger
    argvs = torchrec_argvs(args, cluster, out, next(_PORTS), precision, bandwidth_mbit)
    procs = [subprocess.Popen(argv, cwd=_REPO, env=_hermetic_env(tmp), stdout=log, stderr=subprocess.STDOUT)
             for argv, log in zip(argvs, logs)]
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0))))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    run: Dict[str, Any] = {"variant": name, "kind": "peer", "repeat": repeat, "wall_s": time.monotonic() - t0,
                           "returncode": max(codes, key=abs), "samples_per_s": None}
    text = ""
    for log in logs:
        log.seek(0)
        text += log.read()
        log.close()
    if any(codes) or not os.path.exists(out):
        run["error"] = _tail(text)
        return run
    with open(out) as f:
        res = json.load(f)
    run.update(peer_fields(res))
    run.update(valid_auc=res.get("valid_auc"), valid_rows=res.get("valid_rows"), qcomm=res.get("qcomm"),
               qcomm_effective=res.get("qcomm_effective"), train_loop=res.get("train_loop"))
    return run


def split_tables(run: Mapping[str, Any]) -> Optional[List[str]]:
    """The tables with infrequent rows in an auto run's ``split.json`` (None without one)."""
    path = os.path.join(run.get("job_dir") or "", "split.json")
    if not run.get("job_dir") or not os.path.exists(path):
        return None
    with open(path) as f:
        return infrequent_tables_of(json.load(f))


def drop_checkpoints(run: Mapping[str, Any]) -> None:
    """Deletes a finished rayemb run's checkpoints (a job's tables each time: 2.7 GiB on criteo-1tb-scaled, so
    a full benchmark's runs would fill the disk); its job folder (plan, split, stats) stays for later rows."""
    if run.get("job_dir"):
        shutil.rmtree(os.path.join(os.path.dirname(os.path.dirname(run["job_dir"])), "ray_results"),
                      ignore_errors=True)


def cpu_shares(host_cpu: Optional[Mapping[str, float]]) -> Dict[str, Optional[float]]:
    """% of one core during a run's timed windows: its ranks, every other process, idle; and the host's
    speed then (``canary_ms``: lower is faster; host_cpu.canary). None where unsampled."""
    if not host_cpu:
        return {"ranks_cpu": None, "others_cpu": None, "idle_cpu": None, "canary_ms": None}
    others = sum(host_cpu.get(k, 0.0) for k in CLASSES if k != "rank")
    return {"ranks_cpu": host_cpu.get("rank"), "others_cpu": round(others, 1), "idle_cpu": host_cpu.get("idle"),
            "canary_ms": host_cpu.get("canary_ms")}


def row_of(run: Mapping[str, Any], bandwidth: float) -> Dict[str, Any]:
    """One run's figures: throughput, measured step, the model's prediction and the probe's step for it."""
    meas = run.get("step_time_s")
    pred, probed = run.get("predicted_step_time_s"), run.get("probed_step_time_s")
    cal = run.get("calibration") or {}
    # built-in constants' figure: kept apart, never judged as the model's
    uncal, pred = (pred, None) if uncalibrated(run) else (None, pred)
    return {**cpu_shares(run.get("host_cpu")),
        "bandwidth_mbit": bandwidth, "variant": run["variant"], "samples_per_s": run.get("samples_per_s"),
        "step_ms": 1e3 * meas if meas else None, "predicted_ms": 1e3 * pred if pred else None,
        "probed_ms": 1e3 * probed if probed else None,
        "predicted_over_measured": pred / meas if pred and meas else None,
        "uncalibrated_over_measured": uncal / meas if uncal and meas else None,
        "probed_over_measured": probed / meas if probed and meas else None,
        "link_measured": link_measured(run),
        "bytes_per_step": run.get("bytes_per_step"), "plan_summary": run.get("plan_summary"),
        "plan": run.get("plan"), "valid_auc": run.get("valid_auc"),
        "calibrated_a2a_mb_s": 1e-6 / cal["all_to_all"]["seconds_per_byte"]
        if cal.get("all_to_all", {}).get("seconds_per_byte") else None,
        "error": run.get("error"),
    }


def median_row(rows: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """One table row from the runs (:func:`row_of`) of one variant at one bandwidth: medians with min-max of
    throughput and of the prediction's and probe's ratios to the measured step (each run calibrates and plans
    anew, so each has its own) and of the validation AUC, medians of the rest; ``runs`` that succeeded,
    ``failed`` the others,
    ``predicted_runs`` the succeeded runs with a prediction."""
    import statistics

    ok = [r for r in rows if r.get("samples_per_s") and not r.get("error")]
    out = dict(ok[0] if ok else rows[0])
    out["runs"], out["failed"] = len(ok), len(rows) - len(ok)
    out["samples_per_s_runs"] = [r.get("samples_per_s") for r in rows]
    out["plans"] = sorted({r["plan_summary"] for r in rows if r.get("plan_summary")})
    for key in ("samples_per_s", "predicted_over_measured", "probed_over_measured", "valid_auc"):
        s = spread(r.get(key) for r in ok)
        out[key], out[f"{key}_min"], out[f"{key}_max"] = s["median"], s["min"], s["max"]
        if key == "predicted_over_measured":
            out["predicted_runs"] = s["n"]  # the runs the prediction's verdict rests on
    out["uncalibrated_runs"] = sum(1 for r in ok if r.get("uncalibrated_over_measured") is not None)
    out["link_measured_runs"] = sum(1 for r in ok if r.get("link_measured"))
    for key in ("step_ms", "predicted_ms", "probed_ms", "bytes_per_step", "mb_per_step", "ranks_cpu",
                "others_cpu", "idle_cpu", "canary_ms"):
        vals = [r[key] for r in ok if r.get(key) is not None]
        out[key] = statistics.median(vals) if vals else None
    return out


def plot(rows: Sequence[Mapping[str, Any]], png: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # a chart never fails the benchmark
        print(f"multinode: no chart ({e})")
        return None
    bws = sorted({r["bandwidth_mbit"] for r in rows}, reverse=True)
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / max(len(variants), 1)
    for i, v in enumerate(variants):
        vals = [next((r["samples_per_s"] or 0 for r in rows if r["bandwidth_mbit"] == b and r["variant"] == v), 0)
                for b in bws]
        axes[0].bar([j + i * width for j in range(len(bws))], vals, width, label=v)
    axes[0].set_xticks([j + 0.4 - width / 2 for j in range(len(bws))], [f"{b:g} mbit" for b in bws])
    axes[0].set_ylabel("samples/s (median window)")
    axes[0].set_title("Throughput per link bandwidth", fontsize=10)
    axes[0].legend(fontsize=8)
    pts = [(r["step_ms"], r["predicted_ms"], r["variant"]) for r in rows if r.get("step_ms") and r.get("predicted_ms")]
    if pts:
        top = max(max(a, b) for a, b, _ in pts) * 1.1
        axes[1].plot([0, top], [0, top], color="#7f7f7f", linewidth=1)
        axes[1].fill_between([0, top], [0, 0.8 * top], [0, 1.2 * top], color="#dddddd", label="±20 %")
        for a, b, v in pts:
            axes[1].scatter(a, b, s=18)
            axes[1].annotate(v, (a, b), fontsize=6)
        axes[1].set_xscale("log")
        axes[1].set_yscale("log")
        axes[1].legend(fontsize=8)
    axes[1].set_xlabel("measured step time (ms)")
    axes[1].set_ylabel("predicted step time (ms)")
    axes[1].set_title("Calibrated step-time model vs measured", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


COLUMNS = [("mbit", ">6", "{:g}"), ("row", "<17", "{}"), ("samples/s", ">10", "{:,.0f}"), ("min", ">8", "{:,.0f}"),
           ("max", ">8", "{:,.0f}"), ("runs", ">4", "{}"), ("step ms", ">8", "{:.1f}"), ("pred ms", ">8", "{:.1f}"),
           ("pred/meas", ">9", "{:.2f}"), ("min", ">5", "{:.2f}"), ("max", ">5", "{:.2f}"),
           ("probe/meas", ">10", "{:.2f}"), ("MB/step", ">8", "{:.2f}"),
           ("ranks %", ">7", "{:.0f}"), ("others %", ">8", "{:.0f}"), ("idle %", ">6", "{:.0f}"),
           ("canary ms", ">9", "{:.2f}"), ("AUC", ">6", "{:.4f}"), ("plan", "<34", "{}")]
KEYS = ["bandwidth_mbit", "variant", "samples_per_s", "samples_per_s_min", "samples_per_s_max", "runs", "step_ms",
        "predicted_ms", "predicted_over_measured", "predicted_over_measured_min", "predicted_over_measured_max",
        "probed_over_measured", "mb_per_step", "ranks_cpu", "others_cpu", "idle_cpu", "canary_ms", "valid_auc",
        "plan_summary"]


#: what each verdict asks, printed beside it
VERDICT_TEXT = {
    "rows": f"every row complete ({MIN_RUNS_JUDGED}+ runs, none failed, rayemb rows' predictions present)",
    "prediction": f"the model's prediction within {TARGET_PREDICTION:.0%} of the measured step on every rayemb row",
    "auc_bf16_vs_fp32": f"|valid AUC bf16 - fp32| <= {TARGET_AUC_DIFF} on every plan",
    "auto_vs_best": "auto within 5% of the best rayemb row of its precision",
    "hybrid_vs_pooled": "hybrid >= 1.3x the best pooled row, same precision (<= 100 mbit)",
    "bf16_vs_fp32": "bf16 >= 1.5x fp32, same plan (<= 100 mbit)",
    "auto_vs_torchrec": "auto >= 2.0x torchrec@fp32 (<= 100 mbit)",
    "auto_vs_torchrec_qcomm": "auto >= 1.5x torchrec@bf16, TorchRec's own 16-bit codecs (<= 100 mbit)",
    "auto_vs_torchrec_best": "auto >= 1.2x the faster torchrec row (> 100 mbit)",
}


def _fmt(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} {_fmt(v)}" for k, v in value.items()) + "}" if value else "-"
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def footer(acc: Mapping[str, Any], choice: Mapping[str, Mapping[str, Any]]) -> str:
    """The printed verdicts, then per bandwidth the figures behind them and what is reported beside them."""
    def verdict(key: str) -> str:
        ok = acc[f"{key}_pass"]
        return "not judged (no bandwidth it applies at)" if ok is None else "PASS" if ok else "FAIL"

    text = "\n".join(f"{VERDICT_TEXT[k]}: {verdict(k)}" for k in VERDICTS)
    for bw, e in acc["per_bandwidth"].items():
        text += f"\nat {bw} mbit:"
        for key in TARGETS:
            if f"{key}_target" in e:
                met = "met" if e[f"{key}_target_met"] else "missed"
                text += (f" {key} {_fmt(e.get(key))} (target {e[f'{key}_target']:g}x {met}; "
                         f"{'PASS' if e[f'{key}_pass'] else 'FAIL'});")
            elif e.get(key) is not None and e.get(key) != {}:
                text += f" {key} {_fmt(e.get(key))} (reported);"
        text += (f" auc_bf16_vs_fp32 {_fmt(e.get('auc_bf16_vs_fp32'))} "
                 f"({'PASS' if e.get('auc_bf16_vs_fp32_pass') else 'FAIL'});"
                 f" auc_auto_vs_torchrec {_fmt(e.get('auc_auto_vs_torchrec'))} (reported);"
                 f" auto chose the fastest row's plan in {e.get('auto_chose_fastest_runs')} runs;")
        if e.get("row_problems"):
            text += " rows that fail the verdicts: " + "; ".join(f"{v}: {p}" for v, p in e["row_problems"].items())
            text += ";"
        if e.get("link_measured_rows"):
            text += (" predictions with the link measured and the compute built in (judged): "
                     + ", ".join(e["link_measured_rows"]) + ";")
        if e.get("prediction_problems"):
            text += " rows that fail the prediction verdict only: " + "; ".join(
                f"{v}: {p}" for v, p in e["prediction_problems"].items()) + ";"
        for p, check in (choice.get(bw) or {}).items():
            text += f" [{p}] " + auto_plan_line(check)
    return text


def round_plan(rows: Sequence[str], repeats: int) -> List[List[str]]:
    """The rows run in each round: every row once a round, in one order, ``repeats`` rounds, so a row's runs
    interleave with the others' (a slow phase of the shared host falls on all of them)."""
    return [list(rows) for _ in range(repeats)]


#: the synthetic workloads: ``{name: (job config, default data folder or None: one per --rows)}``
WORKLOADS = {
    "synth-small": (CONFIG, os.path.join(_REPO, "data", "synth_small")),
    "criteo-1tb-scaled": (os.path.join(_REPO, "jobs", "configs", "criteo_1tb_scaled.yaml"), None),
    "criteo-1tb-tiny": (os.path.join(_REPO, "jobs", "configs", "criteo_1tb_scaled.yaml"), None),
}
PROFILE = {"criteo-1tb-scaled": "criteo-1tb-scaled", "criteo-1tb-tiny": "criteo-1tb-tiny"}


def workload_data(workload: str, rows: int, cache: str) -> str:
    """The workload's data folder under ``cache``: generated once (``rayemb gen-data --profile``) per row count,
    reused after."""
    import subprocess

    path = os.path.join(cache, f"{workload.replace('-', '_')}_{rows}")
    done = os.path.join(path, "schema.yaml")
    if not os.path.exists(done):
        print(f"multinode: generating {path} ({rows:,} rows, profile {PROFILE[workload]}) ...", flush=True)
        subprocess.run([sys.executable, "-m", "rayemb.cli", "gen-data", "--profile", PROFILE[workload],
                        "--rows", str(rows), "--out", path], cwd=_REPO, check=True)
    return path


def train_rows(data: str) -> int:
    import pyarrow.parquet as pq

    import glob

    return sum(pq.ParquetFile(f).metadata.num_rows for f in glob.glob(os.path.join(data, "train", "*.parquet")))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="synth-small",
                    help="the data and job config every row trains (criteo-1tb-scaled: jobs/configs/"
                         "criteo_1tb_scaled.yaml on data generated by gen-data --profile, --rows rows; "
                         "criteo-1tb-tiny: its CI-size twin, the same config on tables divided by 3000)")
    ap.add_argument("--rows", type=int, default=None,
                    help="rows of generated data (train + valid; default 400,000), in data/<workload>_<rows>, "
                         "generated once")
    ap.add_argument("--data-cache", default=os.path.join(_REPO, "data"),
                    help="where generated data is kept, one folder per workload and --rows")
    ap.add_argument("--bandwidth-mbit", type=float, nargs="+", default=list(DEFAULT_BANDWIDTHS_MBIT))
    ap.add_argument("--latency-ms", type=float, default=None, help="added one-way latency per link (netem)")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--cpus-per-node", type=int, default=2, help="Ray CPUs per node (one worker of 1 CPU each, "
                                                                  "the rest for Ray Data)")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"rows, comma-separated, from {', '.join(VARIANTS + (HYBRID_ALL,))} (auto always runs)")
    ap.add_argument("--precisions", default=",".join(DEFAULT_PRECISIONS),
                    help=f"wire precisions every row runs at, comma-separated, from {', '.join(PRECISIONS)} "
                         "(rayemb: train.comm_precision; torchrec: its QCommsConfig codecs); rows are named "
                         "variant@precision")
    ap.add_argument("--skip-rows", default="", metavar="ROW[,ROW]",
                    help="rows of the variants x precisions product not to run, e.g. auto@bf16 (the first "
                         "precision's auto row always runs); the verdicts resting on a skipped row say so")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per run after one warm-up window")
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=None,
                    help="rows per rank per step (default: 512; criteo-1tb-scaled: the config's data.batch_size)")
    ap.add_argument("--data", default=None, help="dataset folder (default: the workload's)")
    ap.add_argument("--config", default=None, help="job config (default: the workload's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every rayemb row (and the model TorchRec's rows build)")
    ap.add_argument("--out", default=os.path.join(_REPO, "bench-results", "multinode.json"))
    ap.add_argument("--check", action="store_true", help="exit 1 when a verdict fails")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--repeats", type=int, default=MIN_RUNS_JUDGED,
                    help=f"runs of every row per bandwidth, in interleaved rounds (fewer than "
                         f"{MIN_RUNS_JUDGED}: the verdicts FAIL; the figures are reported)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    config, data = WORKLOADS[args.workload]
    args.config = os.path.abspath(args.config or config)
    if args.rows is not None and (data is not None or args.data):
        ap.error(f"--rows sizes generated data: --workload {args.workload} has its data folder "
                 f"({args.data or data}); drop --rows")
    args.world = args.nodes
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if AUTO in variants:
        variants.remove(AUTO)
    variants.insert(0, AUTO)  # its split.json names the hybrid tables, its stats.json serves the rest
    for twin in reversed(TWINS):  # the hybrid rows are no_hybrid's plan made hybrid: run after it
        if twin in variants and "no_hybrid" in variants:
            variants.remove(twin)
            variants.insert(variants.index("no_hybrid") + 1, twin)
    unknown = set(variants) - set(VARIANTS) - {HYBRID_ALL}
    if unknown:
        ap.error(f"unknown --variants {sorted(unknown)}; known: {', '.join(VARIANTS + (HYBRID_ALL,))}")
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not precisions or set(precisions) - set(PRECISIONS):
        ap.error(f"--precisions {args.precisions!r}: use a comma-separated list of {', '.join(PRECISIONS)}")
    names = row_names(variants, precisions)
    skip = [r.strip() for r in args.skip_rows.split(",") if r.strip()]
    if set(skip) - set(names) or names[0] in skip:
        ap.error(f"--skip-rows {args.skip_rows!r}: name rows of {', '.join(names[1:])} "
                 f"({names[0]} always runs)")
    names = [n for n in names if n not in skip]

    from rayemb.config import load_config
    from rayemb.errors import ConfigError

    try:
        cfg = load_config(args.config, list(args.set))
    except ConfigError as e:
        ap.error(str(e))
    if args.batch_size is None:
        args.batch_size = cfg.data.batch_size if args.workload != "synth-small" else 512
    if data is None and not args.data:
        args.data = workload_data(args.workload, args.rows or 400_000, os.path.abspath(args.data_cache))
    else:
        args.data = os.path.abspath(args.data or data)
        ensure_data(args.data, 400_000)
    from rayemb.batch_shape import BatchShape

    global_batch = BatchShape(args.batch_size, args.world).global_size
    steps_there = train_rows(args.data) // global_batch
    if steps_there < args.steps + args.window:
        ap.error(f"{args.data} holds {steps_there} steps of {global_batch} rows, fewer than --steps + --window "
                 f"({args.steps + args.window}): every row's AUC is taken after that many steps of one epoch; "
                 f"raise --rows to at least {int((args.steps + args.window) * global_batch / 0.9) + 1:,} or lower "
                 "--steps / --batch-size")
    args.peer_model_args = peer_model_args(args)

    from cluster.emulate import EmulatedCluster

    tables = schema_tables(args.data)
    # a SIGTERM (a timeout's, a scheduler's) ends the run through its finally blocks: the emulated cluster, its
    # network namespaces and processes go down with it instead of staying up until the next run replaces them
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    tmp = tempfile.mkdtemp(prefix="rbm-")
    runs: List[Dict[str, Any]] = []
    rows: List[Dict[str, Any]] = []
    hot: Optional[List[str]] = None
    stats_path: Optional[str] = None
    infrequent_by_bw: Dict[str, Optional[List[str]]] = {}
    t0 = time.monotonic()
    extra = ["scaling.placement_strategy=SPREAD", "scaling.cpus_per_worker=1", *args.set]
    host_cpu = HostCpu()  # where the cores went during each run's timed windows (host_cpu.py)
    host_cpu.start()
    rounds = round_plan(names, args.repeats)
    try:
        for bw in args.bandwidth_mbit:
            cluster = EmulatedCluster(name="rayemb-bench", nodes=args.nodes, cpus_per_node=args.cpus_per_node,
                                      bandwidth_mbit=bw, latency_ms=args.latency_ms,
                                      state_dir=os.path.join(tmp, f"cluster-{bw:g}"))
            print(f"multinode: {args.nodes} nodes at {bw:g} mbit ...", flush=True)
            cluster.up(replace=True)
            try:
                pooled_plan: Dict[str, Dict[str, str]] = {}  # per precision: the first no_hybrid run's plan
                infrequent: Optional[List[str]] = None  # from this bandwidth's first auto split
                per_row: Dict[str, List[Dict[str, Any]]] = {}
                for rep, round_names in enumerate(rounds):
                    for name in round_names:
                        variant, precision = split_row(name)
                        run = run_variant(name, args, tmp, tables, hot, stats_path, pooled_plan.get(precision),
                                          cluster, extra, bw, repeat=rep, infrequent=infrequent or ())
                        if run is None:
                            continue
                        run["variant"], run["bandwidth_mbit"], run["repeat"] = name, bw, rep
                        run["precision"] = precision
                        if run.get("steady_span_s"):
                            run["host_cpu"] = host_cpu.summary(*run["steady_span_s"])
                        if variant == AUTO:
                            hot, stats_path = reuse_auto_outputs(run, tmp, hot, stats_path)
                            if infrequent is None:
                                infrequent = split_tables(run)
                                infrequent_by_bw[f"{bw:g}"] = infrequent
                        if variant == "no_hybrid" and precision not in pooled_plan and run.get("plan"):
                            pooled_plan[precision] = run["plan"]  # the hybrid twin of it, every round
                        if not args.keep:
                            drop_checkpoints(run)
                        runs.append(run)
                        row = row_of(run, bw)
                        row["mb_per_step"] = row["bytes_per_step"] / 1e6 if row.get("bytes_per_step") else None
                        per_row.setdefault(name, []).append(row)
                        sps = run.get("samples_per_s")
                        print(f"multinode:   {bw:g} mbit {name} (round {rep + 1}/{len(rounds)}): "
                              + (f"{sps:,.0f} samples/s" if sps else "FAILED")
                              + (f", step {row['step_ms']:.1f} ms vs {row['predicted_ms']:.1f} ms predicted"
                                 if row.get("step_ms") and row.get("predicted_ms") else "")
                              + (f", {row['probed_ms']:.1f} ms probed" if row.get("probed_ms") else "")
                              + (f", valid AUC {run['valid_auc']:.4f}" if run.get("valid_auc") else "")
                              + (f", plan {run['plan_summary']}" if run.get("plan_summary") else "")
                              + (", cpu % ranks {ranks_cpu:.0f} others {others_cpu:.0f} idle {idle_cpu:.0f},"
                                 " canary {canary_ms} ms".format(**cpu_shares(run["host_cpu"]))
                                 if run.get("host_cpu") else "")
                              + f" ({run['wall_s']:.0f}s)", flush=True)
                        if run.get("error"):
                            print("multinode:   error:\n" + run["error"], flush=True)
                rows.extend(median_row(v) for v in per_row.values())
            finally:
                cluster.down()
    finally:
        host_cpu.stop()
        if args.keep:
            print(f"multinode: outputs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    acc = acceptance(rows, names, args.bandwidth_mbit, runs=runs)
    choice = plan_choice(runs)
    png = plot(rows, os.path.splitext(args.out)[0] + ".png")
    profile = os.path.join(args.data, "profile.json")
    doc = {"schema_version": SCHEMA_VERSION, "benchmark": "multinode",
           "config": {"workload": args.workload, "data": args.data, "job_config": os.path.relpath(args.config, _REPO),
                      "overrides": args.set, "train_rows": train_rows(args.data),
                      "profile": json.load(open(profile)) if os.path.exists(profile) else None,
                      "bandwidths_mbit": args.bandwidth_mbit, "latency_ms": args.latency_ms, "nodes": args.nodes,
                      "cpus_per_node": args.cpus_per_node, "steps": args.steps, "window": args.window,
                      "steps_before_auc": args.steps + args.window,
                      "batch_size": args.batch_size, "global_batch": global_batch, "repeats": args.repeats,
                      "variants": variants, "precisions": precisions, "rows": names, "hot_tables": hot,
                      "torchrec_model": args.peer_model_args,
                      "infrequent_tables": infrequent_by_bw, "wall_s": time.monotonic() - t0,
                      "cpu_count": os.cpu_count()},
           "results": rows, "acceptance": acc, "plan_choice": choice, "chart": png, "runs": runs}
    report(args.out, doc, rows, COLUMNS, KEYS, footer=footer(acc, choice))
    if png:
        print(f"wrote {png}")
    if args.check and any(acc[f"{k}_pass"] is False for k in VERDICTS):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
