"""Bytes moved per step by the hybrid embedding vs TorchRec's pooled plans, measured and predicted.

For Zipf alpha in {0.8, 1.1, 1.3}, one-hot (sum) and multi-hot (mean pooling,
8 ids per bag on average) features, world size 2 and 4 (real gloo processes on
this machine), and each plan — ``hybrid`` (hot rows data-parallel, cold rows
row-wise with per-id exchange: the planner's hybrid placement;
``--hybrid-cold table_wise`` measures a table-wise cold half instead), TorchRec
``table_wise``, ``row_wise`` and ``data_parallel`` on the same tables — it trains a few steps under
``DistributedModelParallel`` and records:

* ``bytes_per_step``: bytes sent off-rank summed over ranks, counted by
  :class:`rayemb.embedding.comm.CommCounter` on the collectives really called
  (all-to-all, all-reduce incl. DDP's, reduce-scatter, all-gather);
* ``predicted_bytes_per_step``: :func:`rayemb.planner.traffic.predict_bytes_per_step`
  (the byte formulas of docs/hybrid.md), with the hot share h taken from the stats
  sample (not from the measured batches);
* ``planner_predicted_bytes_per_step``: what the planner's cost model
  (:func:`rayemb.planner.cost.table_bytes`) predicts for the same placement,
  summed over tables, from :class:`rayemb.planner.types.TableSpec` s built as
  the planner builds them from ``stats.json``: pooling factor = mean ids per bag
  of the stats sample, hot rows and hot share from the split of that sample;
* ``step_time_s``: forward + backward + optimizer, the slowest rank, mean over steps.

Hot sets come from exact counts over a separate stats sample and
:class:`rayemb.planner.split.HugeCTRSplitRule`, the rule the planner deploys.

Usage::

    python jobs/bench/hybrid_comm.py --out /tmp/hybrid_comm.json [--quick] [--hybrid-cold table_wise]

Writes ``{"schema_version": 1, "results": [...]}`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

SCHEMA_VERSION = 1
PLANS = ("hybrid", "table_wise", "row_wise", "data_parallel")
ALPHAS = (0.8, 1.1, 1.3)
POOLINGS = (1.0, 8.0)
WORLD_SIZES = (2, 4)
#: cold-half sharding of the ``hybrid`` plan; row-wise is what rayemb's planner deploys for a hybrid table
HYBRID_COLD_DEFAULT = "row_wise"


def _zipf_sampler(num_rows: int, alpha: float, seed: int):
    """Truncated Zipf over popularity ranks, ranks mapped to ids by a random permutation."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, num_rows + 1, dtype=np.float64) ** -alpha)
    cdf /= cdf[-1]
    perm = rng.permutation(num_rows).astype(np.int64)

    def sample(n: int, r: np.random.Generator) -> np.ndarray:
        return perm[np.minimum(np.searchsorted(cdf, r.random(n), side="right"), num_rows - 1)]

    return sample


def _lengths(batch: int, pooling: float, r: np.random.Generator) -> np.ndarray:
    if pooling == 1.0:
        return np.ones(batch, dtype=np.int32)  # int32 bag lengths, as the data path makes them
    return r.integers(1, int(2 * pooling), size=batch).astype(np.int32)  # uniform 1..2P-1, mean P


def _make_batches(cfg: Dict[str, Any], n: int, seed: int) -> List[Dict[str, tuple]]:
    r = np.random.default_rng(seed)
    out = []
    samplers = [_zipf_sampler(cfg["rows"], cfg["alpha"], 1000 + t) for t in range(cfg["tables"])]
    for _ in range(n):
        feats = {}
        for t, s in enumerate(samplers):
            lengths = _lengths(cfg["batch"], cfg["pooling"], r)
            feats[f"f{t}"] = (lengths, s(int(lengths.sum()), r))
        out.append(feats)
    return out


def _split(cfg: Dict[str, Any], world_size: int):
    """Hot ids per table from exact counts over a stats sample, HugeCTR rule (multi-node form)."""
    from rayemb.data.stats_types import DatasetStats, TableStats
    from rayemb.planner.split import HugeCTRSplitRule

    sample = _make_batches(cfg, cfg["stats_batches"], seed=99)
    tables = {}
    for t in range(cfg["tables"]):
        ids = np.concatenate([b[f"f{t}"][1] for b in sample])
        uniq, cnt = np.unique(ids, return_counts=True)
        tables[f"t{t}"] = TableStats(
            heavy_hitters=np.stack([uniq, cnt], axis=1),
            values=int(ids.size), num_embeddings=cfg["rows"], error_bound=0,
        )
    stats = DatasetStats(rows=cfg["stats_batches"] * cfg["batch"], tables=tables)
    rule = HugeCTRSplitRule(world_size=world_size, global_batch_size=cfg["batch"], embedding_dim=cfg["dim"])
    return rule.split(stats), _sample_pooling(sample, cfg["tables"])


