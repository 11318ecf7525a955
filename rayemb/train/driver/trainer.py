"""The driver: a short pipeline of named stages, each taking and returning typed values.

::

    check_inputs(cfg)                      -> JobInputs    config, schema.yaml, every parquet footer, pins, steps,
                                                           the checkpoint to resume from
    compute_statistics(inputs)             -> DatasetStats one pass (Ray Data; a small split here);
                                                           labels, dense, ids checked
    plan_job(inputs, topology, stats)      -> PlannedJob   per world size its split and cost-model plan
                                                           (rayemb.train.world_plan; TorchRec loads here):
                                                           start_plan (the calibration), then finish_plan
    start_tracking(inputs, planned)        -> Tracking     the MLflow run, params, config, plan/stats artifacts
    train(inputs, start, plan, track)      -> TrainResult  Ray Train workers; the run ends FINISHED or FAILED

Ray Train's worker group takes seconds to start. A job whose plan measures nothing more on the cluster (no
calibration, or a kept one) launches it right after ``start_plan`` and makes the rest of its plan and its MLflow
run beside that start; the workers get their job when it is ready (:mod:`rayemb.train.driver.handoff`). Any
other job makes its plan first (its calibration and plan probe measured on a cluster no worker holds yet), and
only its MLflow run beside the start.

Everything that can fail because of user input is found by the first three
stages, before any output is written, and raises a
:class:`~rayemb.errors.RayembError` naming the input and the fix. Errors a
worker finds (a diverging loss, a checkpoint of another plan) come back as the
same errors and mark the MLflow run FAILED with the reason. The records the
stages hand on are :mod:`rayemb.train.driver.job_types`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from rayemb import storage
from rayemb._ray import env_default, init_ray
from rayemb.config import JobConfig, resolve_path
from rayemb.constants import TRAIN_SPLIT, VALID_SPLIT
from rayemb.data.schema import DatasetSchema, count_rows, load_checked, parquet_files
from rayemb.errors import DataError, TrainingError, find_user_error
from rayemb.logs import redact_uri
from rayemb.contract.factory import check_table_dims, model_spec, user_loss
from rayemb.planner.report import prediction_text
from rayemb.planner.step_time import prediction_kind
from rayemb.planner.topology import resize_topology
from rayemb.planner.pins import parse_pins
from rayemb.publish import resolve_dataset
from rayemb.train.driver.artifacts import log_charts, log_plan, log_stats_and_split, start_job_charts, to_json
from rayemb.train.worker.data_loader import split_steps
from rayemb.train.driver.results import best_and_last_checkpoint, step_time_check, step_time_line
from rayemb.train.driver.outputs import JobOutputs, check_output_dir, read_splits, tracking_uri as job_tracking_uri
from rayemb.train.calibration.plan_probe import placement_counts as _placement_counts
from rayemb.train.driver.resources import WorkerResources, worker_resources
from rayemb.train.calibration.store import (calibrate, kept_max_age_s, learn_ratio, probe_kept, skipped_because,
                                            with_learned_ratio)
from rayemb.train.worker.resume import check_resume_from, fault_injection
from rayemb.train.driver.job_types import MEASURED_PLAN_KEYS, JobInputs, PlannedJob, Tracking, TrainResult
from rayemb.train.worker.losses import check_tasks
from rayemb.train.sharding import pins_of


def run_training(cfg: JobConfig, parent_run_id: Optional[str] = None, model: Any = None,
                 new_run: bool = False, ray_options: Optional[Dict[str, Any]] = None) -> TrainResult:
    """Runs one training job on the current (or a new local) Ray cluster; returns when it ends.

    ``model``: a :class:`~rayemb.contract.factory.ModelSpec` (None: the config's ``model`` section names it).
    The job is ``cfg.name`` in its output folder: an unfinished run of it is continued, a finished one returned
    as it is, unless ``new_run`` (:mod:`rayemb.train.driver.job_record`). ``ray_options``: Ray Train
    ``RunConfig`` arguments the config cannot hold (``callbacks``, ``logging_config``), given as they are."""
    from rayemb.train.driver.attempt import claim_attempt, finished_result
    from rayemb.train.driver.job_record import Heartbeat
    from rayemb.train.driver.phases import JobPhases

    t0, phases = time.monotonic(), JobPhases()
    inputs = claim_attempt(check_inputs(cfg, model), new_run)
    if inputs.attempt.finished is not None:
        return finished_result(inputs)
    phases.mark("checks")
    init_ray()
    topology = job_topology(cfg)
    phases.mark("ray")
    stats = compute_statistics(inputs)
    # standardize's mean and std travel to the workers (and into checkpoints) on the schema
    inputs = dataclasses.replace(inputs, schema=dense_params(inputs.schema, stats, inputs.resume))
    phases.mark("statistics")
    start = start_plan(inputs, topology, stats)  # the calibration: kept, or measured before any worker starts
    phases.mark("plan")
    heartbeat = Heartbeat(inputs.out_dir, inputs.attempt)
    started, status, result = [], "FAILED", None

    def plan() -> PlannedJob:
        t = time.time()
        planned = finish_plan(start)
        phases.add("plan", time.time() - t)
        return planned

    def track(planned: PlannedJob, outputs: JobOutputs) -> Tracking:
        t = time.time()
        # the first output: from here a rerun of the job continues this run (nothing is written before)
        started.append(heartbeat.start())
        tracking = start_tracking(inputs, planned, parent_run_id, on_run=heartbeat.set_run_id, outputs=outputs)
        phases.add("tracking", time.time() - t)
        return tracking

    try:
        result = train(inputs, start, plan, track, phases, ray_options)
        result.wall_time_s = time.monotonic() - t0
        status = result.status
    finally:
        if started:
            heartbeat.stop(status, None if result is None else {
                "run_id": result.run_id, "metrics": result.metrics, "best_checkpoint": result.best_checkpoint,
                "last_checkpoint": result.last_checkpoint, "tracking_uri": redact_uri(result.tracking_uri)})
    return result


def dense_params(schema: DatasetSchema, stats: Any, resume: Any = None) -> DatasetSchema:
    """``schema`` with its ``standardize`` columns' mean and std: this statistics pass's, except that a job
    resuming from a checkpoint (``resume``: its (directory, :class:`~rayemb.checkpoint.meta.CheckpointMeta`))
    keeps the ones the checkpoint's model was trained with, which its weights are fitted to; a line names the
    columns where they differ from this pass."""
    from rayemb.data.transforms import STANDARDIZE, DenseTransform

    fresh = schema.with_dense_params(stats)
    recorded = (resume[1].dense_transforms if resume else None) or {}
    written = {c: DenseTransform.parse(c, recorded[c]) for c in schema.standardized if c in recorded}
    kept = {c: t for c, t in written.items() if t.kind == STANDARDIZE and t.mean is not None}
    changed = [c for c in kept if kept[c] != fresh.dense_transform_of(c)]
    if changed:
        print(f"rayemb: resuming with the checkpoint's dense transforms, not this statistics pass's, for "
              f"{len(changed)} column(s): " + "; ".join(
                  f"{c} {kept[c].describe()} (this pass: {fresh.dense_transform_of(c).describe()})"
                  for c in changed[:5]) + ("; ..." if len(changed) > 5 else ""), flush=True)
    return fresh.with_dense_transforms(kept)


# ---- STAGE 1: CHECK INPUTS (no Ray) ---- #


def check_inputs(cfg: JobConfig, model: Any = None) -> JobInputs:
    """The dataset's schema and every parquet footer, the pins, one global batch of train rows and a valid row,
    a given stats.json, and the checkpoint to resume from (its files, tables and dims)."""
    data_dir, out_dir = resolve_dataset(resolve_path(cfg.data.path)), resolve_path(cfg.tracking.output_dir)  # or URIs
    check_output_dir(out_dir)
    schema = load_checked(data_dir)
    if schema.raw_names and cfg.model.embedding_dtype != "fp32":  # slots are rows of fp32 FBGEMM tables
        raise DataError(f"{redact_uri(data_dir)}/schema.yaml declares raw ids (`ids: raw`) for {schema.raw_names[:5]}; "
                        f"raw-id tables are fp32 only, and model.embedding_dtype is {cfg.model.embedding_dtype}. Set "
                        "model.embedding_dtype: fp32, or encode those ids (drop `ids: raw`).",
                        category="invalid_schema")
    parse_pins(pins_of(cfg, schema.table_names, schema.raw_names), schema.table_names)
    check_table_dims(cfg.model, schema)
    train_rows, valid_rows = count_rows(data_dir, TRAIN_SPLIT), count_rows(data_dir, VALID_SPLIT)  # footers only
    steps = split_steps(train_rows, valid_rows, cfg, data_dir)
    if cfg.train.max_steps_per_epoch is not None:
        steps = min(steps, cfg.train.max_steps_per_epoch)
    from rayemb.data.stats_io import check_stats_file

    check_stats_file(resolve_path(cfg.data.stats_path) if cfg.data.stats_path else None)
    resume = check_resume_from(cfg, schema)
    model = model or model_spec(cfg.model)  # a factory of the user's: imported now, its errors before any work
    if model.loss is None and cfg.train.loss:
        model = dataclasses.replace(model, loss=user_loss(cfg.train.loss))
    from rayemb.train.driver.contract_check import check_factory_first

    check_factory_first(cfg, schema, model)  # built once on the meta device: a broken contract before any work
    check_tasks(schema.labels, cfg.train.task_weights, cfg.train.early_stopping_task)
    print(f"rayemb: data {redact_uri(data_dir)} ({len(schema.sparse)} sparse tables, {train_rows:,} train / "
          f"{valid_rows:,} valid rows), outputs {redact_uri(out_dir)}", flush=True)
    return JobInputs(cfg, data_dir, out_dir, schema, train_rows, valid_rows, steps, resume, model)


def job_topology(cfg: JobConfig) -> Any:
    """The topology of the shape the job asks for (``scaling``), on the live Ray cluster's nodes where they match.

    A GPU job on an autoscaling cluster whose GPU workers are not up yet plans for the GPUs it asked for
    (:func:`rayemb.planner.topology.job_topology_from_nodes`), not for the CPU head it found.
    """
    import ray

    from rayemb.planner.topology import job_topology_from_nodes

    s = cfg.scaling
    topo = job_topology_from_nodes(ray.nodes(), s.num_workers, s.use_gpu, gpus_per_node=s.gpus_per_node,
                                   hbm_gib=s.gpu_memory_gib, memory_per_worker_gib=s.memory_per_worker_gib)
    if s.use_gpu and not any(float(n.get("Resources", {}).get("GPU", 0)) >= 1 for n in ray.nodes() if n.get("Alive")):
        print(f"rayemb: no GPU node is up yet; planning for the requested {topo.num_nodes} node(s) x "
              f"{topo.devices_per_node} GPU(s) of {topo.hbm_bytes / 2**30:.0f} GiB (the autoscaler brings them)",
              flush=True)
    return topo


# ---- STAGE 2: STATISTICS ---- #


def compute_statistics(inputs: JobInputs) -> Any:
    """One statistics pass (or a matching stats.json) and the value checks; returns the DatasetStats, one entry per
    feature as ``rayemb stats`` writes them (a shared table's union is the split's: :func:`plan_job`).

    Bad labels, NaN dense values and (under ``data.id_policy: error``) out-of-range
    ids fail here, before any worker starts. The frequent-category split depends on the world size (and, across
    nodes, on the calibration): :func:`plan_job` makes one per world size.
    """
    from rayemb.data.checks import check_ids, check_values, dense_transform_warnings
    from rayemb.data.stats import compute_stats
    from rayemb import storage
    from rayemb.data.fingerprint import dataset_fingerprint
    from rayemb.data.stats_io import kept_stats_path, load_or_compute_stats

    cfg, data_dir, schema = inputs.cfg, inputs.data_dir, inputs.schema
    t0 = time.monotonic()
    # once per job: it lists and stats every file (a request each on an object store); the pass's stats carry it
    fingerprint = dataset_fingerprint(data_dir, TRAIN_SPLIT)
    stats_path = resolve_path(cfg.data.stats_path) if cfg.data.stats_path else None
    if stats_path is None:  # an earlier job's on these very files (its output folder keeps them)
        kept = kept_stats_path(inputs.out_dir, data_dir, fingerprint=fingerprint)
        stats_path = kept if storage.isfile(kept) else None
    print(f"rayemb: statistics pass over {redact_uri(data_dir)}/{TRAIN_SPLIT}"
          + (f" (or the kept {redact_uri(stats_path)} while it matches the files)" if stats_path else "") + " ...",
          flush=True)
    stats = load_or_compute_stats(data_dir, stats_path, progress=True, fingerprint=fingerprint)
    check_values(stats.values, schema.labels, f"{data_dir}/{TRAIN_SPLIT}", schema.regression_labels)
    check_ids(stats, schema, cfg.data.id_policy)
    for line in dense_transform_warnings(stats.values, schema):
        print(f"rayemb: warning: {line}", flush=True)
    valid_values = compute_stats(data_dir, split=VALID_SPLIT, tables=False).values
    check_values(valid_values, schema.labels, f"{data_dir}/{VALID_SPLIT}", schema.regression_labels)
    print(f"rayemb: statistics of {stats.rows:,} rows in {time.monotonic() - t0:.1f}s", flush=True)
    return stats


# ---- STAGE 3: PLAN ---- #


def plan_job(inputs: JobInputs, topology: Any, stats: Any) -> PlannedJob:
    """The plan of every world size the job may run at (:func:`~rayemb.train.world_plan.plan_world`): the
    planned one on ``topology``, and each smaller one of an elastic job, their cost-model plans of the real model
    made in this process."""
    return finish_plan(start_plan(inputs, topology, stats))


@dataclasses.dataclass(frozen=True)
class PlanStart:
    """What the plan stage measures on the cluster, before Ray Train's workers may take it (:func:`start_plan`)."""

    inputs: JobInputs
    topology: Any
    stats: Any
    resources: WorkerResources
    calibration: Any
    key_fields: Optional[Dict[str, Any]]
    learned: Any

    @property
    def measures_nothing_more(self) -> bool:
        """The rest of the plan (:func:`finish_plan`) starts no ranks of its own: no calibration (then no plan
        probe either), or one kept from an earlier job with a plan probe of its shape kept too (or no probe to
        run). A kept probe whose candidate plans differ after all runs beside the starting workers, and falls back
        to the model's plan if it cannot get their resources."""
        if self.calibration is None:
            return True
        if self.calibration.source != "cached":
            return False
        cfg, inputs = self.inputs.cfg, self.inputs
        if cfg.planner.probe_steps == 0 or cfg.model.sequence_tower != "none" or inputs.world_size <= 1 or \
                skipped_because(cfg, inputs.schema, inputs.world_size) is not None:
            return True
        # a probe on a cluster whose CPUs (or GPUs) the starting workers hold would wait for them
        return probe_kept(inputs.out_dir, self.key_fields or {}, kept_max_age_s(cfg))


def start_plan(inputs: JobInputs, topology: Any, stats: Any) -> PlanStart:
    """The workers' resources and the job's calibration (kept, or measured on the live cluster)."""
    cfg = inputs.cfg
    resources = worker_resources(cfg, inputs.schema, stats, inputs.train_rows, inputs.valid_rows)
    calibration, key_fields = calibrate(inputs, topology, resources)
    # earlier jobs' measured over predicted step on this key scale the prediction (planner.recalibrate: not)
    calibration, learned = with_learned_ratio(inputs.out_dir, key_fields, calibration, apply=kept_max_age_s(cfg) > 0)
    return PlanStart(inputs, topology, stats, resources, calibration, key_fields, learned)


def finish_plan(start: PlanStart) -> PlannedJob:
    """The plans of :func:`plan_job` from its measurements (:func:`start_plan`)."""
    from rayemb.train.world_plan import plan_world

    inputs, topology, stats, resources = start.inputs, start.topology, start.stats, start.resources
    calibration, key_fields, learned = start.calibration, start.key_fields, start.learned
    cfg = inputs.cfg

    def make_plan(config: JobConfig, split: Any, topo: Any) -> Any:
        # Here, not in a Ray task: the JobPlan holds TorchRec's ShardingPlan, so the driver loaded TorchRec anyway
        # when it received one, after a task worker had started and loaded it too (seconds of a warm job's plan).
        return _make_plan(cfg=config, schema=inputs.schema, stats=stats, split=split, topology=topo,
                          calibration=calibration, model=inputs.model)

    def make_shown_plan(config: JobConfig, split: Any, topo: Any) -> Any:
        """The planned world's plan, its split's table printed first (the elastic worlds' are not)."""
        print(f"rayemb: frequent-category split ({split.rule} threshold, W={split.world_size}, "
              f"B={split.global_batch_size}):\n{split.summary_table()}", flush=True)
        return make_plan(config, split, topo)

    # the split sees every lookup of a shared table (its features' ids together), each table at its own width; the
    # job keeps the per-feature counts: a retrieval loss's logQ is its item column's, not the table's union
    tables, dims = inputs.schema.table_stats(stats), inputs.schema.table_dims(cfg.model.embedding_dim)
    job = plan_world(cfg, topology, tables, calibration, plan_fn=make_shown_plan, table_dims=dims)
    why = skipped_because(cfg, inputs.schema, inputs.world_size)
    # measured at job start: the plan too, unless the pins leave nothing to choose (then only the link was measured)
    if calibration is not None and inputs.world_size > 1 and why is None:
        from rayemb.train.calibration.plan_probe import choose_by_probe

        kept = (inputs.out_dir, key_fields, kept_max_age_s(cfg))
        chosen = choose_by_probe(cfg, inputs.schema, job.job_plan, stats, job.split,
                                 functools.partial(make_plan, split=job.split, topo=topology), inputs.world_size,
                                 resources.cpus_per_worker, inputs.model, kept=kept)
        job = dataclasses.replace(job, job_plan=chosen)
    summary = job.job_plan.summary
    # what shards the model, not what was measured on the way (a resumed job calibrates again, or reuses a kept one)
    fingerprint = hashlib.sha1(to_json({k: v for k, v in summary.items() if k not in MEASURED_PLAN_KEYS})
                               .encode()).hexdigest()[:12]
    summary["prediction"] = prediction_kind(calibration)  # not the plan: left out of its fingerprint
    if learned:
        summary["learned_ratio"] = learned
    why = why or "the calibration failed"
    print(f"rayemb: plan {fingerprint}: " + ", ".join(f"{p} x{n}" for p, n in _placement_counts(summary).items())
          + f"; {prediction_text(summary, why)} ({summary['objective']} objective)"
          + (f", probed {1e3 * summary['probed_step_time_s']:.1f} ms" if "probed_step_time_s" in summary else "")
          + (" (the probed plans within the probe's noise: the model's choice)"
             if (summary.get("plan_probe") or {}).get("within_noise") else "")
          + (f", learned ratio {learned['applied']:.2f} of {learned['jobs']} earlier job(s) applied"
             if learned.get("applied") else "")
          + (", learned ratios " + ", ".join(f"{f} {r:.2f}" for f, r in learned["families"].items())
             + f" of {learned['pairs']} measured plan(s) applied" if learned.get("families") else ""), flush=True)
    plans = {inputs.world_size: job}
    for world in elastic_worlds(cfg):  # an elastic job restarts on fewer ranks: a plan (and hot set) for each
        plans[world] = plan_world(cfg, resize_topology(topology, world), tables, calibration, plan_fn=make_plan,
                                  table_dims=dims)
        plans[world].job_plan.summary["prediction"] = summary["prediction"]
        print(f"rayemb: elastic plan for {world} ranks: " + ", ".join(
            f"{p} x{n}" for p, n in _placement_counts(plans[world].job_plan.summary).items()), flush=True)
    return PlannedJob(stats, plans, inputs.world_size, fingerprint, resources, inputs.resume)


def elastic_worlds(cfg: JobConfig) -> List[int]:
    """World sizes besides ``num_workers`` an elastic job (``num_workers: [min, max]``) may run at."""
    low = cfg.scaling.min_workers or cfg.scaling.num_workers
    return list(range(low, cfg.scaling.num_workers))


def _make_plan(cfg: JobConfig, schema: DatasetSchema, stats: Any, split: Any, topology: Any, calibration: Any,
               model: Any = None):
    """The job's plan, and its model built once on the meta device: a factory that breaks the model contract
    fails here, before any worker starts (:func:`rayemb.contract.model.check_model`)."""
    import torch

    from rayemb.logs import quiet_third_party_logs
    from rayemb.train.sharding import build_model, make_job_plan
    from rayemb.train.worker.loop import early_stopping_metric
    from rayemb.train.worker.retrieval import item_feature_of

    quiet_third_party_logs()
    job_plan = make_job_plan(cfg, schema, stats, split, topology, calibration)
    meta = torch.device("meta")
    built, _, _ = build_model(cfg, schema, job_plan.placements, job_plan.hot_ids, meta, meta, model=model)
    # the metric early stopping follows must be one this model and schema report: said here, before any worker
    early_stopping_metric(cfg.train.early_stopping_metric, retrieval=item_feature_of(built) is not None,
                          grouped=schema.group is not None,
                          regression=schema.task_type(cfg.train.early_stopping_task or schema.label) == "regression")
    return job_plan


# ---- STAGE 4: TRACKING ---- #


def job_outputs(inputs: JobInputs) -> JobOutputs:
    """Where the job's files, checkpoints and Ray Train run go: its attempt's job id (else a new one)."""
    attempt = inputs.attempt
    return JobOutputs.of(inputs.out_dir, attempt.job_id if attempt is not None else
                         f"{inputs.cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")


def start_tracking(inputs: JobInputs, planned: PlannedJob, parent_run_id: Optional[str] = None,
                   on_run: Optional[Callable[[Optional[str]], None]] = None,
                   outputs: Optional[JobOutputs] = None) -> Tracking:
    """Creates the job's output folder and MLflow run, and logs params, config, plan, stats and split.

    A new run in a store that exists is created by the RunLogger's writer thread, beside the workers' start (MLflow's
    imports are a second or two of a fresh driver): what is logged meanwhile waits in its buffer. ``on_run`` gets
    the run id once the run exists (from that thread, then). ``outputs``: the job's (:func:`job_outputs`), when its
    workers were launched with them already."""
    from rayemb.tracking import RunLogger, ensure_store, standard_tags
    from rayemb.tracking.store import sqlite_path

    cfg, topology = inputs.cfg, planned.topology
    attempt = inputs.attempt
    outputs = outputs or job_outputs(inputs)
    job_id, job_dir = outputs.job_id, outputs.job_dir
    os.makedirs(job_dir, exist_ok=True)
    tracking_uri = job_tracking_uri(cfg.tracking.tracking_uri, inputs.out_dir)
    db = sqlite_path(tracking_uri)
    # a store to create, or a run to continue (its params decide what is logged): here, before the workers start
    here = (db is not None and not os.path.exists(db)) or (attempt is not None and attempt.run_id is not None)
    if here:
        ensure_store(tracking_uri)
    device = "cuda" if cfg.scaling.use_gpu else "cpu"
    tags = {
        **standard_tags(),
        "rayemb.cluster_shape": f"{topology.num_nodes} nodes x {topology.devices_per_node} {device} ranks",
        "rayemb.plan_fingerprint": planned.fingerprint,
        "rayemb.job_name": cfg.name,
    }
    run_logger = RunLogger(
        tracking_uri, cfg.tracking.experiment, run_name=cfg.tracking.run_name or cfg.name,
        tags=tags, parent_run_id=parent_run_id, spill_dir=outputs.spill_dir,
        resume_run_id=attempt.run_id if attempt is not None else None,
    ).start(connect=here)
    continued = run_logger.resumed_at_step is not None

    def announce() -> None:
        run_id = run_logger.run_id if here else run_logger.wait_for_run()
        print(f"rayemb: MLflow run {run_id or '(pending)'} in experiment {cfg.tracking.experiment!r} at "
              f"{redact_uri(tracking_uri)}" + (f" (continued after step {run_logger.resumed_at_step})" if continued
                                               else ""), flush=True)
        if on_run is not None:
            on_run(run_id)

    if here:
        announce()
    else:
        threading.Thread(target=announce, name="rayemb-mlflow-run", daemon=True).start()
    if attempt is not None:
        run_logger.set_tags({"rayemb.attempt": attempt.attempt})
        # at the step it trains from: its checkpoint's
        run_logger.log_metrics({"attempt": attempt.attempt}, step=inputs.resume[1].step if inputs.resume and
                               attempt.resuming else 0)
    if continued:  # its params are logged (MLflow refuses a changed value); what this attempt ran with, beside them
        run_logger.log_text(cfg.to_yaml(), f"config.attempt-{attempt.attempt}.yaml")
    else:
        _log_run_params(run_logger, inputs, planned)
    log_plan(run_logger, planned.summary, job_dir, chart=False)
    log_stats_and_split(run_logger, planned.stats, planned.split, job_dir, chart=False)
    if not inputs.cfg.data.stats_path:  # the next job on the same files skips the statistics pass
        from rayemb.data.stats_io import keep_stats

        keep_stats(planned.stats, inputs.out_dir, inputs.data_dir)
    outputs.publish()  # plan.json, stats.json, split.json next to the checkpoints (remote output_dir); charts at the end
    return Tracking(run_logger, tracking_uri, job_id, job_dir, outputs,
                    charts=start_job_charts(run_logger, planned.stats, job_dir))


def _log_run_params(run_logger: Any, inputs: JobInputs, planned: PlannedJob) -> None:
    cfg = inputs.cfg
    run_logger.log_params({**cfg.flatten(), "data.train_rows": inputs.train_rows, "data.valid_rows": inputs.valid_rows,
                           "scaling.cpus_per_worker_resolved": planned.resources.cpus_per_worker,
                           "data.in_memory_resolved": planned.resources.in_memory,
                           "train.steps_per_epoch": inputs.steps_per_epoch})
    run_logger.log_text(cfg.to_yaml(), "config.yaml")


# ---- STAGE 5: TRAIN ---- #


def train(inputs: JobInputs, start: PlanStart, plan: Callable[[], PlannedJob],
          track: Callable[[PlannedJob, JobOutputs], Tracking], phases: Any = None,
          ray_options: Optional[Dict[str, Any]] = None) -> TrainResult:
    """Ray Train workers train the planned model; every report reaches MLflow; the run ends FINISHED or FAILED.

    ``plan`` makes the plan from ``start`` (:func:`finish_plan`), ``track`` the job's MLflow run
    (:func:`start_tracking`). Both run beside the worker group's start when the plan measures nothing more on the
    cluster (:attr:`PlanStart.measures_nothing_more`; the workers get their job when it is ready:
    :mod:`rayemb.train.driver.handoff`), else the plan is made first and only the run beside the start. An error of
    either is raised as it is, after the launched workers ended without training; nothing of the job is left in
    Ray Train's storage when the plan failed.
    ``phases``: the job's :class:`~rayemb.train.driver.phases.JobPhases` (its line printed and logged at the end).
    ``ray_options["on_report"]``: called in the driver with every report after MLflow has it (a sweep's trial)."""
    import ray
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rayemb.tracking.callback import QueueDrainer
    from rayemb.train.driver.handoff import JobHandoff
    from rayemb.train.driver.progress import ProgressPrinter

    cfg = inputs.cfg
    steps, world = inputs.steps_per_epoch, inputs.world_size
    resources = start.resources
    # measured before Ray Train's workers take the cluster's CPUs: a calibration or probe beside them would be
    # skewed by their start, or wait for their resources
    planned_first = None if start.measures_nothing_more else plan()
    outputs = job_outputs(inputs)
    # On the driver's node: a queue on a worker node would die with it, and every report after that with it
    # (seen when an elastic job lost a node: it finished with no epoch report).
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
    ray_options = dict(ray_options or {})
    on_report = ray_options.pop("on_report", None)
    splits = _splits(inputs, resources)
    handoff = JobHandoff()
    ready: Dict[str, Any] = {}

    def prepare() -> None:
        """The plan (unless made), the MLflow run and its drainer; then the workers' job (None on an error)."""
        job = None
        try:
            planned = planned_first or plan()
            ready["planned"] = planned
            tracking = ready["tracking"] = track(planned, outputs)
            print(f"rayemb: {world} workers x {resources.cpus_per_worker:g} CPU, {steps} steps/epoch, predicted "
                  f"{planned.summary['predicted_bytes_per_step'] / 1e6:.2f} MB/step; data "
                  + (f"held in worker memory (~{resources.shard_bytes / 2**20:,.0f} MiB per rank)"
                     if resources.in_memory else "streamed from Ray Data"), flush=True)
            for warning in resources.warnings:
                print(f"rayemb: WARNING: {warning}", flush=True)
            first_epoch = planned.resume[1].next_epoch if planned.resume else 0
            print(f"rayemb: training epochs {first_epoch + 1}..{cfg.train.epochs} ({steps} steps each)"
                  + (f", resuming from {redact_uri(planned.resume[0])}" if planned.resume else ""), flush=True)
            progress = ProgressPrinter(cfg.train.epochs, steps, planned.world_plan.batch.global_size)
            run_logger = tracking.run_logger
            # a continued run: the points its dead attempt logged after the checkpoint are not logged twice
            ready["drainer"] = QueueDrainer(queue, run_logger, progress=progress, after_step=run_logger.resumed_at_step,
                                            on_report=on_report).start()
            job = _worker_job(inputs, planned, outputs, queue, resources, splits)
        except BaseException as e:  # noqa: BLE001 - raised by the driver's thread once the workers ended
            ready["error"] = e
        finally:
            try:
                handoff.hand(job)
            except BaseException as e:  # noqa: BLE001 - the workers then fail, and the driver says why
                ready.setdefault("error", e)

    preparing = threading.Thread(target=prepare, name="rayemb-plan-and-run", daemon=True)
    status, reason, best_checkpoint, last_checkpoint, result = "FAILED", None, None, None, None
    existed = storage.exists(outputs.checkpoint_root)
    try:
        preparing.start()
        if phases is not None:
            phases.launch()
        with _report_poll_interval():
            result = _ray_trainer(inputs, outputs, handoff.ref, queue, resources, splits, ray_options).fit()
        preparing.join()
        if "error" in ready:
            raise ready["error"]
        status = "FINISHED"
        best_checkpoint, last_checkpoint = map(outputs.checkpoint_uri, best_and_last_checkpoint(result))
    except KeyboardInterrupt:
        reason = "interrupted (KeyboardInterrupt)"
        raise
    except Exception as e:  # Ray wraps worker errors; surface the root cause in one paragraph
        preparing.join()
        if "error" in ready:  # the plan or the run failed: the workers ended without training
            if e is not ready["error"]:
                raise ready["error"] from None
            raise
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
        preparing.join()
        handoff.close()
        if "tracking" not in ready:
            if "planned" not in ready and not existed:  # nothing of the job is written before its plan
                _remove_tree(outputs.checkpoint_root)
        else:
            final, reports = _finish_run(inputs, ready["planned"], ready["tracking"], ready.get("drainer"), phases,
                                         status, reason, best_checkpoint, last_checkpoint)
        try:
            ray.kill(queue.actor)
        except Exception:
            pass
    planned, tracking = ready["planned"], ready["tracking"]
    return TrainResult(run_id=tracking.run_logger.run_id, tracking_uri=tracking.tracking_uri, status=status,
                       metrics=final, reports=reports, plan=planned.summary, best_checkpoint=best_checkpoint,
                       last_checkpoint=last_checkpoint)


def _remove_tree(path: str) -> None:
    """Removes ``path`` (a folder or a URI's prefix), quietly: what Ray Train began there for a job that failed."""
    try:
        fs, where = storage.filesystem(path)
        fs.delete_dir(where)
    except Exception:  # noqa: BLE001 - not there (Ray Train wrote nothing yet), or not ours to fail on
        pass


def _finish_run(inputs: JobInputs, planned: PlannedJob, tracking: Tracking, drainer: Any, phases: Any, status: str,
                reason: Optional[str], best_checkpoint: Optional[str], last_checkpoint: Optional[str]
                ) -> Tuple[Dict[str, float], List[Dict[str, Any]]]:
    """The run's last metrics, tags and files; the run ended ``status``. Returns (its final metrics, the reports)."""
    run_logger = tracking.run_logger
    reports = drainer.stop() if drainer is not None else []
    final: Dict[str, float] = {}
    for r in reports:
        final.update({k: v for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    uncalibrated = planned.summary.get("prediction") == "uncalibrated"
    final.update(step_time_check(reports, planned.summary.get("predicted_step_time_s"),
                                 planned.summary.get("probed_step_time_s"), uncalibrated=uncalibrated))
    if planned.summary.get("prediction"):
        run_logger.set_tags({"rayemb.prediction": planned.summary["prediction"]})
    if planned.summary.get("learned_ratio"):
        try:  # the next job on this key predicts with it (the probe's plans too, without a measured step)
            learn_ratio(inputs.out_dir, planned.summary, final.get("step_time_measured_s"))
        except Exception as e:  # noqa: BLE001 - the job's own result stands
            print(f"rayemb: WARNING: could not keep the learned step ratio ({type(e).__name__}: {e})", flush=True)
    if "step_time_measured_s" in final:
        run_logger.log_metrics({k: v for k, v in final.items() if k.startswith("step_time_")
                                and k != "step_time_s"}, step=0)
        print(step_time_line(final), flush=True)
    if phases is not None:
        final.update(phases.report(reports, run_logger))
    if best_checkpoint:
        run_logger.set_tags({"rayemb.best_checkpoint": best_checkpoint})
    if last_checkpoint:
        run_logger.set_tags({"rayemb.last_checkpoint": last_checkpoint})
    if tracking.charts is not None:  # pyplot is one figure state: one thread draws at a time
        tracking.charts.join()
    log_charts(run_logger, reports, tracking.job_dir)
    tracking.outputs.publish(final=True)
    run_logger.finish(status=status, reason=reason)
    return final, reports


#: Ray Train's controller takes a worker's ``ray.train.report`` when it next polls the workers (every
#: ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s by default), and a rank's next report waits until it has: each
#: checkpoint after the first stalled training for up to that long. rayemb's controller polls this often,
#: unless the variable is set (docs/checkpoints.md).
REPORT_POLL_INTERVAL_S = "0.2"
_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


def _report_poll_interval() -> Any:
    """Ray Train's poll interval for the ``fit()`` in the block (a user's own value kept)."""
    return env_default(_POLL_ENV, REPORT_POLL_INTERVAL_S)


def ray_train_configs(cfg: JobConfig, world_size: int, cpus_per_worker: float, storage: Dict[str, Any],
                      job_id: str, forwarder: Any, ray_options: Optional[Dict[str, Any]] = None) -> Any:
    """(ScalingConfig, RunConfig) of the job's Ray Train run: ``forwarder`` (the callback that hands reports to the
    driver) first among the callbacks, then the caller's (``ray_options``)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    options = dict(ray_options or {})
    scaling = ScalingConfig(num_workers=(cfg.scaling.min_workers, world_size) if cfg.scaling.min_workers else world_size,
                            use_gpu=cfg.scaling.use_gpu, resources_per_worker={"CPU": cpus_per_worker},
                            placement_strategy=cfg.scaling.placement_strategy,
                            accelerator_type=cfg.scaling.accelerator_type)
    run = RunConfig(
        name=job_id,
        **storage,  # a local path, or a URI's pyarrow filesystem and path
        callbacks=[forwarder, *options.pop("callbacks", [])],
        failure_config=FailureConfig(max_failures=cfg.scaling.max_failures),
        # the newest few: a corrupt newest one falls back to the one before (rayemb.train.worker.resume)
        checkpoint_config=CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints),
        **options,
    )
    return scaling, run


def _splits(inputs: JobInputs, resources: WorkerResources) -> Dict[str, Any]:
    """The job's splits: small ones held in the object store, in-memory ones read by each rank, else Ray Datasets."""
    import ray

    ray.data.DataContext.get_current().enable_progress_bars = False
    data_dir = inputs.data_dir
    return read_splits(parquet_files(data_dir, TRAIN_SPLIT), parquet_files(data_dir, VALID_SPLIT),
                       rows={"train": inputs.train_rows, "valid": inputs.valid_rows}, in_memory=resources.in_memory)


def _held(splits: Dict[str, Any]) -> Dict[str, Any]:
    from rayemb.train.held_splits import FileSplit, HeldSplit

    # small ones in the object store, in-memory ones read by each rank: neither is a Ray Dataset
    return {name: s for name, s in splits.items() if isinstance(s, (HeldSplit, FileSplit))}


def _worker_job(inputs: JobInputs, planned: PlannedJob, outputs: JobOutputs, queue: Any,
                resources: WorkerResources, splits: Dict[str, Any]) -> Any:
    """What every worker gets (:class:`~rayemb.train.worker_job.WorkerJob`); the plans and the model by reference."""
    import ray

    from rayemb.train.worker_job import WorkerJob

    return WorkerJob(
        cfg=inputs.cfg, schema=inputs.schema, plans=ray.put(planned.plans),
        model=ray.put(inputs.model) if inputs.model is not None else None, train_rows=inputs.train_rows,
        plan_fingerprint=planned.fingerprint, checkpoint_root=outputs.checkpoint_root,
        resume_from=planned.resume[0] if planned.resume else None, in_memory=resources.in_memory,
        cpus_per_worker=resources.cpus_per_worker, held_splits=_held(splits), table_stats=dict(planned.stats.tables),
        metrics_queue=queue, fault_injection=fault_injection())


def _ray_trainer(inputs: JobInputs, outputs: JobOutputs, job_ref: Any, queue: Any, resources: WorkerResources,
                 splits: Dict[str, Any], ray_options: Optional[Dict[str, Any]] = None) -> Any:
    """The job's TorchTrainer; its loop gets ``job_ref``, which resolves to the WorkerJob once it is handed over."""
    from ray.train.torch import TorchTrainer

    from rayemb.train.worker.backend import RayembTorchConfig
    from rayemb.tracking.callback import ReportForwarder
    from rayemb.train.worker.loop import worker_loop
    from rayemb.train.worker.validation import ValidationDataConfig

    cfg = inputs.cfg
    held = _held(splits)
    scaling, run = ray_train_configs(cfg, inputs.world_size, resources.cpus_per_worker, outputs.run_config_storage(),
                                     outputs.job_id, ReportForwarder(queue), ray_options)
    return TorchTrainer(
        # one typed object, by reference: Ray Train's controller never loads it (rayemb.train.worker_job)
        functools.partial(worker_loop, job_ref),
        torch_config=RayembTorchConfig(backend="nccl" if cfg.scaling.use_gpu else "gloo"),
        scaling_config=scaling,
        run_config=run,
        datasets={name: s for name, s in splits.items() if name not in held},
        dataset_config=ValidationDataConfig(),  # the valid split is split without dropping a row
    )


__all__ = ["run_training", "check_inputs", "compute_statistics", "plan_job", "start_plan", "finish_plan", "PlanStart",
           "start_tracking", "train",
           "JobInputs", "PlannedJob", "Tracking", "TrainResult", "job_topology"]
