"""The plan probe: the job's own sharded model, timed for a few steps on the live cluster before training.

The step-time model (:mod:`rayemb.planner.step_time`) prices a plan from
constants measured on tiny probe modules, one placement kind at a time, and
bytes at one α-β line per collective. Real links are not a line: a shaped link
lets short bursts through at full speed, so a message costs anything from almost
nothing to the line's price, depending on what the link carried just before
(jobs/bench/link_shape.py). The model is good enough to rank plans, not to say
what a step will cost (docs/benchmarks.md, "Measurements behind design choices").

So before training, the plan is built exactly as the workers will build it
(:func:`rayemb.train.worker.build.build_step`: the same model, sharding plan, one
DDP, optimizers, loss, precision, input prefetch) on actors placed like the workers, and
stepped on synthetic batches drawn from the job's statistics (each table's
pooling, and its ids with the measured heavy hitters' frequencies). Beside it
the same job on the other side of the hybrid choice is built (without hybrid
when the model chose hybrid tables, else with hybrid on the tables that could
have it: :func:`other_side`): both are stepped in one
:class:`~rayemb.train.calibration.probes.Interleaved` set, so that a slow moment
of the host slows both alike, and the faster one trains. When the candidates'
tables (weights and optimizer state, as plan.json's ``ranks`` count them) do not
fit a rank's memory together, they are stepped one after another instead, each
model freed before the next is built: every candidate is timed either way.

plan.json keeps the two figures apart: ``predicted_step_time_s`` is the
step-time model's for the trained plan (computed when the plan was made, before
any probe, for every candidate alike), ``probed_step_time_s`` the probe's median
step of it; ``plan_probe`` records both for every candidate, and where the step
times come from: ``source`` "measured" by this job, or "cached" from an earlier
job of the same key (:mod:`rayemb.train.calibration.store`), ``age_s`` seconds
old.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

#: synthetic batches cycled through (each step prefetches the next one's input exchange, as training does)
PROBE_BATCHES = 4
#: steps a plan runs back to back per round of the interleaved set, as training runs them: one step a round, each
#: after a barrier (an idle link), reads a plan faster than its training steps
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
        # keyed table by table, as the job's batches are (rayemb.data.batching)
        lengths, values = zip(*(samples[name].draw(local_batch, gen) for name in schema.pooled_features))
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=list(schema.pooled_features),
                                                  values=torch.from_numpy(np.concatenate(values)),
                                                  lengths=torch.from_numpy(np.concatenate(lengths)))
        dense = torch.from_numpy(np.log1p(gen.exponential(3.0, (local_batch, len(schema.dense)))).astype(np.float32))
        tasks = len(schema.labels)  # (B,) labels, or (B, T) for a multi-task schema
        labels = torch.from_numpy((gen.random(local_batch if tasks == 1 else (local_batch, tasks)) < 0.25)
                                  .astype(np.float32))
        out.append((dense, kjt, labels))
    return out


def rank_bytes(summary: Dict[str, Any]) -> List[int]:
    """Bytes of a plan's tables on each rank, by rank: weights and optimizer state (plan.json's ``ranks``, the
    planner's rows x dim x element bytes plus optimizer state of every shard placed there, replicas included)."""
    return [int(r["memory_bytes"]) for r in sorted(summary["ranks"], key=lambda r: r["rank"])]


def fit_together(candidate_bytes: Sequence[int], budget_bytes: int) -> bool:
    """Whether one rank can hold every candidate's tables at once: their bytes on it, summed, within its budget."""
    return sum(int(b) for b in candidate_bytes) <= budget_bytes


def free_memory_bytes(device: Any) -> int:
    """Memory free now where this rank's tables live: the GPU's, else the host's available memory."""
    import os

    import torch

    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _ranks_on_this_host(device: Any) -> int:
    """How many ranks share this rank's memory: 1 on a GPU, the ranks on this host on CPU."""
    import socket
    import zlib

    import torch
    import torch.distributed as dist

    if device.type == "cuda":
        return 1
    mine = torch.tensor([zlib.crc32(socket.gethostname().encode())], dtype=torch.int64)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return max(1, sum(int(t.item() == mine.item()) for t in every))


