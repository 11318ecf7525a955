"""Error types users see.

Every user-facing error carries a *category* (tests assert it, not the wording)
and a one-paragraph message that names the input, the problem and the fix. The
CLI prints ``str(err)`` and exits non-zero without a traceback. Errors pickle, so
they survive crossing Ray process boundaries.
"""

from __future__ import annotations

from typing import Tuple


class RayembError(Exception):
    """Base class of rayemb's user-facing errors."""

    #: exit code the CLI uses for this error family
    exit_code: int = 2

    def __init__(self, message: str, category: str = "invalid_input") -> None:
        super().__init__(message)
        self.message = message
        self.category = category

    def __reduce__(self) -> Tuple[type, Tuple[str, str]]:
        return (type(self), (self.message, self.category))

    def __str__(self) -> str:
        return self.message


class ConfigError(RayembError):
    """A job config (YAML or ``--set`` override) is invalid."""


class DataError(RayembError):
    """A dataset is missing, has the wrong schema, or holds invalid values."""


class PlanError(RayembError):
    """No placement satisfies the request (categories: insufficient_storage, ...)."""


class TrainingError(RayembError):
    """The distributed training run failed."""

    exit_code = 1


class TrackingError(RayembError):
    """An MLflow store, experiment or run asked for does not exist or cannot be read."""
