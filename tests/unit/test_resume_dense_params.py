"""A resumed job trains with the ``standardize`` mean and std its checkpoint's model was trained with, not the ones
a new statistics pass gives (its weights are fitted to the former), and says so where they differ; a fresh job, a
checkpoint that recorded none, and a checkpoint whose figures match take this pass's."""

from __future__ import annotations

import numpy as np

from rayemb.checkpoint.meta import CheckpointMeta
from rayemb.data.checks import DenseMoments, ValueSummary
from rayemb.data.schema import DatasetSchema
from rayemb.data.stats_types import DatasetStats
from rayemb.data.transforms import checkpoint_entry, CHECKPOINT_KEY
from rayemb.train.driver.trainer import dense_params


def _schema() -> DatasetSchema:
    return DatasetSchema.from_dict({"label": "label", "dense": ["a", "b", "c"],
                                    "sparse": [{"name": "C1", "num_embeddings": 10}],
                                    "dense_transforms": {"a": "standardize", "b": "standardize"}})


def _stats(values: np.ndarray) -> DatasetStats:
    moments = {c: DenseMoments.of(values[:, i]) for i, c in enumerate(["a", "b", "c"])}
    return DatasetStats(rows=len(values), values=ValueSummary(rows=len(values), dense_moments=moments))


def _resume(trained: DatasetSchema):
    return ("ckpt", CheckpointMeta(epoch=0, step=10, dense_transforms=checkpoint_entry(trained)[CHECKPOINT_KEY]))


FIRST = np.array([[1.0, 2.0, 3.0], [3.0, 6.0, 1.0], [5.0, 1.0, 0.0]])
LATER = np.vstack([FIRST, [[100.0, 2.0, 0.0]]])  # rows appended since: column a's moments moved, b's too


def test_a_resumed_job_keeps_its_checkpoints_standardize_parameters(capsys):
    trained = _schema().with_dense_params(_stats(FIRST))
    fresh = _schema().with_dense_params(_stats(LATER))
    assert fresh.dense_transform_of("a") != trained.dense_transform_of("a")

    resumed = dense_params(_schema(), _stats(LATER), _resume(trained))

    for c in "ab":
        assert resumed.dense_transform_of(c) == trained.dense_transform_of(c)
    assert resumed.dense_transform_of("c") == fresh.dense_transform_of("c")  # log1p: nothing to keep
    line = capsys.readouterr().out
    assert "checkpoint's dense transforms" in line and "2 column(s)" in line
    assert trained.dense_transform_of("a").describe() in line and fresh.dense_transform_of("a").describe() in line


def test_the_same_statistics_resume_silently(capsys):
    trained = _schema().with_dense_params(_stats(FIRST))
    assert dense_params(_schema(), _stats(FIRST), _resume(trained)) == trained
    assert capsys.readouterr().out == ""


def test_a_fresh_job_or_a_checkpoint_without_transforms_takes_this_pass(capsys):
    fresh = _schema().with_dense_params(_stats(LATER))
    assert dense_params(_schema(), _stats(LATER), None) == fresh
    older = ("ckpt", CheckpointMeta(epoch=0, step=10))  # written before transforms were recorded
    assert dense_params(_schema(), _stats(LATER), older) == fresh
    # a column standardized now that the checkpoint's model saw under another transform: this pass's figures
    log1p_trained = DatasetSchema.from_dict({"label": "label", "dense": ["a", "b", "c"],
                                             "sparse": [{"name": "C1", "num_embeddings": 10}]})
    assert dense_params(_schema(), _stats(LATER), _resume(log1p_trained)) == fresh
    assert capsys.readouterr().out == ""
