"""The driver: validate inputs, plan, launch Ray Train workers, track in MLflow.

Everything that can fail because of user input (config, data path, schema,
too little data) is checked here before any worker starts, and raises a
:class:`~rayemb.errors.RayembError` naming the input and the fix.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from rayemb._ray import init_ray
from rayemb.config import JobConfig, resolve_path
from rayemb.constants import FAULT_INJECTION_ENV_VAR, MIN_CPUS_PER_WORKER, RESERVED_DATA_CPUS, TRAIN_SPLIT, VALID_SPLIT
from rayemb.data.schema import DatasetSchema, count_rows, load_checked, parquet_files
from rayemb.errors import DataError, RayembError, TrainingError, find_user_error
from rayemb.logs import redact_uri
from rayemb.planner.types import parse_pins
from rayemb.train.sharding import pins_of

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_id: Optional[str]
    tracking_uri: str
    status: str
    metrics: Dict[str, float] = field(default_factory=dict)
    reports: List[Dict[str, Any]] = field(default_factory=list)
    plan: Dict[str, Any] = field(default_factory=dict)
    wall_time_s: float = 0.0
    #: Ray Train's checkpoint of the epoch with the best validation AUC
    best_checkpoint: Optional[str] = None


def _cpus_per_worker(cfg: JobConfig) -> float:
    """Leave ``RESERVED_DATA_CPUS`` free for Ray Data's read tasks, or the job hangs silently."""
    import ray

    if cfg.scaling.cpus_per_worker is not None:
        return cfg.scaling.cpus_per_worker
    total = float(ray.cluster_resources().get("CPU", 1.0))
    share = (total - RESERVED_DATA_CPUS) / cfg.scaling.num_workers
    return max(MIN_CPUS_PER_WORKER, min(1.0, round(share, 2)))


def _steps(rows: int, cfg: JobConfig, split: str, data_dir: str) -> int:
    per_rank = rows // cfg.scaling.num_workers
    steps = per_rank // cfg.data.batch_size
    if steps < 1:
        raise DataError(
            f"The {split} split of {data_dir!r} has {rows} rows, fewer than one global batch "
            f"(data.batch_size={cfg.data.batch_size} x scaling.num_workers={cfg.scaling.num_workers}). "
            "Generate more rows or lower data.batch_size."
        )
    return steps


