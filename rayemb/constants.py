"""Typed constants with units, and environment knobs as ``X_ENV_VAR`` / ``DEFAULT_X`` pairs."""

from __future__ import annotations

# ---- DATA ---- #
SCHEMA_FILE = "schema.yaml"
TRAIN_SPLIT = "train"
VALID_SPLIT = "valid"
LABEL_COLUMN = "label"
NUM_DENSE_FEATURES = 13
NUM_SPARSE_FEATURES = 26

#: Criteo 1TB per-table cardinalities (TorchRec's DLRM example order, C1..C26).
CRITEO_1TB_CARDINALITIES = (
    45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176,
    345138, 10, 2209, 11267, 128, 4, 974, 14, 48937457, 11316796, 40094537,
    452104, 12606, 104, 35,
)
DEFAULT_GEN_CHUNK_ROWS = 250_000  # rows generated (and held in RAM) at once
DEFAULT_CARDINALITY_SCALE = 1000  # Criteo 1TB cardinalities divided by this
MIN_SYNTH_CARDINALITY = 3

# ---- PATHS ---- #
#: relative paths in job configs resolve against this directory (else the cwd);
#: the local head script sets it to the repository so `ray job submit` jobs find data.
WORKSPACE_ENV_VAR = "RAYEMB_WORKSPACE"
TRACKING_URI_ENV_VAR = "MLFLOW_TRACKING_URI"
#: a published output's replaced version is kept this long after the marker stops naming it, so a job that
#: resolved it before the switch reads it to the end (rayemb.publish); a week outlasts a long training run
PUBLISH_GRACE_ENV_VAR = "RAYEMB_PUBLISH_GRACE_S"
DEFAULT_PUBLISH_GRACE_S = 7 * 24 * 3600  # 7 days

# ---- DATA ---- #
#: a split of at most this many rows (from the parquet footers) is read in the driver, for the statistics pass and
#: for the workers' blocks: starting Ray Data's tasks, and the worker processes they run in, takes longer
SMALL_SPLIT_MAX_ROWS = 250_000

# ---- TRAINING ---- #
#: CPUs kept free for Ray Data read tasks when workers get fractional CPUs.
RESERVED_DATA_CPUS = 1.0
MIN_CPUS_PER_WORKER = 0.25
#: data.in_memory_max_gib's default: data.in_memory=null holds a rank's converted train+valid shard in memory up
#: to this size
IN_MEMORY_MAX_BYTES_PER_RANK = 2 * 2**30
DEFAULT_LOG_EVERY_N_STEPS = 20
#: test hook: "STEP:MARKER_FILE" makes a worker fail once at STEP (the marker records that it did)
FAULT_INJECTION_ENV_VAR = "RAYEMB_FAULT_INJECTION"

# ---- TRACKING ---- #
MLFLOW_DB_FILE = "mlflow.db"
