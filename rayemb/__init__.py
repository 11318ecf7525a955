"""rayemb: hybrid data/model-parallel TorchRec embedding training on Ray, tracked in MLflow.

A job reads parquet as a Ray Dataset, computes per-table statistics in one
streaming pass, splits each table's ids into hot rows (replicated) and cold
rows (sharded, exchanged per id), plans the placement of every table for the
cluster it finds, and trains a DLRM on Ray Train workers. Importing rayemb
does not import torch; the heavy parts load where they run.

Example::

    >>> import rayemb
    >>> cfg = rayemb.load_config("jobs/configs/synth_small.yaml", ["train.epochs=1"])
    >>> result = rayemb.run_training(cfg)       # on the Ray cluster in $RAY_ADDRESS, else a local one
    >>> result.status, result.metrics["valid_auc"]
"""

from rayemb._version import __version__
from rayemb.config import JobConfig, load_config
from rayemb.errors import ConfigError, DataError, PlanError, RayembError, TrainingError
from rayemb.train.trainer import TrainResult, run_training


__all__ = [
    "__version__",
    "JobConfig", "load_config", "run_training", "TrainResult",
    "RayembError", "ConfigError", "DataError", "PlanError", "TrainingError",
]
