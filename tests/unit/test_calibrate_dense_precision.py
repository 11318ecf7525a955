"""The calibration's dense step runs in the job's precision, as the job's step does.

The calibration prices a plan's fixed dense step by timing the job's own model without its tables
(rayemb.train.calibration.dense). With ``train.precision: bf16`` the job's step runs its forward under bf16
autocast, so the calibrated one must too, else a bf16 job is priced at its fp32 step. The job's shape
(``job_shape``) is measured as a calibration rank measures it (``measure_rank``, one rank: no collectives);
a forward hook on the model its factory builds records the dtype of the model's output.
"""

from __future__ import annotations

from typing import Any, List

import pytest
import torch

from rayemb.config import config_from_dict
from rayemb.data.schema import DatasetSchema
from rayemb.contract.factory import ModelSpec
from rayemb.train.calibration.calibrate import job_shape, measure_rank

#: the dtypes of the recording model's outputs, one per forward
OUTPUT_DTYPES: List[torch.dtype] = []


def recording_dlrm(embeddings: Any, schema: Any, **args: Any) -> Any:
    """The shipped DLRM, its forward's output dtype recorded in OUTPUT_DTYPES."""
    from rayemb.models.dlrm import dlrm

    model = dlrm(embeddings, schema, **args)
    model.register_forward_hook(lambda module, inputs, output: OUTPUT_DTYPES.append(output.dtype))
    return model


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_the_dense_step_is_calibrated_in_the_jobs_precision(precision, dtype):
    schema = DatasetSchema.from_dict({"label": "label", "dense": ["I1", "I2", "I3"], "sparse": [
        {"name": f"C{i}", "num_embeddings": 20} for i in range(4)]})
    cfg = config_from_dict({"name": "t", "data": {"path": "d", "batch_size": 16},
                            "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [8, 1]},
                            "train": {"precision": precision}})
    spec = ModelSpec(recording_dlrm, {"bottom_mlp": [16, 8], "top_mlp": [8, 1]}, name="recording_dlrm")
    OUTPUT_DTYPES.clear()
    measured = measure_rank(torch.device("cpu"), 1, job_shape(cfg, schema, spec))
    assert measured["compute"]["dense_step_s"] > 0
    assert OUTPUT_DTYPES and set(OUTPUT_DTYPES) == {dtype}
