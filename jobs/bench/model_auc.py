"""Validation AUC of models side by side on the same data and steps: the shipped models, and multi-task.

    python jobs/bench/model_auc.py --suite models --out bench-results/model_auc_<date>_<commit>.json
    python jobs/bench/model_auc.py --suite multitask --out bench-results/multitask_auc_<date>_<commit>.json

``--suite models``: the default synthetic job (jobs/configs/synth_small.yaml on ``--data``, generated with
``rayemb gen-data --rows 400000`` when absent) trained with ``model.name: dlrm``, ``model.name: dcn_v2`` and
the DeepFM of examples/deepfm.py (``model.factory``), same data, config and steps. Verdict: DCN-v2's AUC
>= DLRM's - 0.005 on every seed.

``--suite multitask``: data with two labels (``gen-data --second-label``: ``like`` learnt from other tables
than ``label``), trained as one two-task DLRM (``label: [label, like]``), and as two single-task DLRMs on
the same files (a schema naming only ``label``, then only ``like``). Verdicts: each task's AUC >= 0.85 in
the two-task model, and within 0.005 of the single-task model of that label, on every seed; the labels'
correlation <= 0.5.

``--suite precision``: the default synthetic job with ``train.precision: fp32``, ``bf16`` (the dense layers
under autocast) and ``fp32`` with ``model.embedding_dtype: fp16`` (fp16 tables). Verdicts: bf16's AUC and the
fp16 tables' AUC each within 0.003 of fp32's on every seed.

Runs go seed by seed, the sides' order rotating per seed, on one local Ray cluster; every result is
written after each run (a later failure keeps the runs done). A verdict with a missing or failed run FAILs.
Quick check: ``--rows 40000 --seeds 0 --set train.epochs=1``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, write_result  # noqa: E402
from sequence_auc import run_order  # noqa: E402  (seed by seed, the sides rotated by one per seed)

COLUMNS = [("seed", ">4", "{}"), ("side", ">12", "{}"), ("task", ">6", "{}"), ("best AUC", ">9", "{:.4f}"),
           ("last AUC", ">9", "{:.4f}"), ("wall s", ">7", "{:.0f}")]
KEYS = ["seed", "side", "task", "best_valid_auc", "valid_auc", "wall_time_s"]
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
    """PASS/FAIL per acceptance item, per seed; a missing or failed run makes its item FAIL."""
    got = {(r["seed"], r["side"], r["task"]): r.get("best_valid_auc") for r in results}

    def auc(seed: int, side: str, task: str) -> Optional[float]:
        return got.get((seed, side, task))

    out: Dict[str, Any] = {}
    if suite == "models":
        per_seed = []
        for s in seeds:
            a, b = auc(s, "dcn_v2", "label"), auc(s, "dlrm", "label")
            per_seed.append(None if a is None or b is None else a - b)
        ok = all(d is not None and d >= -MARGIN for d in per_seed)
        out["dcn_v2_vs_dlrm"] = {"diff_per_seed": per_seed, "rule": f"dcn_v2 - dlrm >= -{MARGIN}",
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


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=sorted(SUITES), required=True)
    p.add_argument("--config", default=os.path.join(_REPO, "jobs", "configs", "synth_small.yaml"))
    p.add_argument("--data", default=None, help="dataset (generated if absent; default data/synth_small, "
                                                "data/synth_two_labels for multitask)")
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    os.chdir(_REPO)  # model.factory=examples.deepfm:deepfm imports from the repository

    import ray

    from rayemb.config import load_config
    from rayemb.data.synthetic import SyntheticSpec, generate
    from rayemb.train.trainer import run_training

    multitask = args.suite == "multitask"
    data = os.path.abspath(args.data or os.path.join(_REPO, "data", "synth_two_labels" if multitask
                                                     else "synth_small"))
    if not os.path.exists(os.path.join(data, "schema.yaml")):
        print(f"generating {args.rows:,} rows into {data}", flush=True)
        generate(SyntheticSpec(rows=args.rows, second_label=multitask), data)
    views = {"data": data}
    correlation = None
    if multitask:
        scratch = data + "-views"
        shutil.rmtree(scratch, ignore_errors=True)
        views.update({t: single_label_view(data, t, os.path.join(scratch, t)) for t in ("label", "like")})
        correlation = label_correlation(data)
    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")

    sides = SUITES[args.suite]

    def document(results: List[Dict[str, Any]], complete: bool) -> Dict[str, Any]:
        return {"schema_version": 1, "suite": args.suite, "config": args.config, "overrides": args.set,
                "data": data, "seeds": args.seeds, "sides": {k: v[0] for k, v in sides.items()},
                "label_correlation": correlation, "complete": complete, "results": results,
                "verdicts": verdicts(args.suite, results, args.seeds, correlation)}

    results: List[Dict[str, Any]] = []
    order = run_order(args.seeds, list(sides))
    for i, (seed, side) in enumerate(order):
        overrides, view = sides[side]
        print(f"[{i + 1}/{len(order)}] seed {seed}, {side}", flush=True)
        cfg = load_config(args.config, [*args.set, *overrides, f"data.path={views[view]}", f"train.seed={seed}",
                                        f"tracking.run_name={args.suite}-{side}-seed{seed}"])
        try:
            r = run_training(cfg, new_run=True)  # each repeat is a run of its own
        except Exception as e:  # noqa: BLE001 - recorded: its verdicts then FAIL
            results.append({"seed": seed, "side": side, "task": view, "error": f"{type(e).__name__}: {e}"})
            write_result(args.out, document(results, complete=False))
            continue
        tasks = ["label", "like"] if side == "two_tasks" else [view if view != "data" else "label"]
        for task in tasks:
            suffix = f".{task}" if side == "two_tasks" else ""
            best = max((x[f"valid_auc{suffix}"] for x in r.reports if f"valid_auc{suffix}" in x), default=None)
            results.append({"seed": seed, "side": side, "task": task, "best_valid_auc": best,
                            "valid_auc": r.metrics.get(f"valid_auc{suffix}"), "wall_time_s": r.wall_time_s,
                            "run_id": r.run_id})
        write_result(args.out, document(results, complete=False))

    out = document(results, complete=True)
    rows = sorted((r for r in results if "error" not in r), key=lambda r: (r["seed"], r["side"], r["task"]))
    footer = "".join(f"\n{name}: {v.get('diff_per_seed', v.get('per_seed', v.get('value')))} ({v['rule']}) "
                     f"{v['verdict']}" for name, v in out["verdicts"].items())
    return report(args.out, out, rows, COLUMNS, KEYS, footer=footer)


if __name__ == "__main__":
    sys.exit(main())
