"""Job configuration: frozen dataclasses validated in ``__post_init__``.

YAML is read only at the edge (``load_config``); ``--set a.b=c`` overrides are
applied to the YAML mapping before validation, with the value parsed as YAML
(``--set train.epochs=3``, ``--set model.bottom_mlp=[64,16]``).

Example::

    >>> cfg = load_config("jobs/configs/synth_small.yaml", ["train.epochs=2"])
    >>> cfg.train.epochs
    2
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from rayemb import storage
from rayemb.constants import DEFAULT_LOG_EVERY_N_STEPS, IN_MEMORY_MAX_BYTES_PER_RANK, WORKSPACE_ENV_VAR
from rayemb.embedding.qcomm import COMM_PRECISIONS, DIRECTIONS as COMM_DIRECTIONS
from rayemb.errors import ConfigError
from rayemb.units import flatten

ID_POLICIES = ("error", "hash", "clip")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_SPREAD")
EMBEDDING_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd", "adam", "rowwise_adam")
#: model.embedding_dtype -> bytes per stored table element (what the planner's memory estimates count)
EMBEDDING_DTYPE_BYTES = {"fp32": 4, "fp16": 2}
#: train.compile: none, or torch.compile of the model's dense part (rayemb.train.worker.compile)
COMPILE_CHOICES = ("none", "dense")
#: train.compile_mode: torch.compile's modes (reduce-overhead: CUDA graphs on a CUDA device)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
#: model.sequence_tower: ignore the sequence features, their masked mean, or DIN-style attention
SEQUENCE_TOWERS = ("none", "mean", "attention")
#: train.precision: the dense part's arithmetic in the training step
PRECISIONS = ("fp32", "bf16")
#: train.dense_optimizer: the dense part's optimizer (rayemb.train.worker.optim.dense_optimizer)
DENSE_OPTIMIZERS = ("adagrad", "adam", "adamw", "sgd")
#: train.lr_schedule.kind: how the learning rates follow the global step (rayemb.train.worker.schedule)
LR_SCHEDULES = ("constant", "cosine", "linear", "step")
#: the validation metrics early stopping and the best checkpoint may follow (directions:
#: rayemb.train.worker.metrics.METRIC_GOALS); a retrieval model reports the hit rates, a ranking model the rest
EARLY_STOPPING_METRICS = ("valid_auc", "valid_gauc", "valid_logloss", "valid_ne", "valid_calibration",
                          "valid_rmse", "valid_mae", "valid_hit_rate_at_10", "valid_hit_rate_at_50",
                          "valid_hit_rate_at_100")
#: train.regression_loss: the loss of a regression task (schema.yaml ``task_types``) on the model's raw output
REGRESSION_LOSSES = ("mse", "huber")
#: train.lr_schedule: every key and its default (a key left out takes it)
LR_SCHEDULE_DEFAULTS: Dict[str, Any] = {"kind": "constant", "warmup_steps": 0, "min_lr_ratio": 0.0,
                                        "step_size": 1, "gamma": 1.0}


def _require(ok: bool, where: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(f"Invalid config value {where}: {problem}. {fix}")


def _require_openable(path: Optional[str], where: str) -> None:
    """A path setting is a plain path or a URI of a scheme :mod:`rayemb.storage` opens (s3://, gs://, hdfs://...)."""
    s = storage.scheme(path) if path else ""
    _require(not s or s == "file" or s in storage.REMOTE_SCHEMES, where, f"the scheme {s}:// is not supported",
             "Use a local path or a URI of " + ", ".join(f"{x}://" for x in ("file",) + storage.REMOTE_SCHEMES)
             + " (credentials come from the environment, see docs/storage.md).")


@dataclass(frozen=True)
class DataConfig:
    #: dataset directory with schema.yaml, train/ and valid/ (relative paths: see ``resolve_path``; or a URI
    #: such as s3://bucket/data, see docs/storage.md)
    path: str
    #: rows per rank per step; the global batch is ``batch_size * num_workers``
    batch_size: int = 1024
    #: what to do with ids outside ``[0, num_embeddings)``: fail, hash (mod V) or clip
    id_policy: str = "error"
    #: a stats.json from `rayemb stats` to reuse when its dataset fingerprint matches (else recomputed)
    stats_path: Optional[str] = None
    #: hold each rank's converted shard in memory after the first pass (true/false; null: when its estimate fits
    #: ``data.in_memory_max_gib``); later epochs then run with no Ray Data in the step
    in_memory: Optional[bool] = None
    #: the most GiB of converted batches a rank holds when ``data.in_memory`` is null: a larger shard is streamed
    #: (lower it where the workers' memory is small or shared)
    in_memory_max_gib: float = IN_MEMORY_MAX_BYTES_PER_RANK / 2**30
    #: seconds to wait for an epoch's first batch before failing with the likely cause (no free CPU for Ray Data)
    first_batch_timeout_s: float = 90.0

    def __post_init__(self) -> None:
        _require(bool(self.path), "data.path", "it is empty", "Set it to a dataset directory from `rayemb gen-data`.")
        _require_openable(self.path, "data.path")
        _require_openable(self.stats_path, "data.stats_path")
        _require(self.batch_size >= 1, "data.batch_size", f"{self.batch_size} < 1", "Use a positive batch size.")
        _require(
            self.id_policy in ID_POLICIES, "data.id_policy", f"{self.id_policy!r} is unknown", f"Use one of {ID_POLICIES}."
        )
        _require(self.in_memory in (None, True, False), "data.in_memory", f"{self.in_memory!r} is not a boolean",
                 "Use true, false or null (automatic).")
        _require(isinstance(self.in_memory_max_gib, (int, float)) and not isinstance(self.in_memory_max_gib, bool)
                 and math.isfinite(self.in_memory_max_gib) and self.in_memory_max_gib > 0, "data.in_memory_max_gib",
                 f"{self.in_memory_max_gib!r} is not a positive number of GiB", "Use e.g. 2.")
        _require(math.isfinite(self.first_batch_timeout_s) and self.first_batch_timeout_s > 0,
                 "data.first_batch_timeout_s", f"{self.first_batch_timeout_s} is not a positive number of seconds",
                 "Use e.g. 90.")


@dataclass(frozen=True)
class ModelConfig:
    #: a shipped model (rayemb.models; the list is rayemb.contract.factory.SHIPPED_MODELS)
    name: str = "dlrm"
    #: a model factory of your own, "package.module:function" (replaces name; docs/api.md, "The contract")
    factory: Optional[str] = None
    #: keyword arguments of the model's factory
    args: Dict[str, Any] = field(default_factory=dict)
    #: every table's embedding dim
    embedding_dim: int = 16
    #: the DLRM's bottom (dense) MLP layer sizes; the last must equal embedding_dim
    bottom_mlp: Tuple[int, ...] = (64, 16)
    #: the DLRM's top (over) MLP layer sizes; the last must be 1 (the click logit)
    top_mlp: Tuple[int, ...] = (64, 32, 1)
    #: the user-history tower over the schema's sequence features (docs/sequence.md): none (ignore them),
    #: mean (masked mean of the history) or attention (DIN-style, against the target feature's embedding);
    #: a factory of your own gets the sequence embeddings unless this is none
    sequence_tower: str = "none"
    #: the pooled tables' stored weights: fp32, or fp16 (half the memory; sharded tables' FBGEMM optimizer
    #: state and the replicated rows' optimizer state stay fp32; lookups return fp32). Sequence tables and
    #: compressed tables are fp32 only (docs/api.md, "Half-precision tables")
    embedding_dtype: str = "fp32"

    def __post_init__(self) -> None:
        from rayemb.contract.factory import SHIPPED_MODELS

        _require(self.name in SHIPPED_MODELS, "model.name", f"{self.name!r} is not a shipped model",
                 f"Use one of {sorted(SHIPPED_MODELS)}, or model.factory: 'package.module:function' for your own.")
        _require(self.factory is None or (isinstance(self.factory, str) and ":" in self.factory), "model.factory",
                 f"{self.factory!r} is not of the form 'package.module:function'",
                 "Name the module and the function, e.g. 'my_models.deepfm:build'.")
        _require(isinstance(self.args, dict), "model.args", f"{self.args!r} is not a mapping",
                 "Give the factory's keyword arguments as a mapping, e.g. {hidden: [256, 128]}.")
        _require(self.embedding_dim >= 1, "model.embedding_dim", f"{self.embedding_dim} < 1", "Use a positive dim.")
        _require(self.sequence_tower in SEQUENCE_TOWERS, "model.sequence_tower",
                 f"{self.sequence_tower!r} is unknown", "Use none, mean or attention.")
        _require(self.embedding_dtype in EMBEDDING_DTYPE_BYTES, "model.embedding_dtype",
                 f"{self.embedding_dtype!r} is unknown", f"Use one of {tuple(EMBEDDING_DTYPE_BYTES)}.")
        _require(self.embedding_dtype == "fp32" or self.sequence_tower == "none", "model.embedding_dtype",
                 f"{self.embedding_dtype} tables are pooled tables only, and model.sequence_tower is "
                 f"{self.sequence_tower!r}", "Use model.embedding_dtype: fp32 with a sequence tower, or "
                 "model.sequence_tower: none.")
        if self.factory is None and self.name == "dlrm":
            self._check_dlrm()

    @property
    def embedding_bytes_per_element(self) -> int:
        return EMBEDDING_DTYPE_BYTES[self.embedding_dtype]

    def _check_dlrm(self) -> None:
        _require(len(self.bottom_mlp) >= 1 and all(s >= 1 for s in self.bottom_mlp), "model.bottom_mlp",
                 f"{list(self.bottom_mlp)} is empty or has non-positive sizes", "Give positive layer sizes.")
        _require(self.bottom_mlp[-1] == self.embedding_dim, "model.bottom_mlp",
                 f"its last size {self.bottom_mlp[-1]} differs from model.embedding_dim={self.embedding_dim}",
                 "The dot interaction needs them equal: end bottom_mlp with the embedding dim.")
        _require(len(self.top_mlp) >= 2 and self.top_mlp[-1] == 1 and all(s >= 1 for s in self.top_mlp),
                 "model.top_mlp", f"{list(self.top_mlp)} must be at least two positive sizes ending in 1",
                 "End top_mlp with 1 (one click logit), e.g. [64, 32, 1].")


def _lr_schedule(value: Dict[str, Any]) -> Dict[str, Any]:
    """``train.lr_schedule`` checked, every key filled in (its default where left out)."""
    unknown = sorted(set(value) - set(LR_SCHEDULE_DEFAULTS))
    _require(not unknown, "train.lr_schedule", f"{unknown} is not a key",
             f"Use the keys {sorted(LR_SCHEDULE_DEFAULTS)}, e.g. {{kind: cosine, warmup_steps: 100}}.")
    out = {**LR_SCHEDULE_DEFAULTS, **value}
    _require(out["kind"] in LR_SCHEDULES, "train.lr_schedule.kind", f"{out['kind']!r} is unknown",
             f"Use one of {LR_SCHEDULES}.")
    for key in ("warmup_steps", "step_size"):
        v = out[key]
        least = 0 if key == "warmup_steps" else 1
        _require(type(v) is int and v >= least, f"train.lr_schedule.{key}", f"{v!r} is not a whole number >= {least}",
                 f"Use a whole number of steps >= {least}.")
    for key, ok, fix in (("min_lr_ratio", lambda x: 0 <= x <= 1, "Use a number in [0, 1], e.g. 0.0 or 0.1."),
                         ("gamma", lambda x: 0 < x <= 1, "Use a number in (0, 1], e.g. 0.5.")):
        v = out[key]
        if isinstance(v, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                v = float(v)
            except ValueError:
                pass
        _require(not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and ok(v),
                 f"train.lr_schedule.{key}", f"{v!r} is out of range", fix)
        out[key] = float(v)
    return out


@dataclass(frozen=True)
class TrainConfig:
    #: passes over the train split
    epochs: int = 1
    #: learning rate of the dense (MLP) optimizer
    dense_lr: float = 0.05
    #: the dense (MLP) parameters' optimizer: adagrad, adam, adamw or sgd
    dense_optimizer: str = "adagrad"
    #: weight decay of the dense optimizer (adamw: decoupled; the others: L2 added to the gradient); the
    #: embedding tables take none
    weight_decay: float = 0.0
    #: clip the dense parameters' gradient norm (all-reduced, so every rank clips alike) to this before the dense
    #: optimizer steps (None: no clipping; the embedding tables' gradients are not clipped)
    grad_clip_norm: Optional[float] = None
    #: learning rate of the fused embedding optimizer
    embedding_lr: float = 0.05
    #: the embedding tables' optimizer (on sharded tables FBGEMM's, fused into the backward; adam and
    #: rowwise_adam have FBGEMM kernels on GPUs only: on CPU ranks only data-parallel tables take them)
    embedding_optimizer: str = "rowwise_adagrad"
    #: seeds the model's initial weights and the order of the train rows
    seed: int = 0
    #: steps between progress lines and logged training metrics
    log_every_n_steps: int = DEFAULT_LOG_EVERY_N_STEPS
    #: cap on steps per epoch (None: the whole train split)
    max_steps_per_epoch: Optional[int] = None
    #: stop after this many epochs without a gain in ``early_stopping_metric`` (None: run every epoch); the run
    #: reports ``best_<metric>`` / ``best_epoch`` either way, and the job names the best checkpoint by it
    early_stopping_patience: Optional[int] = None
    #: the validation metric early stopping and the best checkpoint follow, in its own direction (AUC, GAUC, hit
    #: rates: higher; logloss, NE, RMSE, MAE: lower; calibration: closest to 1). None: valid_auc (a regression
    #: primary task: valid_rmse; a retrieval model: valid_hit_rate_at_50). valid_gauc needs a schema.yaml ``group``
    #: column
    early_stopping_metric: Optional[str] = None
    #: also validate every N training steps within an epoch (all ranks alike), reported at that step
    #: (None: at epoch ends only)
    eval_every_n_steps: Optional[int] = None
    #: a checkpoint directory of an earlier job to continue from (any world size and plan; same tables)
    resume_from: Optional[str] = None
    #: also write a checkpoint every N steps (None: epoch ends only)
    checkpoint_every_n_steps: Optional[int] = None
    #: also write a checkpoint when this many seconds passed since the last (checked at log points)
    checkpoint_every_s: Optional[float] = None
    #: checkpoints Ray Train keeps (the newest); older ones are deleted. At least 2, so a corrupt newest one
    #: has a predecessor to fall back to
    keep_checkpoints: int = 3
    #: MiB of table rows a rank sends in one round of a checkpoint's save or load exchange (its host memory
    #: for moving rows is a few times this; the files do not depend on it). rayemb.checkpoint.store.DEFAULT_CHUNK_MIB
    checkpoint_chunk_mib: int = 64
    #: start the next batch's sparse input exchange (split sizes, lengths, values) before this batch's backward
    #: (rayemb.embedding.prefetch; the same numbers, a shorter step); false: the plain TorchRec forward
    prefetch_input_dist: bool = True
    #: multi-task (schema.yaml ``label: [a, b]``): weight of each task's loss (1 for a task not named)
    task_weights: Dict[str, float] = field(default_factory=dict)
    #: the label column whose validation AUC is ``valid_auc``: early stopping and the best checkpoint follow
    #: it (None: the first label)
    early_stopping_task: Optional[str] = None
    #: the loss of a regression task (schema.yaml ``task_types: {label: regression}``) on the model's raw output:
    #: mse, or huber (delta 1: squared below an error of 1, linear above)
    regression_loss: str = "mse"
    #: a loss of your own, "package.module:function" taking (model output, labels) -> scalar (None: BCE per task)
    loss: Optional[str] = None
    #: the dense part's arithmetic in the training step: fp32, or bf16 under torch.autocast (MLPs, interactions;
    #: weights, gradients, optimizer state and the embedding tables stay fp32)
    precision: str = "fp32"
    #: torch.compile of the model's dense part (the largest submodules holding parameters and no embedding
    #: module, e.g. the MLPs; the embedding lookups stay eager): none, or dense (docs/gpu.md, "Compiling the
    #: dense part")
    compile: str = "none"
    #: torch.compile's mode for ``compile: dense``: default, reduce-overhead (CUDA graphs on a GPU), max-autotune
    compile_mode: str = "default"
    #: the step's float exchanges on the wire, per direction: ``forward`` the sharded tables' looked-up rows
    #: (pooled all-to-all, row-wise reduce-scatter, a hybrid table's cold rows), ``backward`` their gradients and
    #: the all-reduce of the replicated parameters' gradients (an all-reduce has no forward); each fp32, bf16 or
    #: fp16; a direction left out is fp32; ids stay integers, tables and optimizers fp32 (docs/hybrid.md,
    #: "Exchange precision")
    comm_precision: Dict[str, str] = field(default_factory=lambda: {"forward": "fp32", "backward": "fp32"})
    #: every learning rate (dense, embedding tables, replicated rows) times a factor of the global step:
    #: ``kind`` constant, cosine or linear (from 1 down to ``min_lr_ratio`` at the job's last step) or step
    #: (times ``gamma`` every ``step_size`` steps), after ``warmup_steps`` steps rising linearly to 1; a
    #: resumed job continues it from its checkpoint's step (docs/api.md, "Optimizers and schedules")
    lr_schedule: Dict[str, Any] = field(default_factory=lambda: dict(LR_SCHEDULE_DEFAULTS))

    def __post_init__(self) -> None:
        _require(self.epochs >= 1, "train.epochs", f"{self.epochs} < 1", "Train at least one epoch.")
        _require(self.dense_optimizer in DENSE_OPTIMIZERS, "train.dense_optimizer",
                 f"{self.dense_optimizer!r} is unknown", f"Use one of {DENSE_OPTIMIZERS}.")
        _require(math.isfinite(self.weight_decay) and self.weight_decay >= 0, "train.weight_decay",
                 f"{self.weight_decay} is not a non-negative finite number", "Use e.g. 0.0 (none) or 0.01.")
        _require(self.grad_clip_norm is None or (math.isfinite(self.grad_clip_norm) and self.grad_clip_norm > 0),
                 "train.grad_clip_norm", f"{self.grad_clip_norm} is not a positive finite number",
                 "Use e.g. 1.0, or null for no clipping.")
        object.__setattr__(self, "lr_schedule", _lr_schedule(self.lr_schedule))
        for task, w in self.task_weights.items():
            _require(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0, f"train.task_weights.{task}",
                     f"{w!r} is not a non-negative number", "Weigh each task's loss with a number >= 0, e.g. 1.0.")
        _require(self.regression_loss in REGRESSION_LOSSES, "train.regression_loss",
                 f"{self.regression_loss!r} is unknown", f"Use one of {REGRESSION_LOSSES}.")
        _require(self.loss is None or ":" in self.loss, "train.loss", f"{self.loss!r} is not of the form "
                 "'package.module:function'", "Name the module and the function, e.g. 'my_losses:sampled_softmax'.")
        for key, lr in (("train.dense_lr", self.dense_lr), ("train.embedding_lr", self.embedding_lr)):
            _require(math.isfinite(lr) and lr > 0, key, f"{lr} is not a positive finite number", "Use e.g. 0.05.")
        _require(self.precision in PRECISIONS, "train.precision", f"{self.precision!r} is unknown",
                 "Use fp32, or bf16 for the dense layers under autocast.")
        unknown = sorted(set(self.comm_precision) - set(COMM_DIRECTIONS))
        _require(not unknown, "train.comm_precision", f"{unknown} is not a direction",
                 "Set forward and/or backward, e.g. {forward: bf16, backward: bf16}.")
        for direction, value in self.comm_precision.items():
            _require(value in COMM_PRECISIONS, f"train.comm_precision.{direction}", f"{value!r} is unknown",
                     f"Use one of {COMM_PRECISIONS}.")
        object.__setattr__(self, "comm_precision", {d: self.comm_precision.get(d, "fp32") for d in COMM_DIRECTIONS})
        _require(self.compile in COMPILE_CHOICES, "train.compile", f"{self.compile!r} is unknown",
                 f"Use one of {COMPILE_CHOICES}: none (eager), or dense (torch.compile of the dense layers).")
        _require(self.compile_mode in COMPILE_MODES, "train.compile_mode", f"{self.compile_mode!r} is unknown",
                 f"Use one of {COMPILE_MODES} (torch.compile's modes).")
        _require(self.embedding_optimizer in EMBEDDING_OPTIMIZERS, "train.embedding_optimizer",
                 f"{self.embedding_optimizer!r} is unknown", f"Use one of {EMBEDDING_OPTIMIZERS}.")
        _require(self.log_every_n_steps >= 1, "train.log_every_n_steps", f"{self.log_every_n_steps} < 1",
                 "Use a positive step count.")
        _require(self.max_steps_per_epoch is None or self.max_steps_per_epoch >= 1, "train.max_steps_per_epoch",
                 f"{self.max_steps_per_epoch} < 1", "Use a positive cap or null for the whole split.")
        _require(self.checkpoint_every_n_steps is None or self.checkpoint_every_n_steps >= 1,
                 "train.checkpoint_every_n_steps", f"{self.checkpoint_every_n_steps} < 1",
                 "Use a positive step count, or null for epoch ends only.")
        _require(self.checkpoint_every_s is None or self.checkpoint_every_s > 0, "train.checkpoint_every_s",
                 f"{self.checkpoint_every_s} is not positive", "Use a positive number of seconds, or null.")
        _require(self.keep_checkpoints >= 2, "train.keep_checkpoints", f"{self.keep_checkpoints} < 2",
                 "Keep at least 2 checkpoints (the newest and one to fall back to).")
        _require(type(self.checkpoint_chunk_mib) is int and self.checkpoint_chunk_mib >= 1,
                 "train.checkpoint_chunk_mib", f"{self.checkpoint_chunk_mib!r} is not a whole number >= 1",
                 "Use a whole number of MiB, e.g. 64 (more: fewer rounds, more host memory during a checkpoint).")
        _require_openable(self.resume_from, "train.resume_from")
        _require(self.early_stopping_patience is None or self.early_stopping_patience >= 1,
                 "train.early_stopping_patience", f"{self.early_stopping_patience} < 1",
                 "Use a positive number of epochs, or null to run every epoch.")
        _require(self.early_stopping_metric is None or self.early_stopping_metric in EARLY_STOPPING_METRICS,
                 "train.early_stopping_metric", f"{self.early_stopping_metric!r} is not a validation metric",
                 f"Use one of {EARLY_STOPPING_METRICS}, or null for valid_auc (a retrieval model's hit rate@50).")
        _require(self.eval_every_n_steps is None or self.eval_every_n_steps >= 1, "train.eval_every_n_steps",
                 f"{self.eval_every_n_steps} < 1", "Use a positive step count, or null for epoch ends only.")


@dataclass(frozen=True)
class ScalingConfig:
    #: Ray Train workers, one per rank (one per GPU when use_gpu); ``[min, max]`` makes the job elastic:
    #: it starts with what the cluster grants (up to max) and survives losing workers down to min.
    #: Read as the max; ``min_workers`` holds the min (None: fixed size)
    num_workers: Any = 2
    #: the elastic job's minimum workers, set from ``num_workers: [min, max]`` (None: a fixed-size job)
    min_workers: Optional[int] = None
    #: one GPU per worker, NCCL between ranks (false: CPU ranks over gloo)
    use_gpu: bool = False
    #: the GPU nodes' shape the plan assumes while none is up (autoscaling from zero); live GPU nodes win
    gpus_per_node: Optional[int] = None
    #: HBM per GPU the plan assumes, GiB (None: from the GPU model the GPU nodes, or before any is up
    #: the GPU node types, name; a GPU job where none does fails asking for this key)
    gpu_memory_gib: Optional[float] = None
    #: host memory per rank the plan assumes (None: the live nodes' memory / ranks)
    memory_per_worker_gib: Optional[float] = None
    #: CPUs per worker; None picks a share that leaves CPUs for Ray Data's read tasks
    cpus_per_worker: Optional[float] = None
    #: restarts of the worker group after a failure (Ray's default is 0)
    max_failures: int = 0
    #: how Ray places the workers' bundles: PACK (fewest nodes), SPREAD (across nodes, best effort),
    #: STRICT_SPREAD (one per node)
    placement_strategy: str = "PACK"
    #: the accelerator type the workers' nodes must have, as Ray names it (``A10G``, ``H100``; Ray Train's
    #: ``ScalingConfig.accelerator_type``). None: any node
    accelerator_type: Optional[str] = None

    def __post_init__(self) -> None:
        if isinstance(self.num_workers, (list, tuple)):
            ok = (len(self.num_workers) == 2 and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                                      for n in self.num_workers)
                  and self.num_workers[0] <= self.num_workers[1])
            _require(ok, "scaling.num_workers", f"{list(self.num_workers)} is not [min, max] with 1 <= min <= max",
                     "Write a worker count, or [min, max] for an elastic job, e.g. [1, 4].")
            object.__setattr__(self, "min_workers", int(self.num_workers[0]))
            object.__setattr__(self, "num_workers", int(self.num_workers[1]))
        _require(isinstance(self.num_workers, int) and not isinstance(self.num_workers, bool), "scaling.num_workers",
                 f"{self.num_workers!r} is not an integer", "Write a worker count, or [min, max] for an elastic job.")
        _require(self.num_workers >= 1, "scaling.num_workers", f"{self.num_workers} < 1", "Use at least one worker.")
        _require(self.min_workers is None or 1 <= self.min_workers <= self.num_workers, "scaling.min_workers",
                 f"{self.min_workers} is not in [1, num_workers={self.num_workers}]",
                 "Use scaling.num_workers: [min, max] for an elastic job.")
        _require(self.gpu_memory_gib is None or (isinstance(self.gpu_memory_gib, (int, float))
                                                  and not isinstance(self.gpu_memory_gib, bool)
                                                  and self.gpu_memory_gib > 0), "scaling.gpu_memory_gib",
                 f"{self.gpu_memory_gib!r} is not a positive number of GiB",
                 "Write the memory of one GPU in GiB, e.g. 24 (A10G, L4), 40 (A100 40GB), 80 (H100).")
        _require(self.cpus_per_worker is None or self.cpus_per_worker > 0, "scaling.cpus_per_worker",
                 f"{self.cpus_per_worker} is not positive", "Use a positive number or null for automatic.")
        _require(self.max_failures >= -1, "scaling.max_failures", f"{self.max_failures} < -1",
                 "Use -1 (retry forever), 0 or a positive count.")
        _require(self.placement_strategy in PLACEMENT_STRATEGIES, "scaling.placement_strategy",
                 f"{self.placement_strategy!r} is unknown", f"Use one of {PLACEMENT_STRATEGIES}.")
        _require(self.accelerator_type is None or (isinstance(self.accelerator_type, str) and self.accelerator_type),
                 "scaling.accelerator_type", f"{self.accelerator_type!r} is not an accelerator type's name",
                 "Write Ray's name of the GPU (e.g. A10G, L4, A100, H100), or null for any node.")


PLANNER_ENGINES = ("auto", "torchrec", "fast")
PLANNER_OBJECTIVES = ("step_time", "bytes")


@dataclass(frozen=True)
class PlannerConfig:
    #: let the cost model place tables hybrid (hot rows replicated, cold rows sharded per id)
    hybrid: bool = True
    #: "torchrec" (TorchRec's planner, our proposer), "fast" (large clusters) or "auto"
    engine: str = "auto"
    #: per-table pins, e.g. ``{C1: {sharding: row_wise, hybrid: false, compute_kernel: fused}}``
    tables: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    #: what the placement choice minimises: predicted "step_time" (calibrated) or "bytes" per step
    objective: str = "step_time"
    #: measure the step-time model's constants on the live cluster at job start (false: built-in defaults)
    calibrate: bool = True
    #: use a calibration of the same job shape and cluster measured within this many hours (kept under
    #: tracking.output_dir/calibrations) instead of measuring; 0: always measure
    calibration_max_age_h: float = 24.0
    #: measure anew even when a recent calibration of the same shape is kept (and replace it)
    recalibrate: bool = False
    #: one node: a plan placing every table alike wins when predicted within this fraction of the best mix
    tie_margin: float = 0.05
    #: steps of the plan probe at job start (rayemb.train.calibration.plan_probe): the step-time model's plan and the same
    #: job on the other side of the hybrid choice, built as the workers will and timed on the live cluster; the
    #: faster trains and its step is the predicted one. 0: no probe (the model's choice and prediction stand)
    probe_steps: int = 30

    def __post_init__(self) -> None:
        _require(0.0 <= self.tie_margin < 1.0, "planner.tie_margin", f"{self.tie_margin!r} is not in [0, 1)",
                 "Use a fraction such as 0.05 (0: always the lowest prediction).")
        _require(self.calibration_max_age_h >= 0, "planner.calibration_max_age_h", f"{self.calibration_max_age_h} < 0",
                 "Use hours >= 0 (0: always measure).")
        _require(isinstance(self.probe_steps, int) and 0 <= self.probe_steps <= 1000, "planner.probe_steps",
                 f"{self.probe_steps!r} is not a step count in [0, 1000]", "Use e.g. 30 (0: no plan probe).")
        _require(self.engine in PLANNER_ENGINES, "planner.engine", f"{self.engine!r} is unknown",
                 f"Use one of {PLANNER_ENGINES}.")
        _require(self.objective in PLANNER_OBJECTIVES, "planner.objective", f"{self.objective!r} is unknown",
                 f"Use one of {PLANNER_OBJECTIVES}.")
        for name, pin in self.tables.items():
            _require(isinstance(pin, dict), f"planner.tables.{name}", f"{pin!r} is not a mapping",
                     "Write it as {sharding: row_wise, hybrid: false}.")

    def pins(self) -> Dict[str, Dict[str, Any]]:
        """Pins for :func:`rayemb.planner.plan`; ``hybrid: false`` here turns hybrid off for every unpinned table."""
        return {k: dict(v) for k, v in self.tables.items()}


@dataclass(frozen=True)
class TrackingConfig:
    #: the MLflow experiment the job's runs go to
    experiment: str = "rayemb"
    #: job outputs (MLflow sqlite store, Ray Train storage); relative paths: see ``resolve_path``. A URI
    #: (s3://bucket/runs) holds job files and checkpoints; MLflow then stays local (rayemb.train.driver.outputs)
    output_dir: str = "runs"
    #: MLflow tracking URI; None means $MLFLOW_TRACKING_URI, else sqlite under output_dir
    tracking_uri: Optional[str] = None
    #: the MLflow run's name (None: the job's name)
    run_name: Optional[str] = None

    def __post_init__(self) -> None:
        _require(bool(self.experiment), "tracking.experiment", "it is empty", "Name the MLflow experiment.")
        _require_openable(self.output_dir, "tracking.output_dir")


@dataclass(frozen=True)
class JobConfig:
    #: the job's name: the MLflow run's name unless tracking.run_name gives one, and what running the job again
    #: finds (its unfinished run continues)
    name: str
    #: the dataset and how it is read
    data: DataConfig
    #: the model trained on the embeddings: a shipped one or a factory of your own
    model: ModelConfig = field(default_factory=ModelConfig)
    #: epochs, optimizers, losses, checkpoints
    train: TrainConfig = field(default_factory=TrainConfig)
    #: the Ray Train workers: how many, GPUs, CPUs, memory, failures
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    #: how each table is placed across the ranks
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    #: MLflow and where job outputs go
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        from rayemb.embedding.compression_math import refuse_low_precision

        _require(bool(self.name), "name", "it is empty", "Give the job a name.")
        refuse_low_precision({t: self.model.embedding_dtype for t, pin in self.planner.tables.items()
                              if pin.get("compression", "none") != "none"})

    def to_dict(self) -> Dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        """The resolved config as YAML (what ``load_config`` reads back)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def flatten(self) -> Dict[str, Any]:
        """``{"train.epochs": 1, ...}`` for MLflow params."""
        return flatten(self.to_dict())

    def replace(self, **sections: Any) -> "JobConfig":
        return dataclasses.replace(self, **sections)


def _to_plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _to_plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_to_plain(x) for x in v]
    return v


# ---- building dataclasses from YAML mappings ---- #


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        return _coerce(value, [a for a in args if a is not type(None)][0], where)
    if origin in (tuple, Tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"Invalid config value {where}: expected a list, got {value!r}. Write it as [a, b, ...].")
        return tuple(_coerce(x, args[0], f"{where}[{i}]") for i, x in enumerate(value))
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise ConfigError(f"Invalid config value {where}: expected a mapping, got {value!r}.")
        return {str(k): _coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"Invalid config value {where}: expected true or false, got {value!r}.")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"Invalid config value {where}: expected an integer, got {value!r}.")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string; users write it that way
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"Invalid config value {where}: expected a number, got {value!r}.")
        return float(value)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"Invalid config value {where}: expected a string, got {value!r}.")
        return str(value)
    return value


def _build(cls: Any, d: Any, where: str) -> Any:
    if not isinstance(d, dict):
        raise ConfigError(f"Invalid config section {where or 'top level'}: expected a mapping, got {d!r}.")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(
            f"Unknown config key(s) {unknown} in section {where or 'top level'}; known keys: {sorted(known)}. "
            "Check the spelling (see jobs/configs/synth_small.yaml)."
        )
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{where}.{f.name}" if where else f.name
        if f.name in d:
            kwargs[f.name] = _coerce(d[f.name], hints[f.name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"Missing required config key {key}. Add it to the YAML or pass --set {key}=...")
    return cls(**kwargs)


def apply_overrides(d: Dict[str, Any], overrides: Sequence[str]) -> Dict[str, Any]:
    """Applies ``a.b=c`` overrides (values parsed as YAML) to a nested mapping, returning a copy."""
    out = yaml.safe_load(yaml.safe_dump(d)) or {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"Override {item!r} is not of the form key=value; write e.g. --set train.epochs=2.")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"Override {item!r}: {p!r} is not a section; check the key path.")
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ConfigError(f"Override {item!r}: the value is not valid YAML ({e}).") from None
    return out


def config_from_dict(d: Dict[str, Any], overrides: Sequence[str] = ()) -> JobConfig:
    return _build(JobConfig, apply_overrides(d, overrides), "")


def load_config(path: str, overrides: Sequence[str] = ()) -> JobConfig:
    """Reads a YAML job config, applies ``--set`` overrides and validates it."""
    if not os.path.isfile(path):
        raise ConfigError(f"Config file {path!r} does not exist. Pass a YAML job config, e.g. jobs/configs/synth_small.yaml.")
    try:
        with open(path) as f:
            d = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(f"Config file {path!r} is not valid YAML: {e}. Fix the syntax at the position shown.") from None
    if not isinstance(d, dict):
        raise ConfigError(f"Config file {path!r} must hold a mapping with sections data, model, train, ...")
    try:
        return config_from_dict(d, overrides)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e.message}") from None


def resolve_path(path: str) -> str:
    """Absolute form of a config path: relative paths resolve against $RAYEMB_WORKSPACE, else the cwd.

    ``ray job submit --working-dir .`` runs the job in a copy of the working dir
    without data/ or runs/ (they are git-ignored), so the local head script sets
    RAYEMB_WORKSPACE to the repository and jobs read and write there.
    """
    if "://" in path or os.path.isabs(path):
        return path
    return os.path.abspath(os.path.join(os.environ.get(WORKSPACE_ENV_VAR) or os.getcwd(), path))


#: the keys that take one of a fixed set of values, and that set (the validation above reads the same constants;
#: model.name's set is rayemb.contract.factory.SHIPPED_MODELS)
CHOICES: Dict[str, Tuple[Any, ...]] = {
    "data.id_policy": ID_POLICIES,
    "model.sequence_tower": SEQUENCE_TOWERS,
    "model.embedding_dtype": tuple(EMBEDDING_DTYPE_BYTES),
    "train.embedding_optimizer": EMBEDDING_OPTIMIZERS,
    "train.dense_optimizer": DENSE_OPTIMIZERS,
    "train.precision": PRECISIONS,
    "train.comm_precision": COMM_PRECISIONS,
    "train.compile": COMPILE_CHOICES,
    "train.compile_mode": COMPILE_MODES,
    "train.lr_schedule": LR_SCHEDULES,
    "train.regression_loss": REGRESSION_LOSSES,
    "train.early_stopping_metric": EARLY_STOPPING_METRICS,
    "scaling.placement_strategy": PLACEMENT_STRATEGIES,
    "planner.engine": PLANNER_ENGINES,
    "planner.objective": PLANNER_OBJECTIVES,
}


__all__: List[str] = [
    "JobConfig", "DataConfig", "ModelConfig", "TrainConfig", "ScalingConfig", "PlannerConfig", "TrackingConfig",
    "load_config", "config_from_dict", "apply_overrides", "resolve_path",
]
