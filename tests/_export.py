"""Shared step of the export equivalence tests: train a sharded job model, save it, score validation rows.

``tests/dist/test_export_equivalence.py``, ``test_compressed_export.py`` and
``test_sequence_export.py`` each plan the job's model their own way; what
follows the plan is the same: a few optimizer steps on this rank's slice of
the training rows, ``save_logical`` (the checkpoint ``rayemb export`` reads),
and this rank's half of the validation rows scored as
``rayemb.train.worker.validation.evaluate`` does. :func:`fixed_job_plan` plans a job's
model with placements given table by table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import numpy as np


def train_save_score(rank: int, world_size: int, cfg: Any, schema: Any, job_plan: Any, checkpoint: str,
                     steps: int, batch: int) -> Tuple[Any, Dict[str, Any]]:
    """(model, {"lo": first validation row scored, "logits": this rank's logits, "losses": each step's training
    loss on this rank}) after ``steps`` steps."""
    import pyarrow.parquet as pq
    import torch

    from rayemb.checkpoint.store import save_logical
    from rayemb.data.batching import BatchConverter
    from rayemb.data.schema import parquet_files
    from rayemb.contract.tables import sequence_features, table_configs
    from rayemb.train.worker.build import sharded_model

    torch.manual_seed(cfg.train.seed)
    model, optimizer, remapper = sharded_model(cfg, schema, job_plan, torch.device("cpu"))
    history = bool(sequence_features(cfg.model, schema))
    convert = BatchConverter(schema, cfg.data.id_policy, remap=remapper.remap, sequence=history)

    def forward(b: Any) -> Any:
        return model(b.dense, b.sparse, b.sequence) if history else model(b.dense, b.sparse)

    train = pq.read_table(parquet_files(cfg.data.path, "train"))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses = []
    for step in range(steps):
        b = convert(train.slice((step * world_size + rank) * batch, batch))
        loss = loss_fn(forward(b), b.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    tables = {t.name: (t.num_embeddings, t.embedding_dim) for t in table_configs(schema, cfg.model.embedding_dim)}
    tables.update({f.name: (f.num_embeddings, f.embedding_dim) for f in sequence_features(cfg.model, schema)})
    from rayemb.data.transforms import checkpoint_entry

    save_logical(checkpoint, model, optimizer, remapper, tables,
                 {**checkpoint_entry(schema), "epoch": 0, "step": steps, "epoch_complete": True})
    valid = pq.read_table(parquet_files(cfg.data.path, "valid"))
    half = valid.num_rows // world_size
    model.eval()
    logits = []
    with torch.no_grad():
        for start in range(rank * half, (rank + 1) * half, batch):
            logits.append(forward(convert(valid.slice(start, min(batch, (rank + 1) * half - start)))).numpy())
    return model, {"lo": rank * half, "logits": np.concatenate(logits), "losses": losses}


def small_dataset(path: str, **changes: Any) -> str:
    """The equivalence tests' dataset at ``path``: 6 multi-hot tables of 30-60 rows, 4 of them carrying the label's
    signal, 1,400 rows (a fifth validation); ``changes`` replace any of those (``rows=600``, ``second_label=True``)."""
    from rayemb.data.synthetic import SyntheticSpec, generate

    spec = dict(rows=1400, num_tables=6, multi_hot=True, mean_pooling=3, seed=3, num_signal_tables=4,
                cardinalities=[60, 50, 40, 45, 30, 35], valid_fraction=0.2)
    generate(SyntheticSpec(**{**spec, **changes}), path)
    return path


def small_dataset_to_plan(path: str) -> Dict[str, Any]:
    """:func:`small_dataset` at ``path`` with what a plan needs: ``{"path", "schema", "stats"}`` (exact statistics
    per table)."""
    from rayemb.data.schema import DatasetSchema
    from rayemb.data.stats import compute_stats

    data = small_dataset(path)
    schema = DatasetSchema.load(data)
    return {"path": data, "schema": schema,
            "stats": schema.table_stats(compute_stats(data, exact=True, in_process=True))}


@dataclass(frozen=True)
class Placement:
    """A table's placement, as :func:`fixed_job_plan` gives it (the fields of ``rayemb.planner.types.TablePlan``
    that building the model reads)."""

    placement: str
    sharding_type: str


def fixed_job_plan(cfg: Any, schema: Any, plan: Dict[str, Tuple[str, str, Any]], dim: int, world_size: int) -> Any:
    """The JobPlan of ``plan`` (table -> (placement, sharding type of it or of a hybrid table's cold half, hot ids))
    for the job's model: TorchRec's planner with rayemb's constraints, column shards half of ``dim`` wide. A
    collective over the default process group."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    from rayemb.embedding.placements import hybrid_from_placements
    from rayemb.embedding.sharders import cpu_capable_sharders
    from rayemb.contract.tables import table_configs
    from rayemb.train.sharding import JobPlan, build_model

    placements = {t: Placement(p, s) for t, (p, s, _) in plan.items()}
    hot = {t: h for t, (p, _, h) in plan.items() if p == "hybrid"}
    meta = torch.device("meta")
    _, constraints = hybrid_from_placements(table_configs(schema, dim), placements, hot, device=meta)
    for c in constraints.values():
        if "column_wise" in c.sharding_types:
            c.min_partition = dim // 2
    meta_model, _, _ = build_model(cfg, schema, placements, hot, meta, meta)
    sharding = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                        constraints=constraints).collective_plan(meta_model, cpu_capable_sharders(),
                                                                                 dist.GroupMember.WORLD)
    return JobPlan(sharding_plan=sharding, placements=placements, hot_ids=hot, summary={})
