"""Value checks of labels/dense columns, early stopping, finding the user's error in Ray wrappers, float configs."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest

from rayemb.batch_shape import BatchShape
from rayemb.config import config_from_dict, load_config
from rayemb.data.checks import DenseMoments, ValueSummary, check_values
from rayemb.errors import ConfigError, DataError, RayembError, TrainingError, find_user_error
from rayemb.train.worker.loop import EarlyStopping

NAN, INF = float("nan"), float("inf")


def _dirty_table() -> pa.Table:
    return pa.table({
        "label": pa.array([0.0, 1.0, None, NAN, INF, 0.5, 2.0, 1.0], pa.float64()),
        "d_float": pa.array([1.0, NAN, INF, -INF, None, 0.0, 0.0, 0.0], pa.float32()),
        "d_clean": pa.array([0.1, 0.2, None, 0.4, 0.5, 0.6, 0.7, 0.8], pa.float64()),
        "d_int": pa.array([1, 2, 3, 4, 5, 6, 7, 8], pa.int64()),
    })


# ---- ValueSummary / check_values ---- #


def test_of_table_counts_bad_labels_and_non_finite_dense_values():
    s = ValueSummary.of_table(_dirty_table(), "label", ["d_float", "d_clean", "d_int"])
    assert (s.rows, s.label_nulls, s.label_non_finite, s.label_not_binary, s.label_positives) == (8, 1, 2, 2, 2)
    assert s.label_examples[:3] == [0.5, 2.0, INF]  # sorted unique bad values (NaN last)
    assert len(s.label_examples) == 4 and math.isnan(s.label_examples[3])
    assert s.dense_non_finite == {"d_float": 3}  # nulls are not counted; clean and integer columns absent


def test_of_table_clean_data_and_integer_labels():
    t = pa.table({"label": pa.array([0, 1, 1, 0], pa.int64()), "d": pa.array([0.5, None, 1.5, 2.0])})
    s = ValueSummary.of_table(t, "label", ["d"])
    # the dense column's moments are of what the transform sees: the null as 0
    assert s == ValueSummary(rows=4, label_positives=2, dense_moments={"d": DenseMoments(4, 1.0, 2.5, 0.0, 2.0)})
    check_values(s, "label", "train split")  # clean: no error


def test_of_table_without_label_column_checks_only_dense():
    s = ValueSummary.of_table(_dirty_table(), None, ["d_float"])
    assert (s.label_nulls, s.label_non_finite, s.label_positives) == (0, 0, 0)
    assert s.dense_non_finite == {"d_float": 3}


def test_summaries_merge_counts_and_cap_examples():
    a = ValueSummary(rows=10, label_nulls=1, label_non_finite=2, label_not_binary=3, label_positives=4,
                     label_examples=[0.5, 2.0, 3.0], dense_non_finite={"x": 1})
    b = ValueSummary(rows=5, label_nulls=10, label_non_finite=20, label_not_binary=30, label_positives=40,
                     label_examples=[2.0, 4.0, 5.0, 6.0], dense_non_finite={"x": 2, "y": 7})
    m = a + b
    assert (m.rows, m.label_nulls, m.label_non_finite, m.label_not_binary, m.label_positives) == (15, 11, 22, 33, 44)
    assert m.dense_non_finite == {"x": 3, "y": 7}
    assert m.label_examples == [0.5, 2.0, 3.0, 4.0, 5.0]  # union, at most 5
    assert a.dense_non_finite == {"x": 1} and a.rows == 10  # operands untouched
    assert sum([a, b], ValueSummary()) == m


def test_to_dict_from_dict_round_trip_through_json():
    s = ValueSummary(rows=8, label_nulls=1, label_non_finite=2, label_not_binary=2, label_positives=3,
                     label_examples=[0.5, 2.0], dense_non_finite={"d_float": 3})
    d = s.to_dict()
    assert d == {"rows": 8, "label": {"nulls": 1, "non_finite": 2, "not_binary": 2, "positives": 3,
                                      "examples": [0.5, 2.0]}, "dense_non_finite": {"d_float": 3}}
    assert ValueSummary.from_dict(json.loads(json.dumps(d))) == s
    assert ValueSummary.from_dict({}) == ValueSummary()


def test_check_values_names_column_count_and_split():
    s = ValueSummary(rows=12345, label_nulls=1234, label_positives=3)
    with pytest.raises(DataError) as e:
        check_values(s, "clicked", "valid split (data/synth/valid)")
    assert e.value.category == "invalid_values"
    assert str(e.value) == (
        "Dataset valid split (data/synth/valid) (12,345 rows): label column 'clicked' has 1,234 null value(s); "
        "rayemb trains click models, so labels must be 0 or 1 — drop or fix those rows."
    )


def test_check_values_reports_every_problem_of_a_dirty_table():
    s = ValueSummary.of_table(_dirty_table(), "label", ["d_float", "d_clean", "d_int"])
    with pytest.raises(DataError) as e:
        check_values(s, "label", "train split")
    msg = str(e.value)
    assert msg.startswith("Dataset train split (8 rows): label column 'label' has 1 null value(s); ")
    assert "label column 'label' has 2 NaN or infinite value(s)" in msg
    assert "label column 'label' has 2 value(s) that are not 0 or 1 (e.g. [0.5, 2.0, inf, nan])" in msg
    assert "dense column(s) 'd_float' (3) hold NaN or infinite values" in msg
    assert "d_clean" not in msg and "d_int" not in msg


def test_check_values_dense_only():
    with pytest.raises(DataError, match=r"Dataset train split \(100 rows\): dense column\(s\) 'a' \(2\), 'b' \(1,500\)"):
        check_values(ValueSummary(rows=100, dense_non_finite={"b": 1500, "a": 2}), "label", "train split")


# ---- EarlyStopping ---- #


def test_early_stopping_tracks_best_and_counts_epochs_without_gain():
    es = EarlyStopping(patience=2)
    assert es.update(0, 0.70) is False
    assert es.update(1, 0.69) is False  # 1 without gain
    assert es.update(2, 0.75) is False  # gain resets the count
    assert (es.best, es.best_epoch, es.bad_epochs) == (0.75, 2, 0)
    assert es.update(3, 0.75) is False  # equal is no gain
    assert es.update(4, 0.60) is True  # 2 without gain
    assert es.metrics() == {"best_valid_auc": 0.75, "best_epoch": 2.0}
    assert es.state() == {"best_valid_auc": 0.75, "best_epoch": 2, "epochs_without_gain": 2}


def test_patience_one_stops_after_first_epoch_without_gain():
    es = EarlyStopping(patience=1)
    assert es.update(0, 0.7) is False
    assert es.update(1, 0.8) is False
    assert es.update(2, 0.79) is True
    assert es.best_epoch == 1


def test_patience_none_never_stops_but_tracks_best():
    es = EarlyStopping(patience=None)
    assert [es.update(e, auc) for e, auc in enumerate([0.6, 0.9, 0.5, 0.4, 0.3, 0.2])] == [False] * 6
    assert (es.best, es.best_epoch, es.bad_epochs) == (0.9, 1, 4)


def test_nan_auc_counts_as_no_gain():
    es = EarlyStopping(patience=1)
    assert es.update(0, NAN) is True  # not even a first best
    assert (es.best, es.best_epoch) == (-INF, -1)
    es = EarlyStopping(patience=2)
    es.update(0, 0.7)
    assert es.update(1, NAN) is False
    assert es.update(2, NAN) is True
    assert (es.best, es.best_epoch) == (0.7, 0)


def test_early_stopping_restores_from_state():
    es = EarlyStopping(patience=2)
    es.update(0, 0.8)
    es.update(1, 0.7)
    # a checkpoint's extra entries hold the state plus epoch/step
    restored = EarlyStopping(patience=2, resumed={"epoch": 1, "step": 200, **es.state()})
    assert (restored.best, restored.best_epoch, restored.bad_epochs) == (0.8, 0, 1)
    assert restored.update(2, 0.79) is True  # the second epoch without gain, counting the one before the restart
    fresh = EarlyStopping(patience=2, resumed={})
    assert (fresh.best, fresh.best_epoch, fresh.bad_epochs) == (-INF, -1, 0)
    # a retrieval job follows its hit rate, under that metric's own name in reports and checkpoints
    hits = EarlyStopping(patience=2, metric="valid_hit_rate_at_50")
    hits.update(0, 0.3)
    assert hits.metrics() == {"best_valid_hit_rate_at_50": 0.3, "best_epoch": 0.0}
    from rayemb.train.worker.resume import position_from_meta

    meta = {"epoch": 0, "step": 10, "epoch_complete": True, **hits.state()}
    again = EarlyStopping(patience=2, resumed=position_from_meta(meta, BatchShape(4, 2)).bookkeeping, metric="valid_hit_rate_at_50")
    assert (again.best, again.best_epoch) == (0.3, 0)


# ---- find_user_error ---- #


class _TaskError(Exception):
    """Like Ray's RayTaskError: the worker's exception in ``.cause``."""

    def __init__(self, cause):
        super().__init__("task failed")
        self.cause = cause


class _WorkerGroupError(Exception):
    """Like Ray Train's WorkerGroupError: rank -> exception."""

    def __init__(self, failures):
        super().__init__("workers failed")
        self.worker_failures = failures