def job_topology(cfg: JobConfig) -> Any:
    """The live Ray cluster's topology, cut to the job's ``scaling.num_workers`` ranks."""
    import dataclasses

    from rayemb.planner import topology_from_ray

    world = cfg.scaling.num_workers
    topo = topology_from_ray(num_workers=world)
    if topo.world_size != world:  # a GPU cluster larger (or smaller, before it scales up) than the job
        per_node = min(topo.devices_per_node, world)
        if world % per_node:
            per_node = world
        topo = dataclasses.replace(topo, num_nodes=world // per_node, devices_per_node=per_node)
    return topo


def _stats_and_split(cfg: JobConfig, schema: DatasetSchema, data_dir: str, topology: Any):
    """One statistics pass (or a matching stats.json) and the frequent-category split.

    Out-of-range ids fail here, before any worker starts, under ``data.id_policy: error``.
    """
    from rayemb.data.checks import ValueSummary, check_values
    from rayemb.data.stats import check_ids, compute_stats, load_or_compute_stats
    from rayemb.planner.planner import split_rule

    t0 = time.monotonic()
    stats_path = resolve_path(cfg.data.stats_path) if cfg.data.stats_path else None
    print(f"rayemb: statistics pass over {data_dir}/{TRAIN_SPLIT} ...", flush=True)
    stats = load_or_compute_stats(data_dir, stats_path, progress=True)
    check_values(ValueSummary.from_dict(stats["values"]), schema.label, f"{data_dir}/{TRAIN_SPLIT}")
    check_ids(stats, schema, cfg.data.id_policy)
    valid_values = compute_stats(data_dir, split=VALID_SPLIT, tables=False)["values"]
    check_values(ValueSummary.from_dict(valid_values), schema.label, f"{data_dir}/{VALID_SPLIT}")
    global_batch = cfg.data.batch_size * topology.world_size
    split = split_rule(topology, global_batch, cfg.model.embedding_dim).split(stats)
    print(f"rayemb: statistics of {stats['rows']:,} rows in {time.monotonic() - t0:.1f}s; frequent-category split:",
          flush=True)
    print(split.summary_table(), flush=True)
    return stats, split


def _log_stats_and_split(run_logger: Any, stats: Dict[str, Any], split: Any, job_dir: str) -> None:
    """Writes stats.json, split.json and the frequency chart under ``job_dir`` and logs them to the run."""
    from rayemb.data.stats import plot_frequencies, write_stats_json

    run_logger.log_artifact(write_stats_json(stats, os.path.join(job_dir, "stats.json")))
    split_path = os.path.join(job_dir, "split.json")
    with open(split_path, "w") as f:
        f.write(_json(split.to_dict()))
    run_logger.log_artifact(split_path)
    for name, t in split.tables.items():
        run_logger.log_metrics({f"split.hot_rows.{name}": float(t.num_hot), f"split.hot_share.{name}": t.hot_share},
                               step=0)
    try:
        run_logger.log_artifact(plot_frequencies(stats, os.path.join(job_dir, "frequencies.png")), "charts")
    except Exception as e:  # a chart never fails a job
        logger.warning("could not plot frequencies: %s", e)


def _log_plan(run_logger: Any, summary: Dict[str, Any], job_dir: str) -> None:
    """plan.json, the plan's per-rank chart, and its headline numbers as metrics."""
    from rayemb.planner import load_plan_json, plot_plan

    path = os.path.join(job_dir, "plan.json")
    with open(path, "w") as f:
        f.write(_json(summary))
    run_logger.log_artifact(path)
    run_logger.log_metrics({"plan.predicted_bytes_per_step": float(summary["predicted_bytes_per_step"])}, step=0)
    try:
        run_logger.log_artifact(plot_plan(load_plan_json(path), os.path.join(job_dir, "plan.png")), "charts")
    except Exception as e:  # a chart never fails a job
        logger.warning("could not draw the plan chart: %s", e)


def _log_charts(run_logger: Any, reports: List[Dict[str, Any]], job_dir: str) -> None:
    """Loss/AUC curves and peak memory per rank, as PNGs under ``job_dir`` and in the run's charts/."""
    from rayemb.tracking.callback import numeric_metrics
    from rayemb.tracking.plots import plot_memory_per_rank, plot_training_curves

    history: Dict[str, List[Any]] = {}
    for r in reports:
        for k, v in numeric_metrics(r).items():
            history.setdefault(k, []).append((r.get("step", 0), v))
    try:
        curves = plot_training_curves(history, os.path.join(job_dir, "training_curves.png"), metrics=("loss", "auc"))
        run_logger.log_artifact(curves, "charts")
        peaks = [r for r in reports if any(k.startswith("peak_memory_bytes.") for k in r)]
        if peaks:
            last = peaks[-1]
            ranks = sorted((int(k.rsplit("rank", 1)[1]), v) for k, v in last.items() if k.startswith("peak_memory_bytes."))
            mem = plot_memory_per_rank([v for _, v in ranks], os.path.join(job_dir, "memory_per_rank.png"))
            run_logger.log_artifact(mem, "charts")
    except Exception as e:  # a chart never fails a job
        logger.warning("could not draw training charts: %s", e)


def _plan_remote(cfg_dict: Dict[str, Any], schema_dict: Dict[str, Any], stats: Dict[str, Any], split: Any,
                 topology: Any):
    from rayemb.config import config_from_dict
    from rayemb.logs import quiet_third_party_logs
    from rayemb.train.sharding import make_job_plan

    quiet_third_party_logs()
    return make_job_plan(config_from_dict(cfg_dict), DatasetSchema.from_dict(schema_dict), stats, split, topology)


def _fault_injection() -> Optional[Dict[str, Any]]:
    """``$RAYEMB_FAULT_INJECTION=STEP:MARKER_FILE``: a worker fails once at STEP (tests of failure recovery)."""
    spec = os.environ.get(FAULT_INJECTION_ENV_VAR)
    if not spec:
        return None
    step, marker = spec.split(":", 1)
    return {"step": int(step), "marker": marker}


def _check_resume(cfg: JobConfig, fingerprint: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(directory, meta) of ``train.resume_from`` after checking it fits this job; None when not resuming."""
    if not cfg.train.resume_from:
        return None
    from rayemb.train.checkpoint import check_checkpoint_dir

    directory = resolve_path(cfg.train.resume_from)
    meta = check_checkpoint_dir(directory, cfg.scaling.num_workers, fingerprint)
    if int(meta.get("epoch", -1)) + 1 >= cfg.train.epochs:
        raise DataError(
            f"Checkpoint {directory!r} (train.resume_from) already holds epoch {int(meta['epoch']) + 1} of "
            f"train.epochs={cfg.train.epochs}: nothing is left to train. Raise train.epochs (e.g. "
            f"--set train.epochs={int(meta['epoch']) + 2}).", category="bad_checkpoint")
    return directory, meta


def _fingerprint(summary: Dict[str, Any]) -> str:
    import hashlib

    return hashlib.sha1(_json(summary).encode()).hexdigest()[:12]


def run_training(cfg: JobConfig, parent_run_id: Optional[str] = None) -> TrainResult:
    """Runs one training job on the current (or a new local) Ray cluster; returns when it ends."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Queue

    from rayemb.tracking.callback import QueueDrainer, ReportForwarder
    from rayemb.tracking.mlflow import RunLogger, default_tracking_uri, ensure_store, standard_tags
    from rayemb.train.loop import train_loop_per_worker
    from rayemb.train.progress import ProgressPrinter

    t0 = time.monotonic()
    data_dir = resolve_path(cfg.data.path)
    out_dir = resolve_path(cfg.tracking.output_dir)
    schema = load_checked(data_dir)
    parse_pins(pins_of(cfg, schema.sparse_names), schema.sparse_names)  # bad pins fail before any work
    print(f"rayemb: data {data_dir} ({len(schema.sparse)} sparse tables), outputs {out_dir}", flush=True)

    init_ray()
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    train_ds = ray.data.read_parquet(parquet_files(data_dir, TRAIN_SPLIT))
    valid_ds = ray.data.read_parquet(parquet_files(data_dir, VALID_SPLIT))
    train_rows, valid_rows = count_rows(data_dir, TRAIN_SPLIT), count_rows(data_dir, VALID_SPLIT)  # footers only
    world = cfg.scaling.num_workers
    steps = _steps(train_rows, cfg, TRAIN_SPLIT, data_dir)
    _steps(valid_rows, cfg, VALID_SPLIT, data_dir)
    if cfg.train.max_steps_per_epoch is not None:
        steps = min(steps, cfg.train.max_steps_per_epoch)
    compute_device = "cuda" if cfg.scaling.use_gpu else "cpu"
    cpus = _cpus_per_worker(cfg)

    topology = job_topology(cfg)
    stats, split = _stats_and_split(cfg, schema, data_dir, topology)
    try:
        job_plan = ray.get(
            ray.remote(num_cpus=0)(_plan_remote).remote(cfg.to_dict(), schema.to_dict(), stats, split, topology)
        )
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, RayembError):  # show the planner's own message, not the remote traceback
            raise e.cause from None
        raise
    plan_summary = job_plan.summary
    fingerprint = _fingerprint(plan_summary)
    placements = {name: t["placement"] for name, t in plan_summary["tables"].items()}
    print(f"rayemb: plan {fingerprint}: " + ", ".join(
        f"{p} x{list(placements.values()).count(p)}" for p in sorted(set(placements.values()))), flush=True)
    print(f"rayemb: {world} workers x {cpus} CPU, {steps} steps/epoch, predicted "
          f"{plan_summary['predicted_bytes_per_step'] / 1e6:.2f} MB/step", flush=True)
    resume_from = _check_resume(cfg, fingerprint)

    job_id = f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    job_dir = os.path.join(out_dir, "jobs", job_id)  # this job's local copies of what it logs
    os.makedirs(job_dir, exist_ok=True)
    tracking_uri = cfg.tracking.tracking_uri or default_tracking_uri(out_dir)
    ensure_store(tracking_uri)
    tags = {
        **standard_tags(),
        "rayemb.cluster_shape": f"{topology.num_nodes} nodes x {topology.devices_per_node} {compute_device} ranks",
        "rayemb.plan_fingerprint": fingerprint,
        "rayemb.job_name": cfg.name,
    }
    run_logger = RunLogger(
        tracking_uri, cfg.tracking.experiment, run_name=cfg.tracking.run_name or cfg.name,
        tags=tags, parent_run_id=parent_run_id, spill_dir=os.path.join(out_dir, "mlflow-spill"),
    ).start()
    print(f"rayemb: MLflow run {run_logger.run_id or '(pending)'} in experiment {cfg.tracking.experiment!r} at "
          f"{redact_uri(tracking_uri)}", flush=True)
    run_logger.log_params({**cfg.flatten(), "data.train_rows": train_rows, "data.valid_rows": valid_rows,
                           "scaling.cpus_per_worker_resolved": cpus, "train.steps_per_epoch": steps})
    run_logger.log_text(cfg.to_yaml(), "config.yaml")
    _log_plan(run_logger, plan_summary, job_dir)
    _log_stats_and_split(run_logger, stats, split, job_dir)

    queue = Queue(actor_options={"num_cpus": 0})
    first_epoch = int(resume_from[1]["epoch"]) + 1 if resume_from else 0
    progress = ProgressPrinter(cfg.train.epochs, steps, cfg.data.batch_size * world)
    drainer = QueueDrainer(queue, run_logger, progress=progress).start()
    print(f"rayemb: training epochs {first_epoch + 1}..{cfg.train.epochs} ({steps} steps each)"
          + (f", resuming from {resume_from[0]}" if resume_from else ""), flush=True)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"job": cfg.to_dict(), "schema": schema.to_dict(), "plan": job_plan, "steps_per_epoch": steps,
                           "metrics_queue": queue, "fault_injection": _fault_injection(),
                           "plan_fingerprint": fingerprint, "resume_from": resume_from[0] if resume_from else None},
        torch_config=TorchConfig(backend="nccl" if cfg.scaling.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=world, use_gpu=cfg.scaling.use_gpu, resources_per_worker={"CPU": cpus}
        ),
        run_config=RunConfig(
            name=job_id,
            storage_path=os.path.join(out_dir, "ray_results"),
            callbacks=[ReportForwarder(queue)],
            failure_config=FailureConfig(max_failures=cfg.scaling.max_failures),
            # the best epoch by validation AUC is kept, and the latest (Ray never deletes it) to resume from
            checkpoint_config=CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="valid_auc",
                                               checkpoint_score_order="max"),
        ),
        datasets={"train": train_ds, "valid": valid_ds},
    )
    status, reason, best_checkpoint = "FAILED", None, None
    try:
        result = trainer.fit()
        status = "FINISHED"
        if result.best_checkpoints:
            best_checkpoint = result.best_checkpoints[0][0].path
    except KeyboardInterrupt:
        reason = "interrupted (KeyboardInterrupt)"
        raise
    except Exception as e:  # Ray wraps worker errors; surface the root cause in one paragraph
        user_error = find_user_error(e)
        if user_error is not None:  # bad input found by a worker (data, diverging learning rate, checkpoint)
            reason = user_error.message
            raise user_error from None
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
        raise TrainingError(
            f"Training job {cfg.name!r} failed: {reason}. The MLflow run is marked FAILED with this reason; "
            f"worker logs are in the Ray dashboard / job logs.",
            category="training_failed",
        ) from e
    finally:
        reports = drainer.stop()
        final = {}
        for r in reports:
            final.update({k: v for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
        if best_checkpoint:
            run_logger.set_tags({"rayemb.best_checkpoint": best_checkpoint})
        _log_charts(run_logger, reports, job_dir)
        run_logger.finish(status=status, reason=reason)
        try:
            ray.kill(queue.actor)
        except Exception:
            pass
    return TrainResult(
        run_id=run_logger.run_id, tracking_uri=tracking_uri, status=status, metrics=final,
        reports=reports, plan=plan_summary, wall_time_s=time.monotonic() - t0, best_checkpoint=best_checkpoint,
    )


def _json(d: Dict[str, Any]) -> str:
    import json

    return json.dumps(d, indent=2, sort_keys=True)
