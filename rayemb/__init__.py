"""rayemb: hybrid data/model-parallel TorchRec embedding training on Ray, tracked in MLflow.

A job reads parquet as a Ray Dataset, computes per-table statistics in one
streaming pass, splits each table's ids into hot rows (replicated) and cold
rows (sharded, exchanged per id), plans the placement of every table for the
cluster it finds, and trains a model on Ray Train workers: a shipped one
(:mod:`rayemb.models`) or the user's own, built by a factory that receives
the embedding modules rayemb made (:class:`Embeddings`, docs/api.md).
Importing rayemb does not import torch; the heavy parts load where they run,
and the model-building names below load on first use.

Example::

    >>> import rayemb
    >>> cfg = rayemb.load_config("jobs/configs/synth_small.yaml", ["train.epochs=1"])
    >>> result = rayemb.run_training(cfg)       # on the Ray cluster in $RAY_ADDRESS, else a local one
    >>> result.status, result.metrics["valid_auc"]
"""

from rayemb._version import __version__
from rayemb.config import JobConfig, load_config
from rayemb.errors import ConfigError, DataError, PlanError, RayembError, TrainingError
from rayemb.train.driver.trainer import TrainResult, run_training


#: the Python API's trainer, the model contract's names and the exported model (torch, TorchRec, Ray): imported
#: on first use, so that `import rayemb` stays light
_MODEL_API = {
    "EmbeddingTrainer": "rayemb.api",
    "Embeddings": "rayemb.contract.model",
    "DatasetSchema": "rayemb.data.schema",
    "SequenceFeature": "rayemb.embedding.sequence",
    "UserHistoryTower": "rayemb.embedding.sequence",
    "pad_sequences": "rayemb.embedding.sequence",
    "InferenceModel": "rayemb.serve.model",
    "run_sweep": "rayemb.sweep.engine",
    "sweep_trainable": "rayemb.sweep.trial",
}


def __getattr__(name: str):
    if name in _MODEL_API:
        import importlib

        return getattr(importlib.import_module(_MODEL_API[name]), name)
    raise AttributeError(f"module 'rayemb' has no attribute {name!r}")


__all__ = [
    "__version__",
    "JobConfig", "load_config", "run_training", "TrainResult",
    "RayembError", "ConfigError", "DataError", "PlanError", "TrainingError",
    *_MODEL_API,
]