def test_find_user_error_returns_the_error_itself():
    err = DataError("bad data")
    assert find_user_error(err) is err


def test_find_user_error_through_cause_chain():
    err = DataError("bad data", category="invalid_values")
    try:
        try:
            raise err
        except DataError as inner:
            raise RuntimeError("UserCodeException") from inner
    except RuntimeError as outer:
        wrapped = outer
    assert find_user_error(wrapped) is err
    ctx = KeyError("x")
    ctx.__context__ = err  # implicit chaining also counts
    assert find_user_error(ctx) is err


def test_find_user_error_through_dot_cause_and_worker_failures():
    err = TrainingError("diverged")
    assert find_user_error(_TaskError(_TaskError(err))) is err
    group = _WorkerGroupError({0: RuntimeError("OOM"), 1: _TaskError(err)})
    assert find_user_error(group) is err
    assert find_user_error(RuntimeError("wrap").with_traceback(None)) is None


def test_find_user_error_prefers_plain_cause_of_an_as_instanceof_cause_wrapper():
    err = DataError("bad")

    class _Both(_TaskError, DataError):  # what RayTaskError.as_instanceof_cause() builds
        def __init__(self, cause):
            _TaskError.__init__(self, cause)

    assert find_user_error(_Both(err)) is err


def test_find_user_error_none_when_absent_and_on_cycles():
    assert find_user_error(ValueError("plain")) is None
    assert find_user_error(_WorkerGroupError({0: RuntimeError("a")})) is None
    assert find_user_error(_TaskError("not an exception")) is None
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert find_user_error(a) is None
    t1 = _TaskError(None)
    t2 = _TaskError(t1)
    t1.cause = t2
    assert find_user_error(t1) is None
    assert isinstance(find_user_error(_TaskError(ConfigError("c"))), RayembError)


