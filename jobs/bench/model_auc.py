"""Validation AUC of models side by side on the same data and steps: the shipped models, and multi-task.

    python jobs/bench/model_auc.py --suite models --out bench-results/model_auc_<date>_<commit>.json
    python jobs/bench/model_auc.py --suite multitask --out bench-results/multitask_auc_<date>_<commit>.json

``--suite models``: the default synthetic job (jobs/configs/synth_small.yaml) trained with ``model.name: dlrm``,
``model.name: dcn_v2`` and the DeepFM of examples/deepfm.py (``model.factory``), same data, config and steps.
Verdict: DCN-v2's AUC >= DLRM's - 0.005 on every seed (not on the median: one seed behind is a FAIL).

``--suite multitask``: data with two labels (``gen-data --second-label``: ``like`` learnt from other tables
than ``label``), trained as one two-task DLRM (``label: [label, like]``), and as two single-task DLRMs on
the same files (a schema naming only ``label``, then only ``like``). Verdicts: each task's AUC >= 0.85 in
the two-task model, and within 0.005 of the single-task model of that label, on every seed; the labels'
correlation <= 0.5.

``--suite precision``: the default synthetic job with ``train.precision: fp32``, ``bf16`` (the dense layers
under autocast) and ``fp32`` with ``model.embedding_dtype: fp16`` (fp16 tables). Verdicts: bf16's AUC and the
fp16 tables' AUC each within 0.003 of fp32's on every seed.

A seed is a data seed and a training seed: without ``--data``, seed ``s`` trains on synthetic data generated
with ``seed=s`` (``--rows`` rows; seed 0 in ``data/synth_small``, as ``make run`` makes it, seed ``s`` in
``data/synth_small_seed<s>``; multitask in ``data/synth_two_labels...``), generated when absent, with
``train.seed=s``; with ``--data`` every seed trains on those files and only the training seed varies.

Every verdict is on the AUC of the last epoch trained (``valid_auc``): the best epoch's (``best_valid_auc``,
reported beside it) is picked on the same validation rows it is scored on, so it reads high. Runs go seed
by seed, the sides' order rotating per seed, on one local Ray cluster; every result is written after each run
(a later failure keeps the runs done). A verdict with a missing or failed run FAILs. ``--sides`` runs a
subset (a verdict whose side did not run FAILs). Quick check: ``--rows 40000 --seeds 0 --set train.epochs=1``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, write_result  # noqa: E402
from sequence_auc import run_order  # noqa: E402  (seed by seed, the sides rotated by one per seed)

COLUMNS = [("seed", ">4", "{}"), ("side", ">12", "{}"), ("task", ">6", "{}"), ("last AUC", ">9", "{:.4f}"),
           ("best AUC", ">9", "{:.4f}"), ("epochs", ">6", "{}"), ("wall s", ">7", "{:.0f}")]
KEYS = ["seed", "side", "task", "valid_auc", "best_valid_auc", "epochs", "wall_time_s"]
#: side -> (overrides, which dataset variant) per suite
SUITES: Dict[str, Dict[str, Tuple[List[str], str]]] = {
    "models": {"dlrm": (["model.name=dlrm"], "data"),
               "dcn_v2": (["model.name=dcn_v2"], "data"),
               "deepfm": (["model.factory=examples.deepfm:deepfm"], "data")},
    "multitask": {"two_tasks": ([], "data"), "label_only": ([], "label"), "like_only": ([], "like")},
    "precision": {"fp32": (["train.precision=fp32"], "data"), "bf16": (["train.precision=bf16"], "data"),
                  "fp16_tables": (["train.precision=fp32", "model.embedding_dtype=fp16"], "data")},
}
#: bf16's AUC, and the fp16 tables', within this of fp32's
PRECISION_MARGIN = 0.003
MARGIN = 0.005
MIN_MULTITASK_AUC = 0.85


def single_label_view(data: str, label: str, out: str) -> str:
    """A dataset folder whose schema names only ``label``, over the same parquet files (symlinked)."""
    import yaml

    with open(os.path.join(data, "schema.yaml")) as f:
        schema = yaml.safe_load(f)
    return schema_view(data, out, {**schema, "label": label})


def schema_view(data: str, out: str, schema: Dict[str, Any]) -> str:
    """A dataset folder with ``schema`` over ``data``'s parquet files (its splits symlinked)."""
    import yaml

    os.makedirs(out, exist_ok=True)
    for split in ("train", "valid"):
        link = os.path.join(out, split)
        if not os.path.lexists(link):
            os.symlink(os.path.join(data, split), link)
    with open(os.path.join(out, "schema.yaml"), "w") as f:
        yaml.safe_dump(schema, f, sort_keys=False)
    return out


