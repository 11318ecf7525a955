"""The plan probe: the job's own sharded model, timed for a few steps on the live cluster before training.

The step-time model (:mod:`rayemb.planner.step_time`) prices a plan from
constants measured on tiny probe modules, one placement kind at a time, and
bytes at one α-β line per collective. Real links are not a line: on the
emulated 100 mbit link an all-to-all sending 33 KB per rank took 0.3 ms after
a 30 ms idle gap, 1.2 ms between other collectives and 2.5 ms each in three
back to back, where the line through 4 KiB and 1 MiB prices it at 3.4 ms (the
shaper's bucket lets short bursts through at full speed; jobs/bench/link_shape.py). On that cluster the model over-predicted the hybrid plan 1.4-1.5x
and the pooled plan 1.1-1.2x (docs/benchmarks.md): good enough to rank plans,
not to say what a step will cost.

So before training, the plan is built exactly as the workers will build it
(:func:`rayemb.train.loop.sharded_model`: the same DLRM, sharding plan, one
DDP, optimizers, input prefetch) on actors placed like the workers, and
stepped on synthetic batches drawn from the job's statistics (each table's
pooling, and its ids with the measured heavy hitters' frequencies). Beside it
the same job on the other side of the hybrid choice is built (without hybrid
when the model chose hybrid tables, else with hybrid on the tables that could
have it: :func:`other_side`): both are stepped in one
:class:`~rayemb.train.calibrate_probes.Interleaved` set, so that a slow moment
of the host slows both alike, and the faster one trains. Its median step is the
job's predicted step time; the model's figure stays in plan.json as ``model_predicted_step_time_s``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

#: synthetic batches cycled through (each step prefetches the next one's input exchange, as training does)
PROBE_BATCHES = 4
#: steps a plan runs back to back per round of the interleaved set, as training runs them. One step a round, each
#: after a barrier (an idle link), read the hybrid plan at 26.8 ms on the emulated 100 mbit cluster where its
#: training stepped 32.3 ms
STEPS_PER_ROUND = 3


@dataclass(frozen=True)
class TableSample:
    """How one table's ids are drawn: its rows, ids per bag, and its heavy hitters with their frequencies."""

    rows: int
    pooling: float
    hot_ids: np.ndarray
    hot_probs: np.ndarray  # per hot id, the probability that a lookup hits it (sums to the table's hot share)

    def draw(self, n_bags: int, gen: np.random.Generator) -> "tuple[np.ndarray, np.ndarray]":
        """(lengths, ids) of ``n_bags`` bags: ``pooling`` ids per bag on average, heavy hitters as often as
        the statistics counted them, the rest uniform over the rows."""
        whole = int(self.pooling)
        lengths = np.full(n_bags, whole, dtype=np.int32) + (gen.random(n_bags) < self.pooling - whole)
        n = int(lengths.sum())
        ids = gen.integers(0, max(self.rows, 1), n)
        share = float(self.hot_probs.sum())
        if self.hot_ids.size and share > 0:
            hot = gen.random(n) < share
            ids[hot] = gen.choice(self.hot_ids, size=int(hot.sum()), p=self.hot_probs / share)
        return lengths, ids.astype(np.int64)


def table_samples(schema: Any, stats: Any, split: Any) -> Dict[str, TableSample]:
    """Every sparse table's :class:`TableSample` from the job's statistics and frequent-category split."""
    out = {}
    for f in schema.sparse:
        st = stats.tables.get(f.name) if stats is not None else None
        ts = split.tables.get(f.name) if split is not None else None
        pooling = float(st.pooling_mean) if st is not None else 1.0
        hot_ids = np.asarray(ts.hot_ids if ts is not None else [], dtype=np.int64)
        counts = np.asarray(ts.hot_counts if ts is not None else [], dtype=np.float64)
        share = float(ts.hot_share) if ts is not None else 0.0
        probs = counts / counts.sum() * share if counts.size and counts.sum() > 0 else np.zeros(0)
        out[f.name] = TableSample(int(f.num_embeddings), max(pooling, 0.0), hot_ids[:probs.size], probs)
    return out


