"""Error types users see.

Every user-facing error carries a *category* (tests assert it, not the wording)
and a one-paragraph message that names the input, the problem and the fix. The
CLI prints ``str(err)`` and exits non-zero without a traceback. Errors pickle, so
they survive crossing Ray process boundaries.
"""

from __future__ import annotations

from typing import Any, List, Optional, Set, Tuple


#: the category of every error about a model factory (rayemb.contract): one that cannot be found or breaks the contract
BAD_FACTORY = "bad_model_factory"


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


class TrainingDivergedError(RayembError):
    """The loss became NaN or infinite: the job's learning rates or data make training diverge."""


class TrackingError(RayembError):
    """An MLflow store, experiment or run asked for does not exist or cannot be read."""


def find_user_error(exc: BaseException, _seen: Optional[Set[int]] = None) -> Optional[RayembError]:
    """The first :class:`RayembError` inside ``exc``: itself, its causes, or a Ray wrapper's cause.

    Ray hands a worker's or task's exception back wrapped (``RayTaskError`` with
    ``.cause``, Ray Data's ``UserCodeException`` chained by ``__cause__``, Ray
    Train's ``WorkerGroupError`` with ``.worker_failures`` and ``ControllerError``
    with ``.controller_failure``); the user needs the
    rayemb message inside, not the wrapper's traceback.
    """
    seen = _seen if _seen is not None else set()
    if exc is None or id(exc) in seen:
        return None
    seen.add(id(exc))
    if isinstance(exc, RayembError):
        # a RayTaskError made "as instance of cause" is also a RayembError: return the plain cause it wraps
        cause = getattr(exc, "cause", None)
        return find_user_error(cause, seen) if isinstance(cause, RayembError) else exc
    nested: List[Any] = [getattr(exc, "cause", None), getattr(exc, "controller_failure", None), exc.__cause__,
                         exc.__context__]
    failures = getattr(exc, "worker_failures", None)
    if isinstance(failures, dict):
        nested.extend(failures.values())
    for inner in nested:
        if isinstance(inner, BaseException):
            found = find_user_error(inner, seen)
            if found is not None:
                return found
    return None