# ---- config floats written 1e-3 ---- #

BASE = {"name": "t", "data": {"path": "data/x"}}


def test_set_override_coerces_yaml11_exponent_string_to_float():
    cfg = config_from_dict(BASE, ["train.dense_lr=1e-3", "train.embedding_lr=2E-2"])
    assert cfg.train.dense_lr == 0.001 and type(cfg.train.dense_lr) is float
    assert cfg.train.embedding_lr == 0.02


def test_load_config_coerces_exponent_strings_in_yaml_and_overrides(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: t\ndata:\n  path: data/x\ntrain:\n  embedding_lr: 5e-2\n")
    cfg = load_config(str(path), ["train.dense_lr=1e-3"])
    assert (cfg.train.dense_lr, cfg.train.embedding_lr) == (0.001, 0.05)


def test_non_numeric_float_still_rejected(tmp_path):
    with pytest.raises(ConfigError) as e:
        config_from_dict(BASE, ["train.dense_lr=abc"])
    assert str(e.value) == "Invalid config value train.dense_lr: expected a number, got 'abc'."
    path = tmp_path / "job.yaml"
    path.write_text("name: t\ndata:\n  path: data/x\n")
    with pytest.raises(ConfigError, match=r"job\.yaml: Invalid config value train\.dense_lr: expected a number"):
        load_config(str(path), ["train.dense_lr=abc"])
    with pytest.raises(ConfigError, match="train.dense_lr"):
        config_from_dict(BASE, ["train.dense_lr=-1e-3"])  # coerced, then validated: not positive


def test_planner_tie_margin_is_a_fraction():
    assert config_from_dict(BASE).planner.tie_margin == 0.05
    assert config_from_dict(BASE, ["planner.tie_margin=0"]).planner.tie_margin == 0.0
    with pytest.raises(ConfigError, match=r"planner\.tie_margin: 1\.5 is not in \[0, 1\)"):
        config_from_dict(BASE, ["planner.tie_margin=1.5"])
