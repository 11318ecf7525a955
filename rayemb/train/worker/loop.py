"""The per-worker training loop (runs in every Ray Train worker, one per rank).

Each rank builds the job's model (its factory: :mod:`rayemb.contract`) around its
embedding tables on the meta device, shards it with the driver's plan under
``DistributedModelParallel``, streams its shard of the train split, and runs the
same number of steps as every other rank (a rank that runs dry early would hang
the collectives, so ranks also agree on "everyone still has a batch" every
step). Each step is :class:`rayemb.train.worker.step.TrainStep`, which reads nothing
back to the host: a window's losses are summed on the device and read, and
checked for divergence, at its log point (and before any checkpoint). After
each epoch it evaluates AUC and logloss on every row of the validation split,
over all ranks together (:mod:`rayemb.train.worker.validation`), and reports.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import time
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional

from rayemb.constants import TRAIN_SPLIT, VALID_SPLIT

if TYPE_CHECKING:
    from rayemb.config import JobConfig
    from rayemb.data.schema import DatasetSchema
    from rayemb.train.worker_job import WorkerJob

logger = logging.getLogger(__name__)


def _all_have(has_batch: bool, device) -> bool:
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if has_batch else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _agreed_steps(data, wanted: Optional[int], device) -> Optional[int]:
    """For in-memory data: the step count every rank can run (min over ranks), agreed once; None if streamed."""
    if data.needs_step_check:
        return None
    import torch
    import torch.distributed as dist

    n = torch.tensor([len(data) if wanted is None else min(len(data), wanted)], dtype=torch.int64, device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MIN)
    return int(n.item())


def peak_memory_bytes(device) -> int:
    """Peak memory of this rank: CUDA allocator peak on GPU, else the process's max RSS."""
    import resource

    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


# ---- CHECKPOINTS ---- #
#
# Logical checkpoints (rayemb.checkpoint): every table in its logical row space, loadable into any
# world size and plan; written at epoch ends and every train.checkpoint_every_n_steps / _s; where a
# (re)started group continues is rayemb.train.worker.resume.


def _maybe_inject_fault(fault: Optional[Dict[str, Any]], step: int) -> None:
    """Test hook ($RAYEMB_FAULT_INJECTION=STEP:MARKER_FILE[:kill] on the driver): fail once at STEP.

    ``kill``: this worker process SIGKILLs itself (no Python error, no cleanup), as a crash or OOM kill would.
    """
    if fault and step == fault["step"] and not os.path.exists(fault["marker"]):
        open(fault["marker"], "w").close()
        if fault.get("mode") == "kill":
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected fault at step {step}")


def _step_batch(batch, device, retrieval: bool = False, non_blocking: bool = False) -> Any:
    """One step's tensors on the device: the model's inputs (rayemb.contract.model) and what the loss takes
    besides the model's output: the labels, or a retrieval model's item ids (rayemb.train.worker.retrieval)."""
    from rayemb.contract.model import model_inputs
    from rayemb.train.worker.losses import loss_target
    from rayemb.train.worker.step import StepBatch

    inputs = model_inputs(batch, device, non_blocking)
    target = batch.ids if retrieval else loss_target(batch)
    return StepBatch(inputs, target.to(device, non_blocking=non_blocking), inputs[1])


def _shard(job: WorkerJob, split: str, rank: int, world: int) -> Any:
    """The rank's rows of ``split``: held by the driver or read by the rank itself (an in-memory shard), else Ray
    Data's shard."""
    import ray.train

    held = job.held_splits.get(split)
    if held is not None:  # the train split in equal shares, the valid split whole (rayemb.train.held_splits)
        return held.shard(rank, world, equal=split != VALID_SPLIT)
    return ray.train.get_dataset_shard(split)


def worker_loop(job_ref: Any) -> None:
    """Ray Train's loop of every worker: the driver's :class:`~rayemb.train.worker_job.WorkerJob` (by reference)."""
    loop_t0 = time.time()  # the worker process is up: what follows is imports, the process group, the model
    import ray

    # the driver may launch the workers before the plan is made (rayemb.train.driver.handoff): the model's imports
    # are done while it plans, and the job arrives when it is ready
    import torchrec.distributed.model_parallel  # noqa: F401

    from rayemb.train.worker import build, step, validation  # noqa: F401

    wait_t0 = time.time()
    job = ray.get(job_ref)
    if job is None:  # the driver's plan or MLflow run failed: the driver raises that error, nothing to train
        return
    train_loop_per_worker(job, loop_t0, plan_wait_s=time.time() - wait_t0)


