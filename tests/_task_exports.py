"""Exports of a multi-task and of a retrieval model for tests, without training: a plain model's checkpoint
(``tests/_tiny_checkpoint.py``) through ``rayemb export --checkpoint``, and the reference the export must equal.

``movielens`` converts a tiny MovieLens file (one-hot ``user`` and ``item``, multi-hot ``history``, dense
``history_length``), the data of a two-tower model; ``two_task_data`` is synthetic data with the second label
``like``. ``reference_outputs`` is the model its factory builds over a plain ``EmbeddingBagCollection``, the
checkpoint's tables and dense tensors copied in by name (not through rayemb.serve), on rows converted as
training converts them.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Tuple

import numpy as np


def movielens(root: str, users: int = 50, items: int = 30, seed: int = 0) -> str:
    """A converted MovieLens dataset of ``users`` users with 10 ratings each over ``items`` items; its path."""
    from rayemb.cli import main

    rng = np.random.default_rng(seed)
    raw, data = os.path.join(root, "ratings.dat"), os.path.join(root, "data")
    with open(raw, "w") as f:
        for u in range(1, users + 1):
            for k, m in enumerate(rng.choice(items, size=10, replace=False)):
                f.write(f"{u}::{m + 1}::{int(rng.integers(1, 6))}::{1_000_000 + 100 * u + k}\n")
    assert main(["convert", "movielens", "--input", raw, "--out", data]) == 0
    return data


def two_task_data(root: str) -> str:
    """Synthetic data with the labels ``label`` and ``like``; its path."""
    from rayemb.data.synthetic import SyntheticSpec, generate

    data = os.path.join(root, "data")
    generate(SyntheticSpec(rows=600, num_tables=4, multi_hot=True, mean_pooling=3, seed=3, num_signal_tables=2,
                           cardinalities=[60, 50, 40, 45], valid_fraction=0.2, second_label=True), data)
    return data


def export(root: str, data: str, model: Dict[str, Any], seed: int = 3) -> Tuple[str, str, Any]:
    """(export directory, its MLflow store, checkpoint) of a freshly initialised ``model`` section's model.

    Runs from ``root``: nothing MLflow writes lands elsewhere."""
    from rayemb.cli import main
    from rayemb.config import config_from_dict
    from rayemb.data.schema import DatasetSchema
    from rayemb.serve.model import model_config
    from tests._tiny_checkpoint import write_checkpoint

    cfg = config_from_dict({"name": "task-export", "data": {"path": data}, "model": {"embedding_dim": 4, **model},
                            "tracking": {"output_dir": os.path.join(root, "runs"), "experiment": "task-export"}})
    config = os.path.join(root, "job.yaml")
    with open(config, "w") as f:
        f.write(cfg.to_yaml())
    checkpoint = write_checkpoint(os.path.join(root, "ckpt"), DatasetSchema.load(data), model_config(cfg), seed=seed)
    out, uri = os.path.join(root, "model"), f"sqlite:///{root}/mlflow.db"
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["export", "--checkpoint", checkpoint, "--config", config, "--out", out,
                     "--tracking-uri", uri]) == 0
    finally:
        os.chdir(cwd)
    return out, uri, checkpoint


def reference_outputs(checkpoint: str, data_dir: str, model: Dict[str, Any], rows: Any) -> Any:
    """The factory's model output (numpy; a tuple for a retrieval model) on ``rows``."""
    import torch
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rayemb.checkpoint.export import unsharded_state
    from rayemb.config import config_from_dict
    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import DatasetSchema
    from rayemb.contract.model import Embeddings
    from rayemb.contract.factory import model_spec
    from rayemb.contract.tables import table_configs

    schema = DatasetSchema.load(data_dir)
    cfg = config_from_dict({"name": "ref", "data": {"path": data_dir}, "model": {"embedding_dim": 4, **model}})
    state = unsharded_state(checkpoint)
    ebc = EmbeddingBagCollection(table_configs(schema, 4))
    built, paths = model_spec(cfg.model).build(Embeddings(pooled=ebc, features=tuple(schema.sparse_names), dim=4),
                                               schema)
    with torch.no_grad():
        for name, table in ebc.embedding_bags.items():
            table.weight.copy_(state["tables"][name]["weight"])
        for key, value in built.state_dict().items():
            if not key.startswith(paths["pooled"] + "."):
                value.copy_(state["dense"][key])
        b = BatchConverter(schema, "error")(rows)
        out = built.eval()(b.dense, b.sparse)
    return tuple(o.numpy() for o in out) if isinstance(out, tuple) else out.numpy()
