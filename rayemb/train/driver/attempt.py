"""This driver's attempt of a named job (:mod:`rayemb.train.driver.job_record`): a new run, the next attempt of an
unfinished one and the checkpoint it continues from, or a finished run returned as it is."""

from __future__ import annotations

import dataclasses
from typing import Any

from rayemb.errors import DataError
from rayemb.logs import redact_uri
from rayemb.train.driver.job_types import JobInputs, TrainResult
from rayemb.train.driver.outputs import JobOutputs, tracking_uri as job_tracking_uri
from rayemb.train.worker.resume import check_resume_from


def claim_attempt(inputs: JobInputs, new_run: bool = False) -> JobInputs:
    """This driver's attempt of the job (:func:`rayemb.train.driver.job_record.claim`), and for a continued run the
    newest intact checkpoint of its own folder to resume from (its tables checked like ``--resume-from``)."""
    from rayemb.train.driver.job_record import claim

    cfg = inputs.cfg
    attempt = claim(cfg, inputs.schema, inputs.out_dir, new_run)
    inputs = dataclasses.replace(inputs, attempt=attempt)
    if attempt.finished is not None or not attempt.resuming:
        return inputs
    # only a continued run reads checkpoints (their reader loads torch.distributed.checkpoint: a second or more)
    from rayemb.checkpoint.meta import CheckpointMeta
    from rayemb.checkpoint.reader import checkpoints_newest_first, read_meta

    root = JobOutputs.of(inputs.out_dir, attempt.job_id).checkpoint_root
    resume = None
    for i, path in enumerate(checkpoints_newest_first(root) if _exists(root) else []):
        meta = read_meta(path)
        if i == 0 and meta is not None and CheckpointMeta.from_dict(meta).trained_all(cfg.train.epochs):
            return dataclasses.replace(inputs, attempt=_trained_already(inputs, path))
        try:
            resume = check_resume_from(cfg.replace(train=dataclasses.replace(cfg.train, resume_from=path)),
                                       inputs.schema)
            break
        except DataError as e:
            if e.category == "storage":
                raise
            print(f"rayemb: WARNING: {e.message}", flush=True)  # damaged, or nothing left to train: the one before
    where = (f"checkpoint {redact_uri(resume[0])} (epoch {resume[1].epoch + 1}, step {resume[1].step})"
             if resume else "the start (no intact checkpoint was written)")
    print(f"rayemb: job {cfg.name!r}: attempt {attempt.attempt} of run {attempt.job_id} continues from {where}",
          flush=True)
    return dataclasses.replace(inputs, resume=resume)


def _trained_already(inputs: JobInputs, checkpoint: str) -> Any:
    """A run whose driver stopped after its last epoch's checkpoint: nothing is left to train, so it ends
    FINISHED (record and MLflow run) with that checkpoint as its last."""
    from rayemb.train.driver.job_record import FINISHED, write_record

    attempt, rec = inputs.attempt, inputs.attempt.record
    print(f"rayemb: job {rec.name!r}: run {rec.job_id} trained all {inputs.cfg.train.epochs} epoch(s) before its "
          f"driver stopped (last checkpoint {redact_uri(checkpoint)}); marking it FINISHED", flush=True)
    if rec.run_id:
        try:
            from mlflow import MlflowClient

            uri = job_tracking_uri(inputs.cfg.tracking.tracking_uri, inputs.out_dir)
            MlflowClient(uri).set_terminated(rec.run_id, FINISHED)
        except Exception as e:  # noqa: BLE001 - the record says it; the MLflow run is only bookkeeping
            print(f"rayemb: WARNING: could not mark MLflow run {rec.run_id} FINISHED ({type(e).__name__})", flush=True)
    rec.status, rec.pid = FINISHED, 0
    rec.result = {"run_id": rec.run_id, "last_checkpoint": checkpoint, "metrics": {}}
    rec.attempts[-1]["ended"] = FINISHED
    write_record(inputs.out_dir, rec)
    return dataclasses.replace(attempt, finished=rec)


def _exists(path: str) -> bool:
    from rayemb import storage

    return storage.isdir(path)


def finished_result(inputs: JobInputs) -> TrainResult:
    """What a rerun of a finished job returns: the run as it ended, nothing trained."""
    from rayemb.train.driver.job_record import record_path

    rec, out_dir = inputs.attempt.finished, inputs.out_dir
    print(f"rayemb: job {rec.name!r} FINISHED already (run {rec.job_id}, MLflow run {rec.run_id}); its record is "
          f"{redact_uri(record_path(out_dir, rec.name))}. Nothing to train: --new-run starts another run "
          "(Python: fit(new_run=True)).", flush=True)
    r = rec.result
    return TrainResult(run_id=r.get("run_id", rec.run_id), tracking_uri=r.get("tracking_uri", ""), status="FINISHED",
                       metrics=dict(r.get("metrics", {})), best_checkpoint=r.get("best_checkpoint"),
                       last_checkpoint=r.get("last_checkpoint"))


__all__ = ["claim_attempt", "finished_result"]
