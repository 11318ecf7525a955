"""Trained models out: the unsharded inference model, its MLflow pyfunc form, and batch scoring.

==================  =============================================================
module              what it does
==================  =============================================================
``model``           :class:`InferenceModel`: plain DLRM + EBC from a logical checkpoint; scores rows
``columns``         what scoring reads and writes: feature columns, one prediction column per task, outputs
``retrieval``       a retrieval model's pair scores, user and item vectors, the catalogue's ``items.parquet``
``export``          ``rayemb export``: run or checkpoint -> model dir, logged (and registered) in MLflow
``mlflow_model``    the pyfunc class, logging, registering, resolving ``models:/`` URIs (imports mlflow)
``predict``         ``rayemb predict``: Ray Data batch inference over parquet (imports ray at run time)
==================  =============================================================

Importing this package is cheap (no torch, mlflow or ray).

Example::

    >>> from rayemb.serve import InferenceModel
    >>> InferenceModel.load("models/criteo").predict(df)       # probabilities, float64
    >>> InferenceModel.load("models/ml-two-tower").user_embeddings(df)   # (N, d) query vectors
"""

from __future__ import annotations

from rayemb.serve.model import InferenceModel

__all__ = ["InferenceModel"]
