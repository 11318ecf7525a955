"""Probes of real sharded modules: what one module group and one more table cost per step, per placement kind.

Kernel micro-benchmarks miss what dominates small steps: TorchRec's per-module
work (KJT permutes and splits, awaitables, the collectives' round trips on the
live backend) and the hybrid's merge of hot and cold halves. So calibration
also shards tiny tables exactly as training does — ``DistributedModelParallel``
over rayemb's :class:`~rayemb.embedding.hybrid.HybridEmbeddingBagCollection`
with the job's sharders, fused row-wise Adagrad, replicated rows on their own
optimizer — with 1 and N tables per kind, and times forward + backward +
optimizer on the local batch (ids remapped beforehand, as in-memory data is).
Two points give each kind's fixed cost per step and its cost per table.

Every probe is timed in one :class:`Interleaved` set with the rest of the
calibration (the collectives, the dense arch's step): round after round, each
step once, so all of them see the same host and links, and a slope is the
median of differences taken within a round.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

#: placement kinds probed (rayemb.planner.step_time.probe_kind maps placements onto them)
PROBE_KINDS = ("data_parallel", "table_wise", "column_wise", "row_wise", "hybrid")
PROBE_ROWS = 2_000
#: rows of the large replicated table that measures the cost per replicated element
PROBE_LARGE_ROWS = 50_000
PROBE_HOT_ROWS = 200
#: rows of the data-parallel probes: small, as replicated tables are, so that a table's own compute and launch
#: cost is not buried under its gradient's all-reduce (normalised away, and noisy at PROBE_ROWS x dim elements)
PROBE_DP_ROWS = 200
#: share of the probes' lookups that hit hot rows: half drawn from the hot rows, half uniform over all rows
PROBE_HOT_SHARE = 0.5 + 0.5 * PROBE_HOT_ROWS / PROBE_ROWS
#: tables per probe: the per-table slope is (t(hi) - t(1)) / (hi - 1) with hi the job's own table count, clamped
#: to [8, 32]: with fewer tables the slope drowns in a loaded host's noise (a hybrid table's cost clamped to 0
#: steers whole plans), and a fixed 8 extrapolates far for a job with many more tables, flipping the chosen plan
PROBE_TABLES = (1, 8)
PROBE_MAX_TABLES = 32
#: timed rounds of an :class:`Interleaved` set (each times every step once), after PROBE_WARMUP_ROUNDS untimed
PROBE_ROUNDS = 20
PROBE_WARMUP_ROUNDS = 2


class Interleaved:
    """Named steps timed round-robin: each round runs every step once, the ranks lined up (a barrier) before
    each, in an order rotated by one place a round; :meth:`median` and :meth:`difference` read the times.

    Timed one after another, each probe saw the host and the links of its own second or two. A shared host's
    speed and a shaped link's rate drift within minutes, so back-to-back calibrations on one cluster disagreed
    widely (docs/benchmarks.md, "Calibration interleaved"). Interleaved, every step sees the same mix of conditions, and a
    slope between two steps is the median of their differences within a round, in which slow drift cancels.
    Every rank must add the same steps in the same order (their collectives pair up by order).
    """

    def __init__(self, sync: Callable[[], None] = lambda: None,
                 barrier: Callable[[], None] = lambda: None) -> None:
        self._sync, self._barrier = sync, barrier
        self._steps: Dict[str, Callable[[], None]] = {}
        self._finish: List[Callable[[], None]] = []
        self.times: Dict[str, List[float]] = {}

    def add(self, name: str, step: Callable[[], None], finish: Optional[Callable[[], None]] = None) -> None:
        """``finish``: run once after the last round, untimed, e.g. to complete work the step left in flight
        (a prefetched input exchange must not outlive the process group: it aborted a rank once)."""
        if name in self._steps:
            raise ValueError(f"interleaved step {name!r} added twice")
        self._steps[name] = step
        if finish is not None:
            self._finish.append(finish)

    def run(self, rounds: int = PROBE_ROUNDS, warmup: int = PROBE_WARMUP_ROUNDS) -> "Interleaved":
        names = list(self._steps)
        self.times = {n: [] for n in names}
        for r in range(warmup + rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                self._barrier()
                t0 = time.perf_counter()
                self._steps[name]()
                self._sync()
                if r >= warmup:
                    self.times[name].append(time.perf_counter() - t0)
        for finish in self._finish:
            finish()
        return self

    def median(self, name: str) -> float:
        """Median seconds of one step of ``name``."""
        return statistics.median(self.times[name])

    def difference(self, name: str, base: str) -> float:
        """Median over rounds of ``name``'s seconds minus ``base``'s in the same round (may be negative)."""
        return statistics.median(a - b for a, b in zip(self.times[name], self.times[base]))


def _probe_step(kind: str, n_tables: int, local_batch: int, dim: int, device: Any, rows: int = PROBE_ROWS,
                prefetch: bool = False) -> Tuple[Callable[[], None], Optional[Callable[[], None]]]:
    """(one training step of ``n_tables`` tiny tables placed as ``kind``, what completes its pending prefetch, or
    None). ``prefetch``: each step starts the next one's input exchange before its backward, as the job's loop
    does with ``train.prefetch_input_dist``."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rayemb.embedding.data_parallel import OneDataParallelWrapper, replicated_embedding_parameters
    from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
    from rayemb.embedding.prefetch import StepPrefetch
    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.train.worker.optim import MultiTensorRowWiseAdagrad
    from rayemb.train.worker.step import StepBatch, TrainStep
    from rayemb.planner.cost import column_shards

    class _Sum(torch.nn.Module):
        def __init__(self, sparse: torch.nn.Module) -> None:
            super().__init__()
            self.sparse = sparse

        def forward(self, kjt: Any) -> Any:
            return self.sparse(kjt).values().sum()

    configs = [EmbeddingBagConfig(name=f"probe{i}", embedding_dim=dim, num_embeddings=rows,
                                  feature_names=[f"probe_f{i}"]) for i in range(n_tables)]
    hot = {c.name: np.arange(PROBE_HOT_ROWS, dtype=np.int64) for c in configs} if kind == "hybrid" else {}
    module = HybridEmbeddingBagCollection(configs, hot, device=torch.device("meta"))
    src = _Sum(module)
    apply_optimizer_in_backward(RowWiseAdagrad, module.parameters(), {"lr": 0.01})
    plain = {} if kind == "hybrid" else {c.name: [kind] for c in configs}
    world = dist.get_world_size()
    # column-wise in as many column shards as the job would cut (rayemb.planner.cost.column_shards)
    constraints = module.parameter_constraints("row_wise", plain)
    if kind == "column_wise":
        for c in constraints.values():
            c.min_partition = dim // column_shards(dim, world)
    sharders = cpu_capable_sharders()
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device=device.type),
                                       constraints=constraints)
    plan = planner.collective_plan(src, sharders, dist.GroupMember.WORLD)
    # the job's wrapper; a probe has no dense parameters, so a replicated kind keeps its lookup's own DDP
    model = DistributedModelParallel(src, device=device, plan=plan, sharders=sharders,
                                     data_parallel_wrapper=OneDataParallelWrapper())
    replicated = replicated_embedding_parameters(model)
    # the job's replicated optimizer (rayemb.train.worker.build.sharded_model)
    opt = MultiTensorRowWiseAdagrad(list(replicated.values()), lr=0.01) if replicated else None
    gen = np.random.default_rng(dist.get_rank())
    # half the lookups hit the hot rows (a hybrid table's typical share), the rest spread over all rows
    values = np.where(gen.random(n_tables * local_batch) < 0.5, gen.integers(0, PROBE_HOT_ROWS, n_tables * local_batch),
                      gen.integers(0, rows, n_tables * local_batch))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"probe_f{i}" for i in range(n_tables)],
                                              values=torch.from_numpy(values.astype(np.int64)),
                                              lengths=torch.ones(n_tables * local_batch, dtype=torch.int32))
    kjt = module.remapper.remap(kjt).to(device)
    # the job's step; the module's output is the loss, and every step looks up the same KJT, so the next
    # step's input exchange (prefetched) is this KJT's again
    batch = StepBatch((kjt,), sparse=kjt)
    step = TrainStep(model, opt, prefetch=StepPrefetch(model) if prefetch else None)
    return (lambda: step(batch, batch)), (step.finish if prefetch else None)


