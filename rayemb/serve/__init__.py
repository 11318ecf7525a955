"""Trained models out: the unsharded inference model, its MLflow pyfunc form, and batch scoring.

==================  =============================================================
module              what it does
==================  =============================================================
``model``           :class:`InferenceModel`: plain DLRM + EBC from a logical checkpoint; scores rows
``export``          ``rayemb export``: run or checkpoint -> model dir, logged (and registered) in MLflow
``mlflow_model``    the pyfunc class, logging, registering, resolving ``models:/`` URIs (imports mlflow)
``predict``         ``rayemb predict``: Ray Data batch inference over parquet (imports ray at run time)
==================  =============================================================

Importing this package is cheap (no torch, mlflow or ray).

Example::

    >>> from rayemb.serve import InferenceModel
    >>> InferenceModel.load("models/criteo").predict(df)       # probabilities, float64
"""

from __future__ import annotations

from rayemb.serve.model import InferenceModel

__all__ = ["InferenceModel"]