def label_correlation(data: str) -> float:
    import numpy as np
    import pyarrow.parquet as pq

    t = pq.read_table(os.path.join(data, "train"), columns=["label", "like"])
    return float(np.corrcoef(t["label"].to_numpy(), t["like"].to_numpy())[0, 1])


def verdicts(suite: str, results: Sequence[Dict[str, Any]], seeds: Sequence[int],
             correlation: Optional[float]) -> Dict[str, Any]:
    """PASS/FAIL per acceptance item, per seed, on the last epoch's AUC (``valid_auc``); a missing or failed
    run makes its item FAIL."""
    got = {(r["seed"], r["side"], r["task"]): r.get("valid_auc") for r in results}

    def auc(seed: int, side: str, task: str) -> Optional[float]:
        return got.get((seed, side, task))

    out: Dict[str, Any] = {}
    if suite == "models":
        per_seed = []
        for s in seeds:
            a, b = auc(s, "dcn_v2", "label"), auc(s, "dlrm", "label")
            per_seed.append(None if a is None or b is None else a - b)
        ok = all(d is not None and d >= -MARGIN for d in per_seed)
        done = sorted(d for d in per_seed if d is not None)
        out["dcn_v2_vs_dlrm"] = {"diff_per_seed": per_seed, "median_diff": statistics.median(done) if done else None,
                                 "rule": f"dcn_v2 - dlrm >= -{MARGIN} on every seed (last epoch)",
                                 "verdict": "PASS" if ok else "FAIL"}
        return out
    if suite == "precision":
        for side in ("bf16", "fp16_tables"):
            diffs = [None if auc(s, side, "label") is None or auc(s, "fp32", "label") is None
                     else auc(s, side, "label") - auc(s, "fp32", "label") for s in seeds]
            out[f"{side}_vs_fp32"] = {"diff_per_seed": diffs, "rule": f"|{side} - fp32| <= {PRECISION_MARGIN}",
                                      "verdict": "PASS" if all(d is not None and abs(d) <= PRECISION_MARGIN
                                                               for d in diffs) else "FAIL"}
        return out
    for task, single in (("label", "label_only"), ("like", "like_only")):
        multi = [auc(s, "two_tasks", task) for s in seeds]
        diffs = [None if m is None or auc(s, single, task) is None else m - auc(s, single, task)
                 for s, m in zip(seeds, multi)]
        out[f"{task}_auc"] = {"per_seed": multi, "rule": f">= {MIN_MULTITASK_AUC}",
                              "verdict": "PASS" if all(m is not None and m >= MIN_MULTITASK_AUC for m in multi)
                              else "FAIL"}
        out[f"{task}_vs_single"] = {"diff_per_seed": diffs, "rule": f"|two_tasks - {single}| <= {MARGIN}",
                                    "verdict": "PASS" if all(d is not None and abs(d) <= MARGIN for d in diffs)
                                    else "FAIL"}
    out["label_correlation"] = {"value": correlation, "rule": "<= 0.5",
                                "verdict": "PASS" if correlation is not None and abs(correlation) <= 0.5 else "FAIL"}
    return out


def dataset_for_seed(data: Optional[str], seed: int, rows: int, multitask: bool) -> str:
    """The dataset seed ``seed`` trains on: ``data`` when given, else synthetic data generated with that seed
    (made when absent; seed 0 in the folder ``make run`` fills)."""
    if data is not None:
        return os.path.abspath(data)
    from rayemb.data.synthetic import SyntheticSpec, generate

    base = os.path.join(_REPO, "data", "synth_two_labels" if multitask else "synth_small")
    path = base if seed == 0 else f"{base}_seed{seed}"
    if not os.path.exists(os.path.join(path, "schema.yaml")):
        print(f"generating {rows:,} rows (seed {seed}) into {path}", flush=True)
        generate(SyntheticSpec(rows=rows, seed=seed, second_label=multitask), path)
    return path


