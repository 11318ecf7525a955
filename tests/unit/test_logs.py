"""rayemb.logs: credentials kept out of printed URIs, third-party log and warning noise dropped."""

from __future__ import annotations

import logging
import warnings

import pytest

from rayemb.logs import REDACTED, quiet_third_party_logs, redact_mapping, redact_text, redact_uri

# ---- redact_uri ---- #


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("http://alice:s3cret@mlflow.internal:5000/api", "http://alice:***@mlflow.internal:5000/api"),
        ("postgresql://bob:p@ss@db:5432/mlflow", "postgresql://bob:***@db:5432/mlflow"),  # last @ splits
        ("https://ghp_abc123@github.com/org/repo", "https://***@github.com/org/repo"),  # token-only userinfo
    ],
)
def test_redact_uri_hides_userinfo_secrets(uri, expected):
    assert redact_uri(uri) == expected


def test_redact_uri_redacts_secret_query_keys_and_keeps_the_others():
    uri = "http://host:5000/p?token=abc&x=1&password=pw&api_key=k&Signature=s&page=2#frag"
    assert redact_uri(uri) == (
        "http://host:5000/p?token=%2A%2A%2A&x=1&password=%2A%2A%2A&api_key=%2A%2A%2A&Signature=%2A%2A%2A&page=2#frag"
    )
    # the documented example, user and query at once
    assert redact_uri("http://alice:s3cret@mlflow.internal:5000/?token=abc&x=1") == (
        "http://alice:***@mlflow.internal:5000/?token=%2A%2A%2A&x=1"
    )


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:////abs/path/mlflow.db",  # urlunsplit would turn //// into //
        "sqlite:///relative.db",
        "file:///tmp/mlruns",
        "http://host:5000/?x=1&b=%20&empty=",  # no secret key: query kept byte for byte
        "/abs/plain/path",
        "runs/mlflow.db",
        "",
        "http://[::1",  # urlsplit raises ValueError
    ],
)
def test_redact_uri_leaves_uris_without_secrets_byte_for_byte(uri):
    assert redact_uri(uri) == uri


@pytest.mark.parametrize("value", [None, 5, 1.5, ["http://a:b@h"], b"http://a:b@h"])
def test_redact_uri_returns_non_strings_unchanged(value):
    assert redact_uri(value) is value


def test_redact_text_redacts_credentials_inside_free_text():
    text = ("could not reach postgresql://bob:hunter2@db:5432/mlflow (timeout); "
            "retrying http://alice:s3cret@mlflow:5000/api and sqlite:////tmp/x.db")
    assert redact_text(text) == ("could not reach postgresql://bob:***@db:5432/mlflow (timeout); "
                                 "retrying http://alice:***@mlflow:5000/api and sqlite:////tmp/x.db")
    assert redact_text("tracking_uri: http://u:p@h\n") == "tracking_uri: http://u:***@h\n"
    assert redact_text("nothing secret: /a/b and http://host/x") == "nothing secret: /a/b and http://host/x"


def test_redact_mapping_redacts_uri_values_in_a_copy():
    values = {"tracking_uri": "http://alice:s3cret@h:5000", "store": "sqlite:////abs/m.db", "epochs": 3,
              "name": "job"}
    out = redact_mapping(values)
    assert out == {"tracking_uri": f"http://alice:{REDACTED}@h:5000", "store": "sqlite:////abs/m.db", "epochs": 3,
                   "name": "job"}
    assert values["tracking_uri"] == "http://alice:s3cret@h:5000"  # input untouched
    assert out is not values


# ---- quiet_third_party_logs ---- #

_TOUCHED_LOGGERS = ("", "torchrec", "torchrec.distributed.utils", "torchrec.distributed.planner.planners", "fbgemm_gpu",
                    "alembic", "mlflow.store.db", "torch.fx._symbolic_trace")


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append((record.levelno, record.getMessage()))