def train_loop_per_worker(job: WorkerJob, loop_t0: Optional[float] = None, plan_wait_s: float = 0.0) -> None:
    loop_t0 = time.time() if loop_t0 is None else loop_t0
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    from rayemb.checkpoint.meta import DENSE_TRANSFORMS_KEY, CheckpointMeta
    from rayemb.data.batching import BatchConverter
    from rayemb.data.transforms import checkpoint_entry
    from rayemb.embedding.comm import COLLECTIVES, CommCounter
    from rayemb.embedding.raw_tables import eviction_counts
    from rayemb.logs import quiet_third_party_logs
    from rayemb.contract.tables import sequence_features, table_configs
    from rayemb.train.worker.build import build_step
    from rayemb.train.worker.data_loader import RankBatches
    from rayemb.train.worker.device_feed import DeviceFeed, pinned
    from rayemb.train.worker.dist_metrics import TrainWindow
    from rayemb.train.worker.resume import CheckpointSchedule, restore, save_and_report
    from rayemb.train.worker.step import LossWindow, StepTimer, check_finite_loss
    from rayemb.train.worker.validation import evaluate, validates_mid_epoch
    from rayemb.tracking.callback import stamped

    quiet_third_party_logs()

    cfg: JobConfig = job.cfg
    schema: DatasetSchema = job.schema
    # Step metrics go straight to the driver's queue: ray.train.report is a slow barrier across ranks, so it is
    # kept for epoch ends.
    metrics_queue = job.metrics_queue
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    shape = job.batch(world)
    steps_per_epoch = job.steps_per_epoch(world)
    torch.manual_seed(cfg.train.seed)
    # intra-op threads = the CPUs Ray granted this worker (Ray's OMP_NUM_THREADS rule), said once
    threads = max(1, int(job.cpus_per_worker or 1))
    torch.set_num_threads(threads)
    if rank == 0:
        logger.info("%d ranks, %d torch thread(s) each, device %s", world, threads, device)

    # an elastic group restarted on fewer ranks takes the plan made for its size (hot set and shards)
    plans = ray.get(job.plans)  # the plans travel as an object-store reference (rayemb.train.worker_job)
    if world not in plans:
        raise RuntimeError(f"no plan for {world} ranks (planned: {sorted(plans)}): the driver plans every world size "
                           "of scaling.num_workers")
    job_plan = plans[world].job_plan
    spec = ray.get(job.model) if job.model is not None else None  # a ModelSpec
    built = build_step(cfg, schema, job_plan, device, model_spec=spec, table_stats=job.table_stats, log=rank == 0)
    model, optimizer, remapper = built.model, built.optimizer, built.remapper
    item = built.item_feature  # a retrieval model's item feature, else None
    converter = BatchConverter(schema, cfg.data.id_policy, remap=remapper.remap,
                               sequence=cfg.model.sequence_tower != "none", keep_ids=item)
    valid_converter = BatchConverter(schema, cfg.data.id_policy, remap=remapper.remap,
                                     sequence=cfg.model.sequence_tower != "none", keep_ids=item, keep_groups=True)
    data_args = dict(in_memory=job.in_memory, first_batch_timeout_s=cfg.data.first_batch_timeout_s,
                     rank=rank, cpus_per_worker=job.cpus_per_worker, seed=cfg.train.seed)
    # on a GPU the first epoch trains as the shard is converted (the step leaves the CPU free; a CPU step needs its
    # cores itself), and batches are pinned where they are converted, so that their copies are asynchronous
    train_data = RankBatches(_shard(job, TRAIN_SPLIT, rank, world), cfg.data.batch_size,
                             pinned(converter) if device.type == "cuda" else converter,
                             split=TRAIN_SPLIT, overlap_first_epoch=device.type == "cuda", **data_args)
    # every validation row is scored: the last batch is padded to the full size, padding is masked out
    valid_data = RankBatches(_shard(job, VALID_SPLIT, rank, world), cfg.data.batch_size,
                             functools.partial(valid_converter, pad_to=cfg.data.batch_size), split=VALID_SPLIT,
                             shuffle=False, drop_last=False, **data_args)
    valid_data.preload()  # in memory: read while the train split is, ready for the first validation
    global_batch = shape.global_size
    log_every = cfg.train.log_every_n_steps

    tables = {t.name: (int(t.num_embeddings), int(t.embedding_dim))
              for t in table_configs(schema, cfg.model.embedding_dim)}
    tables.update({f.name: (f.num_embeddings, f.embedding_dim) for f in sequence_features(cfg.model, schema)})
    position = restore(model, optimizer, remapper, tables, shape, job.resume_from, job.checkpoint_root,
                       chunk_mib=cfg.train.checkpoint_chunk_mib)
    step = position.step
    if built.lr_schedule is not None:  # a function of the global step: a resumed job continues it exactly
        built.lr_schedule.start(step, cfg.train.epochs * steps_per_epoch)
    best = EarlyStopping(cfg.train.early_stopping_patience, position.bookkeeping,
                         early_stopping_metric(cfg.train.early_stopping_metric, retrieval=item is not None,
                                               grouped=schema.group is not None,
                                               regression=schema.task_type(cfg.train.early_stopping_task
                                                                           or schema.label) == "regression"))
    retrieval = None if item is None else {"candidates": converter.candidates, "batch_size": cfg.data.batch_size,
                                           "num_items": schema.feature(item).num_embeddings}
    fault = job.fault_injection
    schedule = CheckpointSchedule(cfg.train.checkpoint_every_n_steps, cfg.train.checkpoint_every_s, rank)
    ckpt_meta = CheckpointMeta(plan_fingerprint=job.plan_fingerprint, global_batch=global_batch,
                               placements={n: str(getattr(tp.placement, "value", tp.placement))
                                           for n, tp in job_plan.placements.items()}, world_size_planned=world,
                               dense_transforms=checkpoint_entry(schema)[DENSE_TRANSFORMS_KEY])

    def validate() -> Dict[str, float]:
        """The valid split's metrics, every rank together (all ranks call it alike)."""
        return evaluate(model, valid_data, device, padding=lambda: valid_converter.padding(cfg.data.batch_size),
                        tasks=schema.labels, primary=cfg.train.early_stopping_task, retrieval=retrieval,
                        task_types=schema.task_kinds)

    def checkpoint(epoch: int, epoch_steps: int, complete: bool, report: Dict[str, Any]) -> None:
        meta = ckpt_meta.at(epoch=epoch, step=step, epoch_complete=complete,
                            epoch_samples=epoch_steps * global_batch, early_stopping=best.state())
        save_and_report(model, optimizer, remapper, tables, meta, report, chunk_mib=cfg.train.checkpoint_chunk_mib)
        schedule.saved()

    ready_t = time.time()  # the model is sharded and restored: what follows is data, steps and validation
    for epoch in range(position.epoch, cfg.train.epochs):
        it = train_data.epoch(epoch)  # in memory: the first call reads the whole shard (on a GPU: as it trains)
        agreed = _agreed_steps(train_data, steps_per_epoch, device)
        skip = position.skip_steps if epoch == position.epoch else 0
        for _ in range(skip):  # the steps of this epoch the checkpoint already holds
            next(it, None)
        epoch_steps = skip
        window, window_t0 = LossWindow(device, step + 1), time.perf_counter()
        timer = StepTimer()
        counter = CommCounter()
        train_step = built.train_step(counter=counter, timer=timer)
        # the log window's outputs and labels, for its exact NE / AUC / RMSE (a retrieval model's loss takes ids)
        train_window = None if item is not None else TrainWindow(schema.labels, schema.task_kinds,
                                                                 cfg.train.early_stopping_task)
        if train_window is not None:
            train_step.loss_fn = train_window.wrap(train_step.loss_fn)
        epoch_t0 = time.time()  # wall clock: the driver splits the job's time into phases with it
        remaining = max(0, (steps_per_epoch if agreed is None else agreed) - skip)

        def batches() -> Iterator[Any]:
            """The remaining steps' host batches, until a rank runs dry."""
            for _ in range(remaining):
                batch = next(it, None)
                if agreed is None and not _all_have(batch is not None, device):
                    logger.warning("rank %d: a rank ran out of data at step %d; ending the epoch early", rank, step + 1)
                    return
                yield batch

        # each batch is copied to the device while the step before it runs (rayemb.train.worker.device_feed)
        on_device = DeviceFeed(batches(), functools.partial(_step_batch, device=device, retrieval=item is not None),
                               device)
        eval_every = cfg.train.eval_every_n_steps

        def losses() -> Iterator[Any]:
            """The steps' losses, the split validated every ``eval_every`` steps within the epoch. The step before
            a validation point draws no next batch, so that no input exchange of a training batch is in flight
            while validation runs the model."""
            feed = iter(on_device)
            while True:
                segment = feed if not eval_every else itertools.islice(feed, eval_every - step % eval_every)
                ran = 0
                for loss in train_step.steps(segment):
                    ran += 1
                    yield loss
                if not ran or not validates_mid_epoch(step, epoch_steps, skip + remaining, eval_every):
                    return
                check_window()
                mid = validate()
                report = {"step": step, "epoch": epoch, "epoch_step": epoch_steps, "epoch_steps": skip + remaining,
                          "mid_epoch_validation": 1, **mid}
                if rank == 0:
                    logger.info("epoch %d step %d (mid-epoch): %s", epoch, step, mid)
                if metrics_queue is None:
                    ray.train.report(report)
                elif rank == 0:
                    metrics_queue.actor.put_nowait.remote(stamped(report))

        def check_window() -> None:
            """Stops a diverged job before it is checkpointed (a collective: every rank's window is as long)."""
            if window.steps:
                total = window.sum.clone()
                dist.all_reduce(total)
                check_finite_loss(float(total), window.first_step, step, epoch)

        for loss in losses():  # no host sync per step: the loss is read at log points
            step += 1
            epoch_steps += 1
            _maybe_inject_fault(fault, step)
            window.add(loss)
            time_flag = 0.0
            if step % log_every == 0:
                elapsed = time.perf_counter() - window_t0
                # mean over ranks of: loss, per-phase seconds per step
                window_steps = window.steps
                vals = torch.cat([(window.sum / window_steps).reshape(1), torch.tensor(
                    [timer.totals[p] / window_steps for p in StepTimer.PHASES] + [schedule.due_flag()],
                    dtype=torch.float64, device=device)])
                dist.all_reduce(vals)
                time_flag = float(vals[-1])  # summed: rank 0 decides the time rule for all
                vals = (vals[:-1] / world).tolist()
                check_finite_loss(vals[0], window.first_step, step, epoch)  # every rank sees the same mean
                # bytes sent per step, summed over ranks, per collective family
                sent = counter.bytes()
                comm = torch.tensor([sent[c] / window_steps for c in COLLECTIVES], dtype=torch.float64, device=device)
                dist.all_reduce(comm)
                comm_metrics = {f"bytes_per_step.{c}": v for c, v in zip(COLLECTIVES, comm.tolist())}
                comm_metrics["bytes_per_step.total"] = sum(comm_metrics.values())
                # ids that lost their slot in each raw-id table since this group started (summed over ranks)
                evicted = {f"evictions.{t}": float(n) for t, n in eviction_counts(model, across_ranks=True).items()}
                counter.reset()
                mem = torch.tensor([peak_memory_bytes(device)], dtype=torch.float64, device=device)
                mems = [torch.zeros_like(mem) for _ in range(world)]
                dist.all_gather(mems, mem)
                window_quality = train_window.metrics() if train_window is not None else {}
                metrics = {
                    "step": step,
                    "epoch": epoch,
                    # where in the epoch, at this group's world size (an elastic restart changes the steps)
                    "epoch_step": epoch_steps,
                    "epoch_steps": skip + remaining,
                    "train_loss": vals[0],
                    "samples_per_s": window_steps * global_batch / max(elapsed, 1e-9),
                    "step_time_s": elapsed / window_steps,
                    **{f"time_s.{p}": v for p, v in zip(StepTimer.PHASES, vals[1:])},
                    **{f"peak_memory_bytes.rank{r}": float(m.item()) for r, m in enumerate(mems)},
                    **comm_metrics,
                    **evicted,
                    **window_quality,
                }
                if metrics_queue is None:
                    ray.train.report(metrics)
                elif rank == 0:
                    # Fire and forget: the driver drains this queue into MLflow; no rank waits.
                    metrics_queue.actor.put_nowait.remote(stamped(metrics))
                window.reset(step + 1)
                window_t0 = time.perf_counter()
                timer.reset()
            if schedule.due(step, time_flag) and epoch_steps < steps_per_epoch:
                check_window()
                checkpoint(epoch, epoch_steps, False, {"step": step, "epoch": epoch, "checkpoint": 1})
        check_window()  # the epoch's last window may be partial: a diverged model is neither validated nor saved
        clock = {"clock.loop_start_unix_s": loop_t0, "clock.plan_wait_s": plan_wait_s, "clock.ready_unix_s": ready_t,
                 "clock.epoch_start_unix_s": epoch_t0, "clock.epoch_steps_end_unix_s": time.time()}
        valid = validate()
        # every rank sees the same gathered metric, so all make the same decision; the last epoch is no early stop
        stop = best.update(epoch, valid.get(best.metric, float("nan"))) and epoch + 1 < cfg.train.epochs
        if rank == 0:
            logger.info("epoch %d step %d: %s", epoch, step, valid)
        report = {"step": step, "epoch": epoch, "epoch_end": 1, **valid, **best.metrics(), **clock,
                  "early_stopped": int(stop),
                  "world_size": world, "resumed_at_step": position.step if position.source else -1}
        checkpoint(epoch, epoch_steps, True, report)
        if stop:
            if rank == 0:
                logger.info("early stopping after epoch %d: no %s gain for %d epoch(s)", epoch, best.metric,
                            best.patience)
            break