def _sample_pooling(sample: List[Dict[str, tuple]], tables: int) -> Dict[str, float]:
    """Mean ids per bag of each table over the stats sample (the stats pass's ``pooling_factor.mean``)."""
    return {f"t{t}": float(sum(int(b[f"f{t}"][1].size) for b in sample) / sum(b[f"f{t}"][0].size for b in sample))
            for t in range(tables)}


def _configs(cfg: Dict[str, Any]):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

    pool = PoolingType.SUM if cfg["pooling"] == 1.0 else PoolingType.MEAN
    return [
        EmbeddingBagConfig(name=f"t{t}", embedding_dim=cfg["dim"], num_embeddings=cfg["rows"],
                           feature_names=[f"f{t}"], pooling=pool)
        for t in range(cfg["tables"])
    ]


def _predict(cfg: Dict[str, Any], plan: str, world_size: int, split) -> float:
    from rayemb.planner.traffic import predict_bytes_per_step

    specs = []
    for t in range(cfg["tables"]):
        ts = split.tables[f"t{t}"]
        specs.append(dict(
            placement=plan, batch_size=cfg["batch"], dim=cfg["dim"], world_size=world_size,
            pooling=cfg["pooling"], num_rows=cfg["rows"], hot_share=ts.hot_share, num_hot=ts.num_hot,
            cold_sharding=cfg["hybrid_cold"],
        ))
    return float(sum(predict_bytes_per_step(specs).values()))


def _planner_predict(cfg: Dict[str, Any], plan: str, world_size: int, split, pooling: Dict[str, float]) -> float:
    """The planner's cost model on the tables as it would see them from stats.json, summed over tables.

    All ranks of the bench share one machine, so devices per node = W.
    """
    from rayemb.planner.cost import table_bytes
    from rayemb.planner.types import Placement, TableSpec

    total = 0.0
    for t in range(cfg["tables"]):
        ts = split.tables[f"t{t}"]
        spec = TableSpec(f"t{t}", rows=cfg["rows"], dim=cfg["dim"], pooling_factor=pooling[f"t{t}"],
                         hot_rows=ts.num_hot, hot_share=ts.hot_share)
        total += table_bytes(spec, Placement(plan), world_size, world_size, cfg["batch"])
    return float(total)


