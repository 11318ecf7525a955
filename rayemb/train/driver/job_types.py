"""What each stage of a training job hands the next (:mod:`rayemb.train.driver.trainer` runs the stages)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from rayemb.checkpoint.meta import CheckpointMeta
from rayemb.config import JobConfig
from rayemb.data.schema import DatasetSchema
from rayemb.train.world_plan import WorldPlan

#: plan.json entries measured or predicted at job start, left out of the plan fingerprint
MEASURED_PLAN_KEYS = ("calibration", "predicted_step_time_s", "predicted_step_time_components_s",
                      "predicted_step_time_families_s",
                      "probed_step_time_s", "plan_probe")


@dataclass(frozen=True)
class JobInputs:
    """A job's checked inputs: nothing past this point can fail on the config or the dataset's files."""

    cfg: JobConfig
    data_dir: str
    out_dir: str
    schema: DatasetSchema
    train_rows: int
    valid_rows: int
    steps_per_epoch: int
    #: (directory, its meta) of train.resume_from, checked against the schema (None: not resuming)
    resume: Optional[Tuple[str, CheckpointMeta]] = None
    #: the model's factory and arguments (rayemb.contract.factory.ModelSpec)
    model: Any = None
    #: this driver's attempt of the named job (rayemb.train.driver.job_record.JobAttempt): a new run or a continued one
    attempt: Any = None

    @property
    def world_size(self) -> int:
        return self.cfg.scaling.num_workers


@dataclass(frozen=True)
class PlannedJob:
    stats: Any  # rayemb.data.stats_types.DatasetStats
    #: world size -> its WorldPlan (batch, topology, split, JobPlan): the planned world, and each smaller one an
    #: elastic job may restart at
    plans: Dict[int, WorldPlan]
    #: the planned world size (``scaling.num_workers``): its plan is the one logged (plan.json, split.json)
    world_size: int
    #: what shards the planned world's model (plan.json less what was measured on the way)
    fingerprint: str
    #: CPUs per worker, in-memory data, warnings (rayemb.train.driver.resources.WorkerResources)
    resources: Any = None
    #: (directory, its meta) of train.resume_from (JobInputs.resume)
    resume: Optional[Tuple[str, CheckpointMeta]] = None

    @property
    def world_plan(self) -> WorldPlan:
        """The plan of the planned world size."""
        return self.plans[self.world_size]

    @property
    def topology(self) -> Any:
        return self.world_plan.topology

    @property
    def split(self) -> Any:
        return self.world_plan.split

    @property
    def summary(self) -> Dict[str, Any]:
        return self.world_plan.job_plan.summary


@dataclass(frozen=True)
class Tracking:
    run_logger: Any  # rayemb.tracking.RunLogger, started
    tracking_uri: str
    job_id: str
    #: this job's local copies of what it logs
    job_dir: str
    #: where its files, checkpoints and local copies go (tracking.output_dir may be a URI)
    outputs: Any = None
    #: the thread drawing the plan's and the statistics' charts beside the workers' start (joined before the end)
    charts: Any = None


@dataclass
class TrainResult:
    run_id: Optional[str]
    tracking_uri: str
    status: str
    metrics: Dict[str, float] = field(default_factory=dict)
    reports: List[Dict[str, Any]] = field(default_factory=list)
    plan: Dict[str, Any] = field(default_factory=dict)
    wall_time_s: float = 0.0
    #: the retained checkpoint with the best validation AUC (an epoch end)
    best_checkpoint: Optional[str] = None
    #: the newest checkpoint (what --resume-from takes to continue this job)
    last_checkpoint: Optional[str] = None


__all__ = ["JobInputs", "PlannedJob", "Tracking", "TrainResult", "MEASURED_PLAN_KEYS"]