class EarlyStopping:
    """Tracks the best validation ``metric`` over epochs, in its direction
    (:func:`rayemb.train.worker.metrics.metric_score`); says when ``patience`` epochs brought no gain."""

    def __init__(self, patience: Optional[int], resumed: Optional[Dict[str, Any]] = None,
                 metric: str = "valid_auc") -> None:
        from rayemb.train.worker.metrics import metric_goal

        resumed = resumed or {}
        if f"best_{metric}" not in resumed:  # a fresh job, or one that followed another metric
            resumed = {}
        self.patience, self.metric = patience, metric
        worst = float("-inf") if metric_goal(metric) == "max" else float("inf")
        self.best = float(resumed.get(f"best_{metric}", worst))
        self.best_epoch = int(resumed.get("best_epoch", -1))
        self.bad_epochs = int(resumed.get("epochs_without_gain", 0))

    def update(self, epoch: int, value: float) -> bool:
        from rayemb.train.worker.metrics import metric_score

        if math.isfinite(value) and metric_score(self.metric, value) > metric_score(self.metric, self.best):
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
        else:
            self.bad_epochs += 1
        return self.patience is not None and self.bad_epochs >= self.patience

    def metrics(self) -> Dict[str, float]:
        return {f"best_{self.metric}": self.best, "best_epoch": float(self.best_epoch)}

    def state(self) -> Dict[str, Any]:
        return {f"best_{self.metric}": self.best, "best_epoch": self.best_epoch, "epochs_without_gain": self.bad_epochs}