def epoch_aucs(reports: Sequence[Dict[str, Any]], suffix: str = "") -> Dict[str, Any]:
    """A run's judged AUC, the last epoch's (``valid_auc``), with the best epoch's and the epochs validated."""
    aucs = [x[f"valid_auc{suffix}"] for x in reports if f"valid_auc{suffix}" in x]
    return {"valid_auc": aucs[-1] if aucs else None, "best_valid_auc": max(aucs) if aucs else None,
            "epochs": len(aucs)}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=sorted(SUITES), required=True)
    p.add_argument("--config", default=os.path.join(_REPO, "jobs", "configs", "synth_small.yaml"))
    p.add_argument("--data", default=None, help="one dataset for every seed (default: synthetic data generated "
                                                "per seed, see the module docstring)")
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="data and training seeds (with --data: training seeds only)")
    p.add_argument("--sides", nargs="+", default=None, help="the suite's sides to run (default: all)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    sides = {k: v for k, v in SUITES[args.suite].items() if args.sides is None or k in args.sides}
    unknown = sorted(set(args.sides or ()) - set(SUITES[args.suite]))
    if unknown:
        p.error(f"--sides {unknown}: not sides of --suite {args.suite}; pick from {sorted(SUITES[args.suite])}")
    os.chdir(_REPO)  # model.factory=examples.deepfm:deepfm imports from the repository

    import ray

    from rayemb.config import load_config
    from rayemb.train.driver.trainer import run_training

    multitask = args.suite == "multitask"
    data_per_seed = {s: dataset_for_seed(args.data, s, args.rows, multitask) for s in args.seeds}
    views: Dict[int, Dict[str, str]] = {}
    correlation: Dict[int, float] = {}
    for seed, data in data_per_seed.items():
        views[seed] = {"data": data}
        if multitask:
            scratch = data + "-views"
            shutil.rmtree(scratch, ignore_errors=True)
            views[seed].update({t: single_label_view(data, t, os.path.join(scratch, t)) for t in ("label", "like")})
            correlation[seed] = label_correlation(data)
    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")

    def document(results: List[Dict[str, Any]], complete: bool) -> Dict[str, Any]:
        worst = max(correlation.values(), key=abs) if correlation else None
        return {"schema_version": 2, "suite": args.suite, "config": args.config, "overrides": args.set,
                "data": data_per_seed, "data_seeded": args.data is None, "seeds": args.seeds,
                "sides": {k: v[0] for k, v in sides.items()}, "judged_auc": "valid_auc (last epoch)",
                "label_correlation": worst, "label_correlation_per_seed": correlation or None,
                "complete": complete, "results": results,
                "verdicts": verdicts(args.suite, results, args.seeds, worst)}

    results: List[Dict[str, Any]] = []
    order = run_order(args.seeds, list(sides))
    for i, (seed, side) in enumerate(order):
        overrides, view = sides[side]
        print(f"[{i + 1}/{len(order)}] seed {seed}, {side}", flush=True)
        cfg = load_config(args.config, [*args.set, *overrides, f"data.path={views[seed][view]}", f"train.seed={seed}",
                                        f"tracking.run_name={args.suite}-{side}-seed{seed}"])
        try:
            r = run_training(cfg, new_run=True)  # each repeat is a run of its own
        except Exception as e:  # noqa: BLE001 - recorded: its verdicts then FAIL
            results.append({"seed": seed, "side": side, "task": view, "error": f"{type(e).__name__}: {e}"})
            write_result(args.out, document(results, complete=False))
            continue
        tasks = ["label", "like"] if side == "two_tasks" else [view if view != "data" else "label"]
        for task in tasks:
            results.append({"seed": seed, "side": side, "task": task, "wall_time_s": r.wall_time_s,
                            "run_id": r.run_id, **epoch_aucs(r.reports, f".{task}" if side == "two_tasks" else "")})
        write_result(args.out, document(results, complete=False))

    out = document(results, complete=True)
    rows = sorted((r for r in results if "error" not in r), key=lambda r: (r["seed"], r["side"], r["task"]))
    footer = "".join(f"\n{name}: {v.get('diff_per_seed', v.get('per_seed', v.get('value')))} ({v['rule']}) "
                     f"{v['verdict']}" for name, v in out["verdicts"].items())
    return report(args.out, out, rows, COLUMNS, KEYS, footer=footer)


if __name__ == "__main__":
    sys.exit(main())
