"""A boto3 S3 client for what pyarrow's S3 filesystem cannot do in one request.

pyarrow reaches S3 for everything else (:mod:`rayemb.storage`), but two things need the S3 API itself:

* a **conditional write** (``If-Match`` / ``If-None-Match``), the commit point of a published output
  (:mod:`rayemb.publish`);
* a **whole-object read in one GET**: pyarrow's reader asks the object's size first and then reads that many
  bytes, so an object rewritten in between (a job record its driver updates while another process reads it)
  comes back as the first bytes of the newer version, cut at the older one's size. One GET returns one whole
  version.

The client reaches what pyarrow reaches for the same URI: credentials and ``endpoint_override`` / ``scheme`` /
``region`` in the URI, else the AWS environment. Without boto3 (it is a dependency, so only where someone removed
it) callers fall back to pyarrow and say what they lose, once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from typing import Any, Dict, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

logger = logging.getLogger(__name__)

#: environment that changes what an S3 client connects to (part of the client cache key; values are hashed)
_CLIENT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
               "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE")
_warned: set = set()
_clients: Dict[Tuple[str, str], Any] = {}
_clients_lock = threading.Lock()


def s3_client(uri: str) -> Any:
    """A boto3 S3 client reaching what pyarrow reaches for ``uri`` (credentials and ``endpoint_override`` /
    ``scheme`` / ``region`` in the URI, else the AWS environment); None for other stores, or without boto3."""
    if "://" not in uri or uri.split("://", 1)[0].lower() != "s3":
        return None
    try:
        import boto3
        import botocore.config
    except ImportError:
        if "boto3" not in _warned:
            _warned.add("boto3")
            logger.warning("boto3 is not installed: published outputs in S3 get their marker without a conditional "
                           "write, so run one publisher of an output at a time, and a file read while it is "
                           "rewritten can come back cut short (pip install boto3 lifts both)")
        return None
    parts = urlsplit(uri)
    env = hashlib.sha256("\0".join(os.environ.get(k, "") for k in _CLIENT_ENV).encode()).hexdigest()
    cache_key = (f"{parts.netloc}?{parts.query}", env)
    with _clients_lock:  # creating boto3 clients is not thread-safe
        client = _clients.get(cache_key)
        if client is None:
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            kwargs: Dict[str, Any] = {}
            if "@" in parts.netloc:
                access_key, _, secret = parts.netloc.rsplit("@", 1)[0].partition(":")
                kwargs.update(aws_access_key_id=unquote(access_key), aws_secret_access_key=unquote(secret))
            endpoint = query.get("endpoint_override")
            if endpoint:
                scheme = query.get("scheme", "https")
                kwargs["endpoint_url"] = endpoint if "://" in endpoint else f"{scheme}://{endpoint}"
            elif os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"):
                kwargs["endpoint_url"] = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ["AWS_ENDPOINT_URL"]
            region = query.get("region") or os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
            if region:
                kwargs["region_name"] = region
            config = botocore.config.Config(retries={"mode": "standard"})
            client = _clients[cache_key] = boto3.session.Session().client("s3", config=config, **kwargs)
    return client


__all__ = ["s3_client"]