def _run_plan(rank: int, world_size: int, cfg: Dict[str, Any], plan_name: str, split, batches) -> Dict[str, float]:
    import torch
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rayemb.embedding.comm import CommCounter, instrument_ddp
    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
    from rayemb.embedding.sharders import cpu_capable_sharders

    configs = _configs(cfg)
    if plan_name == "hybrid":
        module = HybridEmbeddingBagCollection(configs, {f"t{t}": split.hot_ids(f"t{t}") for t in range(cfg["tables"])})
        constraints = module.parameter_constraints(cfg["hybrid_cold"])
        remap = module.remapper.remap
    else:
        module = EmbeddingBagCollection(configs)
        kernel = "dense" if plan_name == "data_parallel" else "fused"
        constraints = {c.name: ParameterConstraints(sharding_types=[plan_name], compute_kernels=[kernel]) for c in configs}
        remap = None
    apply_optimizer_in_backward(torch.optim.SGD, module.parameters(), {"lr": 0.01})
    sharders = cpu_capable_sharders()
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                       constraints=constraints)
    plan = planner.collective_plan(module, sharders, dist.GroupMember.WORLD)
    model = DistributedModelParallel(module, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    opt = KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=0.01)) if dense else None
    instrument_ddp(model)

    local = cfg["batch"] // world_size
    lo, hi = rank * local, (rank + 1) * local
    kjts = []
    for feats in batches:
        keys, vals, lens = [], [], []
        for k, (lengths, values) in feats.items():
            offs = np.concatenate([[0], np.cumsum(lengths)])
            keys.append(k)
            lens.append(lengths[lo:hi])
            vals.append(values[offs[lo]:offs[hi]])
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.from_numpy(np.concatenate(vals)),
                                                  lengths=torch.from_numpy(np.concatenate(lens)))
        kjts.append(remap(kjt) if remap else kjt)  # the remap runs in the data path, not timed

    measured, times = [], []
    for i, kjt in enumerate(kjts):
        dist.barrier()
        with CommCounter() as cc:
            t0 = time.perf_counter()
            out = model(kjt)
            out.values().pow(2).mean().backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            dt = time.perf_counter() - t0
        if i == 0:
            continue  # warm-up step: lazy init, first-call splits exchange
        total = sum(cc.global_bytes().values())
        t = torch.tensor([dt], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        measured.append(total)
        times.append(float(t))
    return {"bytes_per_step": float(np.mean(measured)), "step_time_s": float(np.mean(times))}


def _bench_rank(rank: int, world_size: int, cfg: Dict[str, Any], alphas, poolings, plans) -> List[Dict[str, Any]]:
    import torch

    torch.manual_seed(0)
    rows = []
    for alpha in alphas:
        for pooling in poolings:
            c = dict(cfg, alpha=alpha, pooling=pooling)
            split, pooling_seen = _split(c, world_size)
            batches = _make_batches(c, cfg["steps"] + 1, seed=7)
            for plan in plans:
                r = _run_plan(rank, world_size, c, plan, split, batches)
                rows.append({
                    "alpha": alpha, "pooling": pooling, "world_size": world_size, "plan": plan,
                    "bytes_per_step": r["bytes_per_step"],
                    "predicted_bytes_per_step": _predict(c, plan, world_size, split),
                    "planner_predicted_bytes_per_step": _planner_predict(c, plan, world_size, split, pooling_seen),
                    "step_time_s": r["step_time_s"],
                    "hot_rows": int(sum(t.num_hot for t in split.tables.values())) if plan == "hybrid" else 0,
                    "hot_share": float(np.mean([t.hot_share for t in split.tables.values()])) if plan == "hybrid" else 0.0,
                })
    return rows


def _run_world(world_size: int, **kwargs: Any) -> List[Dict[str, Any]]:
    from rayemb.multiprocess import run_multiprocess

    return run_multiprocess(_bench_rank, world_size, timeout_s=3000, **kwargs)[0]


def format_table(results: List[Dict[str, Any]]) -> str:
    head = (f"{'alpha':>5} {'P':>3} {'W':>2} {'plan':<14}{'MB/step':>9}{'pred MB':>9}{'pred/meas':>10}"
            f"{'planner MB':>11}{'planner/meas':>13}{'vs best pooled':>15}{'step s':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        pooled = [x["bytes_per_step"] for x in results
                  if (x["alpha"], x["pooling"], x["world_size"]) == (r["alpha"], r["pooling"], r["world_size"])
                  and x["plan"] in ("table_wise", "row_wise")]
        best = min(pooled) if pooled else float("nan")
        lines.append(
            f"{r['alpha']:>5.1f} {r['pooling']:>3.0f} {r['world_size']:>2} {r['plan']:<14}"
            f"{r['bytes_per_step'] / 1e6:>9.3f}{r['predicted_bytes_per_step'] / 1e6:>9.3f}"
            f"{r['predicted_bytes_per_step'] / max(r['bytes_per_step'], 1):>10.3f}"
            f"{r['planner_predicted_bytes_per_step'] / 1e6:>11.3f}"
            f"{r['planner_predicted_bytes_per_step'] / max(r['bytes_per_step'], 1):>13.3f}"
            f"{r['bytes_per_step'] / best:>15.3f}{r['step_time_s']:>8.3f}"
        )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--quick", action="store_true", help="alpha 1.1, one-hot, W=2 and 4 only (smoke run)")
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--rows", type=int, default=20000, help="rows per table")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=8192, help="global batch size")
    p.add_argument("--steps", type=int, default=3, help="measured steps (after one warm-up)")
    p.add_argument("--stats-batches", type=int, default=20, help="global batches in the stats sample")
    p.add_argument("--world-sizes", default=",".join(map(str, WORLD_SIZES)))
    p.add_argument("--hybrid-cold", choices=("row_wise", "table_wise"), default=HYBRID_COLD_DEFAULT,
                   help="sharding of the hybrid plan's cold half (the planner deploys row_wise)")
    a = p.parse_args(argv)
    cfg = dict(tables=a.tables, rows=a.rows, dim=a.dim, batch=a.batch, steps=a.steps, stats_batches=a.stats_batches,
               hybrid_cold=a.hybrid_cold)
    alphas, poolings = ((1.1,), (1.0,)) if a.quick else (ALPHAS, POOLINGS)
    results: List[Dict[str, Any]] = []
    for w in (int(x) for x in a.world_sizes.split(",")):
        t0 = time.time()
        results += _run_world(w, cfg=cfg, alphas=alphas, poolings=poolings, plans=PLANS)
        print(f"world size {w}: {time.time() - t0:.0f}s", file=sys.stderr)
    doc = {"schema_version": SCHEMA_VERSION, "config": cfg, "results": results}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
