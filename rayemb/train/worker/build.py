"""The training step's set-up, written once: the job's sharded model, its loss, prefetch and step.

Everything that steps the job's own model sets it up here: the loop (:mod:`rayemb.train.worker.loop`), the plan probe
(:mod:`rayemb.train.calibration.plan_probe`), the step benchmarks (jobs/bench/gpu.py, jobs/bench/step_profile.py). So the
probe times the step the loop will run (the same loss, with the same table statistics, the same precision and
input prefetch), and a change of the set-up reaches all of them at once.

:func:`build_step` shards the model (:func:`sharded_model`), applies ``train.compile``, counts the DDP
all-reduce's bytes (:func:`~rayemb.embedding.comm.instrument_ddp`), starts the next batch's input exchange early
(:class:`~rayemb.embedding.prefetch.StepPrefetch`) and builds the job's loss (:func:`~rayemb.train.worker.losses.job_loss`);
:meth:`BuiltStep.train_step` then gives the :class:`~rayemb.train.worker.step.TrainStep` that steps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Optional, Tuple

if TYPE_CHECKING:
    from rayemb.config import JobConfig
    from rayemb.data.schema import DatasetSchema
    from rayemb.train.worker.step import StepTimer, TrainStep


def sharded_model(cfg: "JobConfig", schema: "DatasetSchema", job_plan: Any, device: Any,
                  one_ddp: bool = True, model_spec: Any = None) -> Tuple[Any, Any, Any]:
    """The job's model sharded by ``job_plan`` under ``DistributedModelParallel``, its optimizer and id remapper.

    ``model_spec``: the :class:`~rayemb.contract.factory.ModelSpec` that builds it (None: the config's model).

    Sharded tables update in their backward (fused FBGEMM optimizer). Replicated embedding rows (hybrid hot
    halves, data-parallel tables) are dense parameters with all-reduced gradients: the same optimizer kind,
    their own instance; the MLPs use ``train.dense_optimizer`` (with ``train.weight_decay``). One DDP all-reduces the MLPs' and the replicated rows' gradients
    (:class:`~rayemb.embedding.data_parallel.OneDataParallelWrapper`; ``one_ddp=False``: TorchRec's DDP per
    data-parallel lookup, for A/B benchmarks, their all-reduce in fp32 whatever ``train.comm_precision``). The
    exchanges run at ``train.comm_precision`` (:mod:`rayemb.embedding.qcomm`). Needs the process group (every rank
    calls it alike).
    """
    import torch
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

    from rayemb.embedding.data_parallel import OneDataParallelWrapper, replicated_embedding_parameters
    from rayemb.embedding.qcomm import CommPrecision, qcomm_codecs_registry
    from rayemb.embedding.raw_tables import RawIdEmbeddingBagCollectionSharder
    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.embedding.kernels import check_embedding_optimizer
    from rayemb.train.worker.optim import dense_optimizer, embedding_optimizer
    from rayemb.train.sharding import build_model, plan_for_model

    check_embedding_optimizer(cfg.train.embedding_optimizer, job_plan.sharding_plan, device)
    model, embeddings, paths = build_model(cfg, schema, job_plan.placements, job_plan.hot_ids,
                                           embedding_device=torch.device("meta"), dense_device=device,
                                           model=model_spec)
    remapper = embeddings.pooled.remapper
    emb_opt_cls = embedding_optimizer(cfg.train.embedding_optimizer)
    rep_opt_cls = embedding_optimizer(cfg.train.embedding_optimizer, replicated=True)
    for module in (embeddings.pooled, embeddings.sequence):  # sequence: the history tables, if any
        if module is not None:
            # only TorchRec's table modules (fused in sharding); projections and replicated rows stay dense
            tables = [p for m in module.modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))
                      for p in m.parameters()]
            apply_optimizer_in_backward(emb_opt_cls, tables, {"lr": cfg.train.embedding_lr})
    comm = CommPrecision.of(cfg.train.comm_precision)
    sharders = [*cpu_capable_sharders(comm), RawIdEmbeddingBagCollectionSharder(
        qcomm_codecs_registry=qcomm_codecs_registry(comm))]
    model = DistributedModelParallel(module=model, device=device, plan=plan_for_model(job_plan.sharding_plan, paths),
                                     sharders=sharders, data_parallel_wrapper=OneDataParallelWrapper(
                                         allreduce_comm_precision=comm.allreduce) if one_ddp else None)
    replicated = replicated_embedding_parameters(model)
    dense = dense_parameters(model)
    optimizers = [model.fused_optimizer, KeyedOptimizerWrapper(dense, lambda params: dense_optimizer(
        params, cfg.train.dense_lr, cfg.train.dense_optimizer, cfg.train.weight_decay))]
    if replicated:
        optimizers.append(KeyedOptimizerWrapper(replicated, lambda params: rep_opt_cls(params, lr=cfg.train.embedding_lr)))
    return model, CombinedOptimizer(optimizers), remapper


def dense_parameters(model: Any) -> dict:
    """The sharded model's dense parameters by name: neither the fused tables' (updated in the backward) nor the
    replicated embedding rows (their own optimizer)."""
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from rayemb.embedding.data_parallel import replicated_embedding_parameters

    replicated = replicated_embedding_parameters(model)
    return {n: p for n, p in in_backward_optimizer_filter(model.named_parameters()) if n not in replicated}


@dataclass
class BuiltStep:
    """The job's sharded model and what steps it: its ``optimizer`` (stepped after the backward), ``remapper``
    (the ids' rows), ``loss_fn(output, target)``, ``prefetch`` (None: off, or nothing to prefetch),
    ``item_feature`` (a retrieval model's item feature, whose ids are its loss's target; else None), the step's
    ``precision``, the names of the submodules ``train.compile`` compiled, the ``lr_schedule``
    (:class:`~rayemb.train.worker.schedule.LrSchedule`; None: the rates stay the config's) and the dense
    parameters clipped to ``clip_norm`` (``train.grad_clip_norm``; None: no clipping)."""

    model: Any
    optimizer: Any
    remapper: Any
    loss_fn: Callable[[Any, Any], Any]
    prefetch: Any
    item_feature: Optional[str]
    precision: str
    compiled: List[str] = field(default_factory=list)
    lr_schedule: Any = None
    clip_params: List[Any] = field(default_factory=list)
    clip_norm: Optional[float] = None

    def train_step(self, counter: Any = None, timer: Optional["StepTimer"] = None) -> "TrainStep":
        """A :class:`~rayemb.train.worker.step.TrainStep` of this model (``counter``, ``timer``: its own)."""
        from rayemb.train.worker.step import TrainStep

        return TrainStep(self.model, self.optimizer, self.loss_fn, prefetch=self.prefetch, counter=counter,
                         timer=timer, precision=self.precision, lr_schedule=self.lr_schedule,
                         clip_params=self.clip_params, clip_norm=self.clip_norm)


def build_step(cfg: "JobConfig", schema: "DatasetSchema", job_plan: Any, device: Any, *, model_spec: Any = None,
               table_stats: Optional[Mapping[str, Any]] = None, compile: bool = True, log: bool = False,
               instrument: bool = True, one_ddp: bool = True) -> BuiltStep:
    """The job's step on this rank: its model sharded by ``job_plan`` (:func:`sharded_model`), compiled as
    ``train.compile`` says, its DDP's bytes counted, its input prefetch (``train.prefetch_input_dist``), its loss.

    ``model_spec``: the job's :class:`~rayemb.contract.factory.ModelSpec` (None: the config's model), whose loss, if
    it has one, is the job's; ``table_stats``: the statistics pass's tables (a retrieval model's logQ correction
    reads its item table's); ``compile``: False steps the model eagerly whatever ``train.compile`` says (the
    probes: one compile per candidate would cost more than the probe); ``log``: ``train.compile``'s line is
    logged (rank 0); ``instrument``: the DDP all-reduce's bytes counted (off: the counter's cost measured away);
    ``one_ddp``: :func:`sharded_model`'s. Needs the process group (every rank calls it alike).
    """
    from rayemb.embedding.comm import instrument_ddp
    from rayemb.embedding.prefetch import StepPrefetch
    from rayemb.train.worker.compile import apply_train_compile
    from rayemb.train.worker.losses import job_loss
    from rayemb.train.worker.retrieval import item_feature_of
    from rayemb.train.worker.schedule import LrSchedule, is_constant

    model, optimizer, remapper = sharded_model(cfg, schema, job_plan, device, one_ddp=one_ddp, model_spec=model_spec)
    compiled = apply_train_compile(model, cfg.train, log=log) if compile else []
    if instrument:
        instrument_ddp(model)
    # the next batch's input exchange starts before this batch's backward (rayemb.embedding.prefetch)
    prefetch = StepPrefetch(model) if cfg.train.prefetch_input_dist else None
    prefetch = prefetch if prefetch is not None and prefetch.enabled else None
    item = item_feature_of(model)
    loss_fn = job_loss(schema, cfg.train.task_weights, model_spec.loss if model_spec is not None else None, item,
                       table_stats, regression_loss=cfg.train.regression_loss)
    # made before a checkpoint's optimizer state is loaded: its base rates are the config's
    schedule = None if is_constant(cfg.train.lr_schedule) else LrSchedule(optimizer, cfg.train.lr_schedule)
    clip = list(dense_parameters(model).values()) if cfg.train.grad_clip_norm is not None else []
    return BuiltStep(model, optimizer, remapper, loss_fn, prefetch, item, cfg.train.precision, compiled,
                     lr_schedule=schedule, clip_params=clip, clip_norm=cfg.train.grad_clip_norm)


__all__ = ["BuiltStep", "build_step", "dense_parameters", "sharded_model"]
