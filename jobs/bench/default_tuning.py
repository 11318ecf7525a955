"""The default job's settings (jobs/configs/synth_small.yaml) chosen on a grid, judged on rows never used to choose.

    python jobs/bench/default_tuning.py --set planner.calibrate=false \
        --out bench-results/default_tuning_<date>_<commit>.json

Each config of the grid (``CONFIGS``: learning rates, schedule, dense optimizer and weight decay, epochs) trains
the default job as it is, with early stopping off (``train.early_stopping_patience=null``) so every epoch runs,
on each data seed: seed ``s`` trains on the data ``model_auc.py`` uses (``data/synth_small`` for 0,
``data/synth_small_seed<s>`` otherwise, generated with ``--rows`` rows when absent), with ``train.seed=s``.

The valid split is cut in two (a dataset view per seed: train symlinked, the valid rows' first half as
``valid``, the second as ``test``): the job validates every epoch on the first half (the per-epoch AUC, the
best and last epoch and their gap), and each epoch-end checkpoint the job keeps is scored on the second half
after the job (``test AUC``), rows no epoch or config was picked on. A config's rows: its last epoch, and
for the constant-rate configs also its earlier epochs (``<name>@<k>ep``: with a constant rate, the first
``k`` epochs of the job are the job of ``train.epochs=k``).

Goal of a row, per seed: last-epoch valid AUC within ``GAP`` of its best epoch's, and the best epoch's AUC at
least today's default's on that seed (the ``today`` row). Among the rows meeting it on every seed the one with
the best median test AUC is reported as ``chosen``. Runs go seed by seed, the configs' order rotated per seed;
the JSON is written after each run, and ``--resume`` keeps an earlier JSON's runs (a grid grown later, or one
interrupted, trains only the seeds and configs it lacks).
Quick check: ``--seeds 0 --configs today --set train.max_steps_per_epoch=20``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import report, spread, write_result  # noqa: E402
from model_auc import dataset_for_seed  # noqa: E402
from sequence_auc import run_order  # noqa: E402

#: the judged gap between the best and the last epoch's valid AUC
GAP = 0.002
COSINE = ["train.lr_schedule.kind=cosine", "train.lr_schedule.min_lr_ratio=0.0"]
#: name -> overrides on top of the config file (early stopping is off for every one)
CONFIGS: Dict[str, List[str]] = {
    "today": [],
    "cosine_3ep": [*COSINE, "train.epochs=3"],
    "cosine_2ep": [*COSINE, "train.epochs=2"],
    "cosine_1ep": [*COSINE, "train.epochs=1"],
    "cosine_3ep_emb0.02": [*COSINE, "train.epochs=3", "train.embedding_lr=0.02"],
    "cosine_1ep_emb0.1": [*COSINE, "train.epochs=1", "train.embedding_lr=0.1"],
    "adamw_wd_cosine_2ep": [*COSINE, "train.epochs=2", "train.dense_optimizer=adamw", "train.dense_lr=0.002",
                            "train.weight_decay=0.01", "train.lr_schedule.warmup_steps=50"],
    "adamw_wd_1ep": ["train.epochs=1", "train.dense_optimizer=adamw", "train.dense_lr=0.002",
                     "train.weight_decay=0.01", "train.lr_schedule.warmup_steps=50"],
}
COLUMNS = [("config", "<22", "{}"), ("best AUC", ">9", "{:.4f}"), ("last AUC", ">9", "{:.4f}"),
           ("gap", ">7", "{:.4f}"), ("max gap", ">8", "{:.4f}"), ("test AUC", ">9", "{:.4f}"),
           ("test min", ">9", "{:.4f}"), ("test max", ">9", "{:.4f}"), ("seeds", ">5", "{}"), ("goal", ">5", "{}")]
KEYS = ["config", "best", "last", "gap", "max_gap", "test", "test_min", "test_max", "seeds", "goal"]


def split_view(data: str, out: str) -> str:
    """``out``: ``data``'s schema and train split (symlinked), its valid rows' first half as ``valid`` and the
    second half as ``test`` (the synthetic rows are drawn independently, so a half is a fair sample)."""
    import pyarrow.parquet as pq

    table = pq.read_table(os.path.join(data, "valid"))
    half = table.num_rows // 2
    for split, rows in (("valid", table.slice(0, half)), ("test", table.slice(half))):
        os.makedirs(os.path.join(out, split), exist_ok=True)
        pq.write_table(rows, os.path.join(out, split, "part-00000.parquet"))
    for name in ("train", "schema.yaml"):
        link = os.path.join(out, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(data, name), link)
    return out


def epoch_checkpoints(last: Optional[str]) -> Dict[int, str]:
    """Epoch -> the epoch-end checkpoint the job kept beside its newest one (``last``)."""
    from rayemb.checkpoint.reader import verify

    out: Dict[int, str] = {}
    if last is None:
        return out
    for path in sorted(glob.glob(os.path.join(os.path.dirname(last.rstrip("/")), "checkpoint_*"))):
        if not os.path.isdir(path):  # Ray Train's checkpoint_manager_snapshot.json
            continue
        meta = verify(path)
        if meta.get("epoch_complete", True):
            out[int(meta["epoch"])] = path
    return out


def test_auc(checkpoint: str, cfg: Any, data: str) -> float:
    """AUC on ``data``/test of the plain model merged from ``checkpoint`` (as ``rayemb export`` builds it)."""
    import pyarrow.parquet as pq

    from rayemb.checkpoint.export import unsharded_state
    from rayemb.checkpoint.reader import verify
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.transforms import transforms_of_checkpoint
    from rayemb.serve.model import InferenceModel, inference_state, model_config
    from rayemb.train.worker.metrics import auc

    schema, mcfg = DatasetSchema.load(data), model_config(cfg)
    state = inference_state(unsharded_state(checkpoint), schema, mcfg)
    schema = schema.with_dense_transforms(transforms_of_checkpoint(verify(checkpoint), schema.dense))
    model = InferenceModel.from_state(state, schema, mcfg, cfg.data.id_policy)
    rows = pq.read_table(os.path.join(data, "test"))
    return float(auc(rows.column(schema.labels[0]).to_numpy(), model.predict(rows)))


def run_rows(name: str, reports: Sequence[Dict[str, Any]], tests: Dict[int, float], constant: bool) -> List[Dict]:
    """A run's rows: its whole job, and (constant rate) each shorter job it contains."""
    aucs = [r["valid_auc"] for r in reports if "valid_auc" in r]
    ends = range(1, len(aucs) + 1) if constant else [len(aucs)]
    rows = []
    for k in ends:
        seen = aucs[:k]
        rows.append({"config": name if k == len(aucs) else f"{name}@{k}ep", "epochs": k, "valid_aucs": seen,
                     "best": max(seen), "last": seen[-1], "gap": max(seen) - seen[-1],
                     "test": tests.get(k - 1)})
    return rows


