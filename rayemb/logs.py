"""Logs a person can read: third-party noise silenced where it is made, secrets kept out.

Two libraries log through the *root* logger, so their records cannot be
silenced by a logger level without silencing everything else:

- FBGEMM logs every embedding kernel's full constructor arguments
  (``[TBE=...] SplitTableBatchedEmbeddingBagsCodegen Arguments: {...}``, several
  KB per table group per rank) at INFO;
- TorchRec's plan validation warns ``Sharding spec not found for ...`` for every
  data-parallel table, which has no sharding spec by design.

:func:`quiet_third_party_logs` installs a filter on the root logger that drops
exactly those records (and nothing at WARNING or above from FBGEMM) and lowers
the chatty library loggers to WARNING. Call it in every process that builds or
plans models: the CLI, the planning task and every training worker.

:func:`redact_uri` hides credentials in URIs (``http://user:pw@host`` ->
``http://user:***@host``; all the userinfo of storage URIs, whose "user" is an
access key id: ``s3://KEY:SECRET@bucket`` -> ``s3://***@bucket``; secret query
parameters) wherever rayemb logs or prints one. Both it and :func:`redact_text`
also replace the value of any secret environment variable (``SECRET_ENV_VARS``,
e.g. ``AWS_SECRET_ACCESS_KEY``) wherever it appears.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: library loggers that are chatty at INFO and say nothing a user acts on
_CHATTY_LOGGERS = ("torchrec", "fbgemm_gpu", "alembic", "mlflow.store.db")

_SECRET_QUERY_KEYS = re.compile(r"(pass|secret|token|key|credential|signature|auth)", re.IGNORECASE)
REDACTED = "***"
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
#: storage schemes whose userinfo is an access key pair rather than a user name: all of it is hidden
_KEY_PAIR_SCHEMES = ("s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "wasb", "wasbs")
#: environment variables whose values are secrets: never shown, wherever they turn up
SECRET_ENV_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY",
                   "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "RAY_AUTH_TOKEN")
#: shorter values are not scrubbed from text (they would match ordinary words)
_MIN_SECRET_CHARS = 8


#: (message prefix, highest level dropped) of records that say nothing a user can act on
_NOISE = (
    ("[TBE=", logging.INFO),                                   # FBGEMM: every kernel's constructor arguments
    ("Successfully loaded: '", logging.INFO),                  # FBGEMM: each of its 14 .so files at import
    ("Sharding spec not found for ", logging.WARNING),         # TorchRec: every data-parallel table, by design
    ("Sharding Type is data_parallel, caching params", logging.WARNING),  # TorchRec: same, per table and rank
)
#: loggers (besides the root) that emit the records above; a logger's filter sees only its own records
_NOISY_LOGGERS = ("torchrec.distributed.utils", "torchrec.distributed.planner.planners")
#: Python warnings from library internals, not from anything rayemb or its user does
_NOISY_WARNINGS = (
    (FutureWarning, r"`broadcast_buffers` is deprecated"),     # TorchRec's own DDP wrapping
    (FutureWarning, r"Please use DTensor instead and we are deprecating ShardedTensor"),  # TorchRec's state dicts
    (UserWarning, r".*an autograd kernel was not registered to the Autograd key"),  # FBGEMM CPU dense lookup
)


class _ThirdPartyNoiseFilter(logging.Filter):
    """Drops FBGEMM's per-kernel argument dumps and TorchRec's data-parallel notices (see ``_NOISE``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        return not any(msg.startswith(prefix) and record.levelno <= level for prefix, level in _NOISE)


_FILTER = _ThirdPartyNoiseFilter()


def quiet_third_party_logs() -> None:
    """Idempotent: silence FBGEMM/TorchRec noise in this process, keep real warnings."""
    import warnings

    for lg in (logging.getLogger(), *map(logging.getLogger, _NOISY_LOGGERS)):
        if _FILTER not in lg.filters:
            lg.addFilter(_FILTER)
    for category, pattern in _NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)  # "is_fx_tracing will return true ..."
    for name in _CHATTY_LOGGERS:
        lg = logging.getLogger(name)
        if lg.level == logging.NOTSET or lg.level < logging.WARNING:
            lg.setLevel(logging.WARNING)


#: loggers of Ray internals that only repeat a known, harmless failure on the private local Ray: Ray Train's
#: PlacementGroupCleaner asks the state API (served by the dashboard) every second whether the controller lives,
#: and the private local Ray runs without a dashboard, so each ask logs "Failed to query Ray Train Controller
#: actor state" -- once a second for the whole job, relayed into the user's terminal
LOCAL_RAY_NOISY_LOGGERS = ("ray.train.v2._internal.execution.controller.placement_group_cleaner",)


def quiet_local_ray_worker() -> None:
    """Worker-process setup hook of the private local Ray (:func:`rayemb._ray.init_ray`): its known noise off.

    Only :data:`LOCAL_RAY_NOISY_LOGGERS` drop to ERROR; a cleanup that really fails still logs at ERROR.
    """
    for name in LOCAL_RAY_NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def _scrub_secrets(text: str) -> str:
    """``text`` with the value of every set secret environment variable replaced by ``***``."""
    for name in SECRET_ENV_VARS:
        value = os.environ.get(name)
        if value and len(value) >= _MIN_SECRET_CHARS and value in text:
            text = text.replace(value, REDACTED)
    return text


def redact_uri(uri: Any) -> Any:
    """``uri`` with any password and secret-looking query values replaced by ``***``; other values unchanged.

    >>> redact_uri("http://alice:s3cret@mlflow.internal:5000/?token=abc&x=1")
    'http://alice:***@mlflow.internal:5000/?token=%2A%2A%2A&x=1'
    >>> redact_uri("s3://AKIAEXAMPLE:s3cret@bucket/data")
    's3://***@bucket/data'
    """
    if not isinstance(uri, str):
        return uri
    if "://" not in uri:
        return _scrub_secrets(uri)
    try:
        parts = urlsplit(uri)
    except ValueError:
        return _scrub_secrets(uri)
    netloc, query = parts.netloc, parts.query
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        keep_user = ":" in userinfo and parts.scheme.lower() not in _KEY_PAIR_SCHEMES
        netloc = f"{user}:{REDACTED}@{host}" if keep_user else f"{REDACTED}@{host}"
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_QUERY_KEYS.search(k) for k, _ in pairs):
            query = urlencode([(k, REDACTED if _SECRET_QUERY_KEYS.search(k) else v) for k, v in pairs])
    if (netloc, query) == (parts.netloc, parts.query):
        # nothing secret: keep it byte for byte (urlunsplit would turn sqlite://// into sqlite://)
        return _scrub_secrets(uri)
    return _scrub_secrets(urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)))


def redact_mapping(values: Mapping[str, Any]) -> dict:
    """A copy of a flat mapping with every URI-looking string value redacted."""
    return {k: redact_uri(v) for k, v in values.items()}


def redact_text(text: str) -> str:
    """Redacts every URI inside free text (error messages, YAML) as :func:`redact_uri` does, and secret env values."""
    return _scrub_secrets(_URI_IN_TEXT.sub(lambda m: redact_uri(m.group(0)), text))
