"""train.precision: bf16 runs the training step's dense layers in bfloat16 under autocast, and nothing else."""

from __future__ import annotations

import pytest
import torch

from rayemb.data.schema import DatasetSchema, SparseFeature

SCHEMA = DatasetSchema(label="label", dense=("a", "b"), sparse=(SparseFeature("s1", 20), SparseFeature("s2", 30)))


def _dlrm():
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rayemb.contract.model import Embeddings
    from rayemb.contract.factory import ModelSpec
    from rayemb.contract.tables import table_configs

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=table_configs(SCHEMA, 8), device=torch.device("cpu"))
    spec = ModelSpec("rayemb.models.dlrm:dlrm", {"bottom_mlp": [16, 8], "top_mlp": [16, 1]}, "dlrm")
    model, _ = spec.build(Embeddings(ebc, tuple(SCHEMA.sparse_names), 8, device=torch.device("cpu")), SCHEMA)
    return model


def _batch(rows: int = 64):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rayemb.train.worker.step import StepBatch

    g = torch.Generator().manual_seed(1)
    ids = torch.cat([torch.randint(0, 20, (rows,), generator=g), torch.randint(0, 30, (rows,), generator=g)])
    kjt = KeyedJaggedTensor.from_lengths_sync(["s1", "s2"], ids, torch.ones(2 * rows, dtype=torch.int32))
    labels = (ids[:rows] % 2).float()  # learnable from s1
    return StepBatch((torch.rand(rows, 2, generator=g), kjt), labels, kjt)


@pytest.mark.parametrize("precision,dense_dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_bf16_runs_the_dense_layers_in_bfloat16_and_keeps_fp32_weights(precision, dense_dtype):
    from rayemb.train.worker.losses import TaskLoss
    from rayemb.train.worker.step import TrainStep

    model = _dlrm()
    seen = []
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for m in linears:
        m.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1)
    step = TrainStep(model, opt, TaskLoss(["label"]), precision=precision)
    batch = _batch()
    losses = [step(batch) for _ in range(40)]
    assert set(seen) == {dense_dtype} and len(seen) == 40 * len(linears)
    assert all(loss.dtype == torch.float32 for loss in losses)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert float(losses[-1]) < 0.8 * float(losses[0])  # it learns


def test_an_unknown_precision_names_the_choices():
    from rayemb.config import load_config
    from rayemb.errors import ConfigError

    with pytest.raises(ConfigError, match="train.precision.*fp16.*Use fp32, or bf16"):
        load_config("jobs/configs/synth_small.yaml", ["train.precision=fp16"])
