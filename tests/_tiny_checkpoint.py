"""Tiny checkpoints for tests: a plain model's logical checkpoint written without a process group, and a
one-table model with its optimizer for tests that save through rayemb's own path.

``rayemb export`` reads what :func:`rayemb.checkpoint.store.save_logical` writes: a DCP checkpoint whose
tensors are ``tables.<table>.weight`` (whole tables, logical rows) and ``dense.<param>``, and a
``meta.json`` listing every file with its size and SHA-256. This writes the same from a freshly
initialized plain model (one rank), so tests of what happens around an export need neither Ray nor gloo.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict


def write_checkpoint(directory: str, schema: Any, model_cfg: Dict[str, Any], seed: int = 0) -> str:
    import torch
    import torch.distributed.checkpoint as dcp

    from rayemb.checkpoint.reader import FORMAT, META_FILE
    from rayemb.checkpoint.safe_reader import DCP_METADATA
    from rayemb.serve.model import _table_of, build_inference_model

    torch.manual_seed(seed)
    model, paths = build_inference_model(schema, model_cfg)  # the DLRM, or the model its factory builds
    state, tables = {}, {}
    for key, value in model.state_dict().items():
        table = _table_of(key, paths)
        if table is None:
            state[f"dense.{key}"] = value.detach().clone()
        else:
            state[f"tables.{table}.weight"] = value.detach().clone()
            tables[table] = {"num_embeddings": int(value.shape[0]), "dim": int(value.shape[1])}
    os.makedirs(directory, exist_ok=True)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(directory), no_dist=True)
    files = {}
    for name in sorted(os.listdir(directory)):
        if name == DCP_METADATA or name.endswith(".distcp"):
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read()
            files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    meta = {"format": FORMAT, "world_size": 1, "epoch": 0, "step": 3, "epoch_complete": True, "tables": tables,
            "states": ["weight"], "rng": [], "files": files}
    with open(os.path.join(directory, META_FILE), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    return directory


def tiny_model(seed: int, stepped: bool = False):
    """A one-table model (``plain.embedding_bags.t``: 6 rows of 4, data-parallel form, plus a dense layer) and
    its keyed Adagrad; ``stepped``: after one optimizer step on random gradients, so its state is not zero."""
    import torch
    from torchrec.optim.keyed import KeyedOptimizerWrapper

    torch.manual_seed(seed)
    model = torch.nn.Module()
    model.plain = torch.nn.Module()
    model.plain.embedding_bags = torch.nn.ModuleDict({"t": torch.nn.EmbeddingBag(6, 4)})
    model.top = torch.nn.Linear(4, 1)
    opt = KeyedOptimizerWrapper(dict(model.named_parameters()), lambda ps: torch.optim.Adagrad(ps, lr=0.1))
    if stepped:
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    return model, opt