def early_stopping_metric(named: Optional[str], retrieval: bool, grouped: bool, regression: bool = False) -> str:
    """The metric early stopping follows: ``train.early_stopping_metric``, else ``valid_auc`` (``regression``, a
    primary task of regression: ``valid_rmse``; a retrieval model: its hit rate@50); refused when this model or
    schema does not report it."""
    from rayemb.errors import ConfigError
    from rayemb.train.worker.retrieval import RETRIEVAL_METRIC

    if named is None:
        return RETRIEVAL_METRIC if retrieval else "valid_rmse" if regression else "valid_auc"
    regression_metric = named in ("valid_rmse", "valid_mae")
    if not retrieval and regression_metric != regression:
        fix = ("valid_rmse or valid_mae" if regression
               else "valid_auc, valid_gauc, valid_logloss, valid_ne or valid_calibration")
        raise ConfigError(f"Invalid config value train.early_stopping_metric: {named!r} is not reported for the "
                          f"primary task, a {'regression' if regression else 'binary'} one. Use {fix}.")
    hit_rate = named.startswith("valid_hit_rate_at_")
    if hit_rate != retrieval:
        kind, fix = (("a retrieval model reports hit rates only", "valid_hit_rate_at_10, _50 or _100") if retrieval
                     else ("a ranking model reports no hit rate",
                           "valid_auc, valid_gauc, valid_logloss, valid_ne or valid_calibration"))
        raise ConfigError(f"Invalid config value train.early_stopping_metric: {named!r} is not reported ({kind}). "
                          f"Use {fix}.")
    if named == "valid_gauc" and not grouped:
        raise ConfigError("Invalid config value train.early_stopping_metric: 'valid_gauc' needs a group column. Name "
                          "one in schema.yaml (e.g. `group: user_id`), or follow another metric.")
    return named