def interleave_on_every_rank(device: Any, plans: Sequence[Any], budget_cap: Optional[int] = None) -> bool:
    """Whether every rank can hold all of ``plans`` at once (a collective: every rank gets the same answer).

    A rank's budget is the least of the topology's table memory (plan.json ``capacity_bytes``), its share of the
    memory free now, and ``budget_cap`` when given.
    """
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    mine = [rank_bytes(p.summary)[rank] for p in plans]
    budget = min(int(r["capacity_bytes"]) for p in plans for r in p.summary["ranks"] if r["rank"] == rank)
    budget = min(budget, free_memory_bytes(device) // _ranks_on_this_host(device))
    if budget_cap is not None:
        budget = min(budget, int(budget_cap))
    fits = torch.tensor([int(fit_together(mine, budget))], dtype=torch.int64, device=device)
    dist.all_reduce(fits, op=dist.ReduceOp.MIN)
    return bool(fits.item())


def probe_rank(device: Any, world: int, cfg: Any, schema: Any, plans: Sequence[Any],
               samples: Dict[str, TableSample], steps: int, budget_cap: Optional[int] = None,
               model: Any = None, table_stats: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Median seconds per training step of each of ``plans`` (JobPlans) on this process group, the ranks'
    medians averaged, and whether they were interleaved (a rank actor's work). ``model``: the job's ModelSpec;
    ``table_stats``: the statistics pass's tables (the loss reads them as the loop's does).

    The plans are stepped in one interleaved set when every rank holds them all at once
    (:func:`interleave_on_every_rank`), else one after another, each model freed before the next is built.
    Either way STEPS_PER_ROUND steps run back to back per round as the loop runs them (the ranks lined up
    before each round only), each step the loop's own (:class:`~rayemb.train.worker.step.TrainStep`: forward, the next
    batch's input exchange started, backward, optimizer, the collectives' byte counter on), its loss summed on
    the device as the loop's window sums it, never read.
    """
    import gc

    import torch
    import torch.distributed as dist

    from rayemb.embedding.comm import CommCounter
    from rayemb.train.calibration.probes import PROBE_WARMUP_ROUNDS, Interleaved

    torch.manual_seed(cfg.train.seed)
    raw = _batches(schema, samples, cfg.data.batch_size, cfg.train.seed + dist.get_rank())
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    counter = CommCounter()
    rounds = max(1, -(-steps // STEPS_PER_ROUND))
    together = interleave_on_every_rank(device, plans, budget_cap)
    groups = [list(range(len(plans)))] if together else [[i] for i in range(len(plans))]
    medians = torch.zeros(len(plans), dtype=torch.float64)
    times: Dict[int, List[float]] = {}
    for group in groups:
        iv = Interleaved(sync, dist.barrier)
        for i in group:
            iv.add(f"plan{i}", *_plan_steps(cfg, schema, plans[i], device, raw, counter, model, table_stats))
        iv.run(rounds=rounds, warmup=PROBE_WARMUP_ROUNDS)
        for i in group:
            medians[i] = iv.median(f"plan{i}") / STEPS_PER_ROUND
            times[i] = list(iv.times[f"plan{i}"])
        del iv  # the models of this group go before the next group's are built
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    noise = torch.tensor([repeat_noise(times[i], times[0], together) / STEPS_PER_ROUND for i in range(len(plans))],
                         dtype=torch.float64)
    dist.all_reduce(medians)
    dist.all_reduce(noise)
    return {"step_s": (medians / world).tolist(), "noise_s": (noise / world).tolist(), "interleaved": together}


def repeat_noise(times: Sequence[float], base: Sequence[float], paired: bool) -> float:
    """How far apart two plans' medians may read by chance, from the probe's own repeats: the median absolute
    deviation of their round-by-round differences when interleaved (``paired``: round r of one beside round r
    of the other, so the host's drift cancels and only the scatter stays), else the two MADs combined. 0 for a
    plan against itself."""
    def mad(xs: Sequence[float]) -> float:
        mid = float(np.median(xs))
        return float(np.median([abs(x - mid) for x in xs]))

    if times is base:
        return 0.0
    if paired:
        return mad([a - b for a, b in zip(times, base)])
    return float(np.hypot(mad(times), mad(base)))


def choose(step_s: Sequence[float], noise_s: Optional[Sequence[float]] = None) -> Tuple[int, bool]:
    """(the candidate to train, whether the fastest is within the probe's noise of the model's plan, candidate
    0). Within noise, the measurement cannot tell them apart: the model's plan trains, so that the same job
    trains the same plan whichever way the noise fell. ``noise_s``: each candidate's noise against candidate 0
    (:func:`repeat_noise`; None: a probe kept before it was measured, the fastest trains)."""
    fastest = int(np.argmin(step_s))
    if noise_s is None or len(step_s) < 2:
        return fastest, False
    within = all(abs(s - step_s[0]) <= n for s, n in zip(step_s[1:], noise_s[1:]))
    return (0 if within else fastest), within


def probe_step(cfg: Any, schema: Any, plan: Any, device: Any, model_spec: Any = None,
               table_stats: Optional[Dict[str, Any]] = None) -> Any:
    """``plan``'s step as the loop builds it (:func:`~rayemb.train.worker.build.build_step`: the same loss, table
    statistics, precision and prefetch), stepped eagerly: a compile per candidate would cost more than the
    probe."""
    from rayemb.train.worker.build import build_step

    return build_step(cfg, schema, plan, device, model_spec=model_spec, table_stats=table_stats, compile=False)


def _plan_steps(cfg: Any, schema: Any, plan: Any, device: Any, raw: List[Any], counter: Any,
                model_spec: Any = None, table_stats: Optional[Dict[str, Any]] = None,
                ) -> "tuple[Callable[[], None], Optional[Callable[[], None]]]":
    """(STEPS_PER_ROUND training steps of ``plan``'s sharded model, what completes its pending prefetch or
    None): the model lives as long as the returned step does. ``model_spec``: the job's model (its factory;
    None: the config's); ``table_stats``: the statistics pass's tables, as the loop's loss reads them."""
    from rayemb.train.worker.step import LossWindow, StepBatch

    built = probe_step(cfg, schema, plan, device, model_spec, table_stats)
    item = built.item_feature  # a retrieval model: its in-batch softmax, without the synthetic rows' ids
    batches = []
    for dense, kjt, labels in raw:
        sparse = built.remapper.remap(kjt).to(device)
        batches.append(StepBatch((dense.to(device), sparse), None if item else labels.to(device), sparse))
    step = built.train_step(counter=counter)
    losses = step.steps(itertools.cycle(batches))  # each step draws the next batch, whose exchange it starts
    window = LossWindow(device, 1)

    def steps_back_to_back() -> None:
        for _ in range(STEPS_PER_ROUND):
            window.add(next(losses))

    return steps_back_to_back, (step.finish if built.prefetch is not None else None)


@dataclass
class ProbeResult:
    """What the plan probe measured: seconds per step of each candidate, which one won, how long it took, and
    whether the candidates were stepped interleaved (else one after another: they did not fit together)."""

    step_s: List[float]
    chosen: int
    seconds: float
    interleaved: bool = True
    #: "measured" by this job, or "cached": kept from an earlier job of the same key, measured ``age_s`` ago
    source: str = "measured"
    age_s: float = 0.0
    #: per candidate, its noise against candidate 0 (:func:`repeat_noise`); None: not measured (older kept probes)
    noise_s: Optional[List[float]] = None
    #: the candidates read within that noise of each other: the model's plan (candidate 0) was chosen (:func:`choose`)
    within_noise: bool = False

    def to_dict(self, plans: Sequence[Any]) -> Dict[str, Any]:
        return {"chosen": self.chosen, "seconds": self.seconds, "source": self.source, "age_s": self.age_s,
                "schedule": "interleaved" if self.interleaved else "sequential", "within_noise": self.within_noise,
                "candidates": [
                    {"placements": placement_counts(p.summary), "probed_step_time_s": s,
                     "predicted_step_time_s": p.summary.get("predicted_step_time_s"),
                     # the model's own seconds by family: with the probed step, a pair the learned ratios fit
                     "predicted_step_time_families_s": p.summary.get("predicted_step_time_families_s"),
                     **({} if self.noise_s is None else {"noise_s": self.noise_s[i]})}
                    for i, (p, s) in enumerate(zip(plans, self.step_s))]}

    def kept(self) -> Dict[str, Any]:
        """What is kept for later jobs (:func:`from_kept` reads it back)."""
        out = {"step_s": list(self.step_s), "chosen": self.chosen, "seconds": self.seconds,
               "interleaved": self.interleaved}
        if self.noise_s is not None:
            out["noise_s"] = list(self.noise_s)
        return out

    @classmethod
    def from_kept(cls, d: Any, candidates: int, age_s: float) -> "ProbeResult":
        """The result kept for ``candidates`` plans, ``age_s`` old (``source`` "cached"); ``ValueError`` naming
        what is wrong when it is not one: another number of step times, one not finite and positive, a chosen
        plan that is not the fastest."""
        import math

        if not isinstance(d, dict) or set(d) - {"noise_s"} != {"step_s", "chosen", "seconds", "interleaved"}:
            raise ValueError(f"holds {sorted(d) if isinstance(d, dict) else type(d).__name__}, not step_s, chosen, "
                             "seconds, interleaved (and noise_s)")
        step_s = d["step_s"]
        if not isinstance(step_s, list) or len(step_s) != candidates or not all(
                isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s > 0
                for s in step_s):
            raise ValueError(f"step_s is {step_s!r}; {candidates} finite positive seconds expected")
        noise_s = d.get("noise_s")
        if noise_s is not None and (not isinstance(noise_s, list) or len(noise_s) != candidates or not all(
                isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n) and n >= 0
                for n in noise_s)):
            raise ValueError(f"noise_s is {noise_s!r}; {candidates} finite seconds >= 0 expected")
        expected, within = choose(step_s, noise_s)
        chosen = d["chosen"]
        if isinstance(chosen, bool) or not isinstance(chosen, int) or chosen != expected:
            raise ValueError(f"chosen is {chosen!r}, not the plan step_s and noise_s choose ({expected})")
        if not isinstance(d["interleaved"], bool):
            raise ValueError(f"interleaved is {d['interleaved']!r}, not true or false")
        return cls([float(s) for s in step_s], chosen, 0.0, d["interleaved"], source="cached", age_s=float(age_s),
                   noise_s=None if noise_s is None else [float(n) for n in noise_s], within_noise=within)