@pytest.fixture
def restored_logging():
    """Root at DEBUG with a capturing handler; every logger, filter and warnings filter restored afterwards."""
    from rayemb.logs import _ThirdPartyNoiseFilter

    saved = {n: (logging.getLogger(n).level, list(logging.getLogger(n).filters)) for n in _TOUCHED_LOGGERS}
    # start from a process where nothing installed the filter yet (an earlier in-process CLI run may have)
    for n in _TOUCHED_LOGGERS:
        lg = logging.getLogger(n)
        lg.filters[:] = [f for f in lg.filters if not isinstance(f, _ThirdPartyNoiseFilter)]
        if n.startswith("torchrec"):
            lg.setLevel(logging.NOTSET)
    root = logging.getLogger()
    handler = _ListHandler()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    with warnings.catch_warnings():
        try:
            yield handler
        finally:
            root.removeHandler(handler)
            for n, (level, filters) in saved.items():
                lg = logging.getLogger(n)
                lg.setLevel(level)
                lg.filters[:] = filters


def _emit_noise_and_signal() -> None:
    logging.info("[TBE=abc] SplitTableBatchedEmbeddingBagsCodegen Arguments: {'embedding_specs': [(24, 8)]}")
    logging.warning("Sharding spec not found for .t0")
    logging.getLogger("torchrec.distributed.utils").warning(
        "Sharding Type is data_parallel, caching params will be ignored")
    logging.warning("something real")
    logging.error("[TBE=x] kernel failed")


def test_quiet_third_party_logs_drops_exactly_the_noise(restored_logging):
    handler = restored_logging
    _emit_noise_and_signal()
    assert len(handler.messages) == 5  # before: everything comes through (the capture works)
    handler.messages.clear()

    quiet_third_party_logs()
    _emit_noise_and_signal()
    assert handler.messages == [(logging.WARNING, "something real"), (logging.ERROR, "[TBE=x] kernel failed")]


def test_quiet_third_party_logs_lowers_chatty_loggers_but_keeps_stricter_levels(restored_logging):
    logging.getLogger("alembic").setLevel(logging.DEBUG)
    logging.getLogger("mlflow.store.db").setLevel(logging.ERROR)
    quiet_third_party_logs()
    assert logging.getLogger("alembic").level == logging.WARNING
    assert logging.getLogger("fbgemm_gpu").level >= logging.WARNING
    assert logging.getLogger("mlflow.store.db").level == logging.ERROR
    assert logging.getLogger("torch.fx._symbolic_trace").level == logging.ERROR


def test_quiet_third_party_logs_ignores_only_the_listed_warnings(restored_logging):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party_logs()  # inside: catch_warnings resets the filters on exit
        warnings.warn("`broadcast_buffers` is deprecated and will be removed in a future version", FutureWarning)
        warnings.warn("Please use DTensor instead and we are deprecating ShardedTensor.", FutureWarning)
        warnings.warn("`foo` is deprecated", FutureWarning)
        warnings.warn("`broadcast_buffers` is deprecated and will be removed", UserWarning)  # other category
    assert [(w.category, str(w.message)) for w in caught] == [
        (FutureWarning, "`foo` is deprecated"),
        (UserWarning, "`broadcast_buffers` is deprecated and will be removed"),
    ]


def test_quiet_third_party_logs_is_idempotent(restored_logging):
    from rayemb.logs import _ThirdPartyNoiseFilter

    quiet_third_party_logs()
    quiet_third_party_logs()
    for name in ("", "torchrec.distributed.utils", "torchrec.distributed.planner.planners"):
        filters = logging.getLogger(name).filters
        assert sum(isinstance(f, _ThirdPartyNoiseFilter) for f in filters) == 1, name
    broadcast = [f for f in warnings.filters if f[1] is not None and "broadcast_buffers" in f[1].pattern]
    assert len(broadcast) == 1