def summarize(results: Sequence[Dict[str, Any]], seeds: Sequence[int]) -> List[Dict[str, Any]]:
    """One row per config: medians over seeds and the goal's verdict (every seed: gap <= GAP and best >= the
    ``today`` row's best on that seed)."""
    by: Dict[str, Dict[int, Dict[str, Any]]] = {}
    for r in results:
        if "error" not in r:
            by.setdefault(r["config"], {})[r["seed"]] = r
    today = by.get("today", {})
    rows = []
    for name, per_seed in by.items():
        test = spread(r["test"] for r in per_seed.values())
        ok = set(per_seed) >= set(seeds) and all(
            r["gap"] <= GAP and s in today and r["best"] >= today[s]["best"] - 1e-9 for s, r in per_seed.items())
        rows.append({"config": name, "best": spread(r["best"] for r in per_seed.values())["median"],
                     "last": spread(r["last"] for r in per_seed.values())["median"],
                     "gap": spread(r["gap"] for r in per_seed.values())["median"],
                     "max_gap": max(r["gap"] for r in per_seed.values()), "test": test["median"],
                     "test_min": test["min"], "test_max": test["max"], "seeds": len(per_seed),
                     "goal": "yes" if ok else "no"})
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(_REPO, "jobs", "configs", "synth_small.yaml"))
    p.add_argument("--rows", type=int, default=400_000, help="rows of a seed's data when it is generated")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--configs", nargs="+", default=None, help=f"grid rows to run (default: all of {list(CONFIGS)})")
    p.add_argument("--scratch", default=os.path.join(_REPO, "data", "default_tuning"),
                   help="where the per-seed valid/test views are written")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=True)
    p.add_argument("--resume", default=None, help="an earlier JSON of this script: its runs are kept, not retrained")
    args = p.parse_args(argv)
    unknown = sorted(set(args.configs or ()) - set(CONFIGS))
    if unknown:
        p.error(f"--configs {unknown}: not in the grid; pick from {list(CONFIGS)}")
    configs = {k: v for k, v in CONFIGS.items() if args.configs is None or k in args.configs}

    import ray

    from rayemb.config import load_config
    from rayemb.train.driver.trainer import run_training

    views = {s: split_view(dataset_for_seed(None, s, args.rows, False), os.path.join(args.scratch, f"seed{s}"))
             for s in args.seeds}
    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")

    def document(results: List[Dict[str, Any]], complete: bool) -> Dict[str, Any]:
        rows = summarize(results, args.seeds)
        meeting = [r for r in rows if r["goal"] == "yes" and r["test"] is not None]
        chosen = max(meeting, key=lambda r: r["test"])["config"] if meeting else None
        return {"schema_version": 1, "config": args.config, "overrides": args.set, "rows_per_seed": args.rows,
                "data": views, "seeds": args.seeds, "configs": configs, "early_stopping": "off",
                "judged": {"valid": "first half of each seed's valid split, validated every epoch",
                           "test": "second half, each kept epoch-end checkpoint scored after the job",
                           "goal": f"every seed: best - last valid AUC <= {GAP} and best >= today's best"},
                "complete": complete, "results": results, "summary": rows, "chosen": chosen}

    results: List[Dict[str, Any]] = []
    if args.resume:
        with open(args.resume) as f:
            results = [r for r in json.load(f)["results"] if "error" not in r and r["seed"] in args.seeds]
        configs = {**{r["config"].split("@")[0]: CONFIGS[r["config"].split("@")[0]] for r in results}, **configs}
    done = {(r["seed"], r["config"]) for r in results}
    order = [(s, n) for s, n in run_order(args.seeds, list(configs)) if (s, n) not in done]
    for i, (seed, name) in enumerate(order):
        print(f"[{i + 1}/{len(order)}] seed {seed}, {name}", flush=True)
        cfg = load_config(args.config, [*args.set, "train.early_stopping_patience=null", *configs[name],
                                        f"data.path={views[seed]}", f"train.seed={seed}",
                                        f"tracking.run_name=default-tuning-{name}-seed{seed}"])
        try:
            r = run_training(cfg, new_run=True)
            tests = {e: test_auc(c, cfg, views[seed]) for e, c in epoch_checkpoints(r.last_checkpoint).items()}
        except Exception as e:  # noqa: BLE001 - recorded; the config then misses the goal
            results.append({"seed": seed, "config": name, "error": f"{type(e).__name__}: {e}"})
            write_result(args.out, document(results, complete=False))
            continue
        constant = cfg.train.lr_schedule["kind"] == "constant"
        for row in run_rows(name, r.reports, tests, constant):
            results.append({"seed": seed, **row, "wall_time_s": r.wall_time_s, "run_id": r.run_id})
            print(json.dumps(results[-1]), flush=True)
        write_result(args.out, document(results, complete=False))

    out = document(results, complete=True)
    return report(args.out, out, out["summary"], COLUMNS, KEYS,
                  footer=f"goal: every seed's last-epoch valid AUC within {GAP} of its best epoch's and the best "
                         f">= today's on that seed; chosen (best median test AUC): {out['chosen']}")


if __name__ == "__main__":
    sys.exit(main())