def placement_counts(summary: Dict[str, Any]) -> Dict[str, int]:
    """plan.json's tables counted by placement, e.g. ``{"data_parallel": 18, "hybrid": 8}``."""
    placements = [t["placement"] for t in summary["tables"].values()]
    return {p: placements.count(p) for p in sorted(set(placements))}


def probe_plans(cfg: Any, schema: Any, plans: Sequence[Any], samples: Dict[str, TableSample], world: int,
                cpus_per_worker: float, use_gpu: bool, strategy: str = "PACK",
                timeout_s: float = 300.0, budget_cap: Optional[int] = None, model: Any = None,
                table_stats: Optional[Dict[str, Any]] = None) -> ProbeResult:
    """Times ``plans`` on ``world`` ranks placed like the Train workers (:func:`probe_rank`); the fastest wins.
    ``budget_cap``: at most these bytes of tables per rank at once (more than that: one plan at a time);
    ``model``: the job's ModelSpec (None: the config's model); ``table_stats``: the statistics pass's tables."""
    from rayemb.train.calibration.calibrate import run_on_ranks

    t0 = time.monotonic()
    per_rank = run_on_ranks(probe_rank, (cfg, schema, list(plans), samples, cfg.planner.probe_steps, budget_cap,
                                         model, table_stats),
                            world, cpus_per_worker, use_gpu, timeout_s, strategy)
    step_s = [float(s) for s in per_rank[0]["step_s"]]
    noise_s = [float(n) for n in per_rank[0]["noise_s"]]
    chosen, within = choose(step_s, noise_s)
    return ProbeResult(step_s, chosen, time.monotonic() - t0, bool(per_rank[0]["interleaved"]), noise_s=noise_s,
                       within_noise=within)