def _batches(schema: Any, samples: Dict[str, TableSample], local_batch: int, seed: int) -> List[Any]:
    """PROBE_BATCHES (dense, raw sparse KJT, labels) batches of this rank."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = np.random.default_rng(seed)
    out = []
    for _ in range(PROBE_BATCHES):
        lengths, values = zip(*(samples[name].draw(local_batch, gen) for name in schema.sparse_names))
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=list(schema.sparse_names),
                                                  values=torch.from_numpy(np.concatenate(values)),
                                                  lengths=torch.from_numpy(np.concatenate(lengths)))
        dense = torch.from_numpy(np.log1p(gen.exponential(3.0, (local_batch, len(schema.dense)))).astype(np.float32))
        labels = torch.from_numpy((gen.random(local_batch) < 0.25).astype(np.float32))
        out.append((dense, kjt, labels))
    return out


def probe_rank(device: Any, world: int, cfg: Any, schema: Any, plans: Sequence[Any],
               samples: Dict[str, TableSample], steps: int) -> List[float]:
    """Median seconds per training step of each of ``plans`` (JobPlans) on this process group, the ranks'
    medians averaged (a rank actor's work).

    The plans are stepped in one interleaved set, STEPS_PER_ROUND steps back to back per round as the loop
    runs them (the ranks lined up before each round only), each step as the loop's: forward, the loss read,
    the next batch's input exchange started, backward, optimizer, the collectives' byte counter on.
    """
    import torch
    import torch.distributed as dist

    from rayemb.embedding.comm import CommCounter, instrument_ddp
    from rayemb.embedding.prefetch import StepPrefetch
    from rayemb.train.calibrate_probes import PROBE_WARMUP_ROUNDS, Interleaved
    from rayemb.train.loop import sharded_model

    torch.manual_seed(cfg.train.seed)
    raw = _batches(schema, samples, cfg.data.batch_size, cfg.train.seed + dist.get_rank())
    loss_fn = torch.nn.BCEWithLogitsLoss()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    iv = Interleaved(sync, dist.barrier)
    counter = CommCounter()
    for i, plan in enumerate(plans):
        model, optimizer, remapper = sharded_model(cfg, schema, plan, device)
        instrument_ddp(model)
        batches = [(d.to(device), remapper.remap(k).to(device), y.to(device)) for d, k, y in raw]
        prefetch = StepPrefetch(model) if cfg.train.prefetch_input_dist else None
        prefetch = prefetch if prefetch is not None and prefetch.enabled else None
        state = {"k": 0}

        def steps_back_to_back(model=model, optimizer=optimizer, batches=batches, prefetch=prefetch,
                               state=state) -> None:
            for _ in range(STEPS_PER_ROUND):
                k = state["k"]
                dense, sparse, labels = batches[k % PROBE_BATCHES]
                with counter:
                    loss = loss_fn(model(dense, sparse, None), labels)
                float(loss.detach())  # the loop reads the loss every step (its finite check)
                with counter:
                    if prefetch is not None:
                        prefetch.start(batches[(k + 1) % PROBE_BATCHES][1])
                    optimizer.zero_grad()
                    loss.backward()
                optimizer.step()
                state["k"] = k + 1

        iv.add(f"plan{i}", steps_back_to_back, prefetch.finish if prefetch is not None else None)
    iv.run(rounds=max(1, -(-steps // STEPS_PER_ROUND)), warmup=PROBE_WARMUP_ROUNDS)
    medians = torch.tensor([iv.median(f"plan{i}") / STEPS_PER_ROUND for i in range(len(plans))],
                           dtype=torch.float64)
    dist.all_reduce(medians)
    return (medians / world).tolist()


@dataclass
class ProbeResult:
    """What the plan probe measured: seconds per step of each candidate, which one won, how long it took."""

    step_s: List[float]
    chosen: int
    seconds: float

    def to_dict(self, plans: Sequence[Any]) -> Dict[str, Any]:
        return {"chosen": self.chosen, "seconds": self.seconds, "candidates": [
            {"placements": placement_counts(p.summary), "probed_step_time_s": s,
             "model_predicted_step_time_s": p.summary.get("predicted_step_time_s")}
            for p, s in zip(plans, self.step_s)]}


def placement_counts(summary: Dict[str, Any]) -> Dict[str, int]:
    """plan.json's tables counted by placement, e.g. ``{"data_parallel": 18, "hybrid": 8}``."""
    placements = [t["placement"] for t in summary["tables"].values()]
    return {p: placements.count(p) for p in sorted(set(placements))}


def probe_plans(cfg: Any, schema: Any, plans: Sequence[Any], samples: Dict[str, TableSample], world: int,
                cpus_per_worker: float, use_gpu: bool, strategy: str = "PACK",
                timeout_s: float = 300.0) -> ProbeResult:
    """Times ``plans`` on ``world`` ranks placed like the Train workers (:func:`probe_rank`); the fastest wins."""
    from rayemb.train.calibrate import run_on_ranks

    t0 = time.monotonic()
    per_rank = run_on_ranks(probe_rank, (cfg, schema, list(plans), samples, cfg.planner.probe_steps), world,
                            cpus_per_worker, use_gpu, timeout_s, strategy)
    step_s = [float(s) for s in per_rank[0]]
    return ProbeResult(step_s, int(np.argmin(step_s)), time.monotonic() - t0)


def other_side(cfg: Any, job_plan: Any, split: Any) -> Optional[Any]:
    """The config of the plan the probe times beside the model's: without hybrid when the model placed tables
    hybrid; else, hybrid pinned on every unpinned model-parallel table with infrequent rows and a hot set. The
    model's bias either way (measured: it over-predicted hybrid plans 1.4-1.5x on the emulated cluster, the
    pooled one 1.1-1.2x) is then settled by measurement. None when hybrid is off or no table could be hybrid."""
    if not cfg.planner.hybrid:
        return None
    if "hybrid" in placement_counts(job_plan.summary):
        return cfg.replace(planner=dataclasses.replace(cfg.planner, hybrid=False))
    tables = split.tables if split is not None else {}
    could = [name for name, t in job_plan.summary["tables"].items()
             if t["placement"] != "data_parallel" and name not in cfg.planner.tables and name in tables
             and 0 < tables[name].num_hot < tables[name].num_embeddings]
    if not could:
        return None
    pins = {**cfg.planner.tables, **{name: {"hybrid": True} for name in could}}
    return cfg.replace(planner=dataclasses.replace(cfg.planner, tables=pins))


def _placements(summary: Dict[str, Any]) -> Dict[str, str]:
    return {name: t["placement"] for name, t in summary["tables"].items()}


def choose_by_probe(cfg: Any, schema: Any, job_plan: Any, stats: Any, split: Any, plan_for: Callable[[Any], Any],
                    world: int, cpus_per_worker: float) -> Any:
    """``job_plan`` and the same job planned (``plan_for(config)``) on the other side of the hybrid choice
    (:func:`other_side`), timed on the live cluster (:func:`probe_plans`); returns the faster, its plan.json
    holding the probe's record (``plan_probe``), the probed step as ``predicted_step_time_s`` and the model's
    as ``model_predicted_step_time_s``.

    Skipped (``job_plan`` as it is) with ``planner.probe_steps: 0``, with a sequence tower (the probe's
    synthetic batches have no histories) and, said loudly, when the probe fails.
    """
    if cfg.planner.probe_steps == 0 or cfg.model.sequence_tower != "none":
        return job_plan
    candidates = [job_plan]
    other = other_side(cfg, job_plan, split)
    if other is not None:
        try:
            alt = plan_for(other)
        except Exception as e:  # noqa: BLE001 - e.g. a table pinned `sharding: hybrid` has no side without
            print(f"rayemb: plan probe: the other side of the hybrid choice has no plan ({type(e).__name__}); "
                  "probing the model's plan alone", flush=True)
            alt = job_plan
        if _placements(alt.summary) != _placements(job_plan.summary):  # pins leave no other side
            candidates.append(alt)
    print(f"rayemb: probing {len(candidates)} plan(s) for {cfg.planner.probe_steps} steps on {world} ranks ...",
          flush=True)
    try:
        result = probe_plans(cfg, schema, candidates, table_samples(schema, stats, split), world, cpus_per_worker,
                             cfg.scaling.use_gpu, cfg.scaling.placement_strategy)
    except Exception as e:  # noqa: BLE001 - the model's plan and prediction stand, said loudly
        print(f"rayemb: WARNING: plan probe failed ({type(e).__name__}: {e}); training the model's plan "
              "(planner.probe_steps=0 skips the probe)", flush=True)
        return job_plan
    record = result.to_dict(candidates)
    for plan, step_s in zip(candidates, result.step_s):
        print("rayemb: plan probe: " + ", ".join(f"{p} x{n}" for p, n in placement_counts(plan.summary).items())
              + f": {1e3 * step_s:.1f} ms/step measured, {1e3 * plan.summary['predicted_step_time_s']:.1f} ms "
              "predicted by the model", flush=True)
    chosen = candidates[result.chosen]
    if result.chosen:
        print("rayemb: plan probe: the step-time model's second choice measured faster; training it", flush=True)
    summary = chosen.summary
    summary["model_predicted_step_time_s"] = summary["predicted_step_time_s"]
    summary["predicted_step_time_s"] = result.step_s[result.chosen]
    summary["plan_probe"] = record
    return chosen


__all__ = ["TableSample", "table_samples", "probe_rank", "probe_plans", "ProbeResult", "PROBE_BATCHES", "placement_counts",
           "other_side", "choose_by_probe"]