def _ddp_steps(local_batch: int, dim: int, device: Any) -> Tuple[Callable[[], None], Callable[[], None]]:
    """(unwrapped, wrapped) steps of a tiny dense layer; wrapped as ``DistributedModelParallel`` wraps a job's
    replicated parameters (:func:`add_probes`: their difference is what one DDP wrapper costs a step)."""
    import torch
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingPlan

    from rayemb.embedding.data_parallel import OneDataParallelWrapper

    class _Dense(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(dim, 1, device=device)

        def forward(self, x: Any) -> Any:
            return self.linear(x).sum()

    x = torch.randn(local_batch, dim, device=device)
    local = _Dense()
    wrapped = DistributedModelParallel(_Dense(), device=device, plan=ShardingPlan({}), sharders=[],
                                       data_parallel_wrapper=OneDataParallelWrapper())
    return (lambda: local(x).backward()), (lambda: wrapped(x).backward())


def add_probes(iv: Interleaved, local_batch: int, dim: int, device: Any, num_tables: int = PROBE_TABLES[1],
               prefetch: bool = False) -> Callable[[], Dict[str, Any]]:
    """Adds the probes of real sharded modules to ``iv``; returns what reads their figures once it has run:

    * ``groups``: kind -> (fixed seconds per step of the kind's module group(s), seconds per table), from
      1 and ``num_tables`` tables (within [8, 32]), so that a plan putting every table in one group is priced
      at a measured point, not an extrapolated one;
    * ``replicated_elem_s``: seconds per step per element of a replicated table on the live group (dense
      gradient, its all-reduce on the real links, the optimizer): the slope between a small and a large
      data-parallel table;
    * ``ddp_step_s``: seconds per step one ``DistributedDataParallel`` wrapper costs (its hooks and gradient
      all-reduce round trip on the live links), clamped at zero. A job has one such wrapper (dense arch,
      data-parallel tables and hybrid hot rows share its buckets:
      :class:`~rayemb.embedding.data_parallel.OneDataParallelWrapper`), while the data-parallel and hybrid
      probes each hold one of their own: the planner takes this off their fixed costs and counts it once per
      step (:func:`rayemb.planner.step_time.normalize_probes`).

    ``prefetch``: the probes step as the job will (``train.prefetch_input_dist``).
    """
    lo, hi = PROBE_TABLES[0], min(max(PROBE_TABLES[1], num_tables), PROBE_MAX_TABLES)
    for kind in PROBE_KINDS:
        rows = PROBE_DP_ROWS if kind == "data_parallel" else PROBE_ROWS
        for n in (lo, hi):
            iv.add(f"{kind}/{n}", *_probe_step(kind, n, local_batch, dim, device, rows, prefetch=prefetch))
    iv.add("replicated/small", *_probe_step("data_parallel", 1, local_batch, dim, device, PROBE_ROWS))
    iv.add("replicated/large", *_probe_step("data_parallel", 1, local_batch, dim, device, PROBE_LARGE_ROWS))
    local, wrapped = _ddp_steps(local_batch, dim, device)
    iv.add("ddp/local", local)
    iv.add("ddp/wrapped", wrapped)

    def read() -> Dict[str, Any]:
        groups = {}
        for kind in PROBE_KINDS:
            per_table = max(iv.difference(f"{kind}/{hi}", f"{kind}/{lo}") / (hi - lo), 0.0)
            groups[kind] = (max(iv.median(f"{kind}/{lo}") - lo * per_table, 0.0), per_table)
        elem = iv.difference("replicated/large", "replicated/small") / ((PROBE_LARGE_ROWS - PROBE_ROWS) * dim)
        return {"groups": groups, "replicated_elem_s": max(elem, 0.0),
                "ddp_step_s": max(iv.difference("ddp/wrapped", "ddp/local"), 0.0)}

    return read


__all__ = ["Interleaved", "add_probes", "PROBE_KINDS", "PROBE_ROWS", "PROBE_HOT_ROWS", "PROBE_DP_ROWS",
           "PROBE_HOT_SHARE", "PROBE_ROUNDS"]