def other_side(cfg: Any, job_plan: Any, split: Any) -> Optional[Any]:
    """The config of the plan the probe times beside the model's: without hybrid when the model placed tables
    hybrid; else, hybrid pinned on every unpinned model-parallel table with infrequent rows and a hot set. The
    model's bias either way (on shaped links it over-predicts hybrid plans more than pooled ones) is then
    settled by measurement. None when hybrid is off or no table could be hybrid."""
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


def probe_candidates(cfg: Any, job_plan: Any, split: Any, plan_for: Callable[[Any], Any]) -> List[Any]:
    """``job_plan`` and, when there is one, the same job planned (``plan_for(config)``) on the other side of the
    hybrid choice (:func:`other_side`). Each is planned whole, so each carries the step-time model's own
    ``predicted_step_time_s``."""
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
    return candidates


def apply_probe(candidates: Sequence[Any], result: ProbeResult) -> Any:
    """The candidate the probe chose, its plan.json gaining the probe's median step (``probed_step_time_s``) and
    record (``plan_probe``). Its ``predicted_step_time_s`` stays the model's for that plan: no timing of the
    plan feeds it, so it reads the same as with ``planner.probe_steps: 0``."""
    chosen = candidates[result.chosen]
    chosen.summary["probed_step_time_s"] = result.step_s[result.chosen]
    chosen.summary["plan_probe"] = result.to_dict(candidates)
    return chosen


