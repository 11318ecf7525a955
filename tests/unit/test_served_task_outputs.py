"""What a served model returns per task: a binary task's probability, a regression task's raw output."""

from __future__ import annotations

import numpy as np

from rayemb.data.schema import DatasetSchema
from rayemb.serve.columns import sigmoid, task_outputs


def _schema(labels, task_types=None) -> DatasetSchema:
    d = {"label": labels, "dense": ["I1"], "sparse": [{"name": "C1", "num_embeddings": 10}]}
    if task_types:
        d["task_types"] = task_types
    return DatasetSchema.from_dict(d)


def test_a_regression_column_is_served_raw_and_a_binary_one_as_a_probability():
    logits = np.array([[-3.0, 4.5], [0.0, -1.25], [2.0, 3.0]], dtype=np.float32)
    served = task_outputs(logits, _schema(["click", "rating"], {"rating": "regression"}))
    np.testing.assert_array_equal(served[:, 1], logits[:, 1].astype(np.float64))
    np.testing.assert_array_equal(served[:, 0], sigmoid(logits[:, 0]))
    assert served.dtype == np.float64

    one = np.array([3.5, -2.0], dtype=np.float32)
    np.testing.assert_array_equal(task_outputs(one, _schema("rating", {"rating": "regression"})), one)
    np.testing.assert_array_equal(task_outputs(one, _schema("click")), sigmoid(one))
    np.testing.assert_array_equal(task_outputs(logits, _schema(["click", "like"])), sigmoid(logits))