def _plan_fingerprint(summary: Dict[str, Any]) -> str:
    """What a probe of the plan steps: every table's placement, shards and hot rows, the batch and the world (not
    the ranks' free memory at planning time, which moves from one job to the next)."""
    plain = {k: summary.get(k) for k in ("tables", "global_batch", "world_size", "sequence")}
    return hashlib.sha1(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def choose_by_probe(cfg: Any, schema: Any, job_plan: Any, stats: Any, split: Any, plan_for: Callable[[Any], Any],
                    world: int, cpus_per_worker: float, model: Any = None,
                    kept: Optional[Tuple[str, Dict[str, Any], float]] = None) -> Any:
    """``job_plan`` and the same job on the other side of the hybrid choice (:func:`probe_candidates`), timed on
    the live cluster (:func:`probe_plans`), each the job's own model (``model``, its factory); returns the
    faster (:func:`apply_probe`).

    ``kept``: (output storage, the job's key fields, max age in seconds) of measurements kept for later jobs
    (:mod:`rayemb.train.calibration.store`): the same candidates probed on the same key within the age are not
    probed again. Skipped (``job_plan`` as it is) with ``planner.probe_steps: 0``, with a sequence tower (the
    probe's synthetic batches have no histories) and, said loudly, when the probe fails.
    """
    from rayemb.logs import redact_uri
    from rayemb.train.calibration.store import load_kept, mark_probe_kept, store_kept

    if cfg.planner.probe_steps == 0 or cfg.model.sequence_tower != "none":
        return job_plan
    candidates = probe_candidates(cfg, job_plan, split, plan_for)
    fields = None if kept is None else {**kept[1], "probe": {
        "steps": cfg.planner.probe_steps, "plans": [_plan_fingerprint(c.summary) for c in candidates]}}
    hit = None if kept is None else load_kept(kept[0], fields, kept[2])
    result = None
    if hit is not None:
        try:
            result = ProbeResult.from_kept(hit[0], len(candidates), hit[1])
        except ValueError as e:  # a damaged entry: probed anew, and replaced
            print(f"rayemb: WARNING: ignoring the kept plan probe {redact_uri(hit[2])} ({e}); probing anew",
                  flush=True)
    if result is not None:
        print(f"rayemb: plan probe of these {len(candidates)} plan(s) from {redact_uri(hit[2])}, measured "
              f"{result.age_s / 3600:.1f} h ago (planner.recalibrate=true probes anew)", flush=True)
    else:
        print(f"rayemb: probing {len(candidates)} plan(s) for {cfg.planner.probe_steps} steps on {world} ranks ...",
              flush=True)
        try:
            result = probe_plans(cfg, schema, candidates, table_samples(schema, stats, split), world,
                                 cpus_per_worker, cfg.scaling.use_gpu, cfg.scaling.placement_strategy, model=model,
                                 table_stats=None if stats is None else dict(stats.tables))
        except Exception as e:  # noqa: BLE001 - the model's plan and prediction stand, said loudly
            print(f"rayemb: WARNING: plan probe failed ({type(e).__name__}: {e}); training the model's plan "
                  "(planner.probe_steps=0 skips the probe)", flush=True)
            return job_plan
        if kept is not None:
            try:
                store_kept(kept[0], fields, result.kept())
                mark_probe_kept(kept[0], kept[1])
            except Exception as e:  # noqa: BLE001 - the job goes on; the next one probes again
                print(f"rayemb: WARNING: could not keep the plan probe ({type(e).__name__}: {e})", flush=True)
    for plan, step_s in zip(candidates, result.step_s):
        print("rayemb: plan probe: " + ", ".join(f"{p} x{n}" for p, n in placement_counts(plan.summary).items())
              + f": {1e3 * step_s:.1f} ms/step probed, {1e3 * plan.summary['predicted_step_time_s']:.1f} ms "
              "predicted by the model" + ("" if result.interleaved else " (one plan at a time: not both in memory)"),
              flush=True)
    if result.within_noise:
        print("rayemb: plan probe: the plans' steps are within the probe's noise of each other ("
              + ", ".join(f"{1e3 * n:.1f}" for n in (result.noise_s or [])[1:])
              + " ms, the scatter of its repeats); training the step-time model's choice", flush=True)
    elif result.chosen:
        print("rayemb: plan probe: the step-time model's second choice measured faster; training it", flush=True)
    return apply_probe(candidates, result)


__all__ = ["TableSample", "table_samples", "probe_rank", "probe_step", "probe_plans", "ProbeResult", "PROBE_BATCHES", "placement_counts",
           "repeat_noise", "choose",
           "other_side", "choose_by_probe", "probe_candidates", "apply_probe", "rank_bytes", "fit_together",
           "interleave_on_every_rank"]
