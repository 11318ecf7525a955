"""The unsharded inference model: the job's model over a plain ``EmbeddingBagCollection``, and how it scores rows.

A trained job exists as a logical checkpoint (:mod:`rayemb.checkpoint`): every
table in its logical row space, hot and cold rows of hybrid tables merged
back. :func:`inference_state` maps such a checkpoint onto a plain model —
one ``[num_embeddings, dim]`` table per sparse feature, ids as the dataset
has them (no hot/cold remap), the MLPs as trained. :class:`InferenceModel`
scores a pyarrow table or pandas DataFrame with the dataset's columns through
exactly the training preprocessing (:class:`~rayemb.data.batching.BatchConverter`:
the schema's dense transforms with the job's parameters, nulls as 0, one-/multi-hot bags, ``data.id_policy``)
and returns probabilities, ``sigmoid(logit)``: ``(N,)``, or ``(N, T)`` for a
multi-task model (schema.yaml ``label: [click, like]``; one column per label, in
that order). A retrieval model (one naming an ``item_feature``:
:mod:`rayemb.serve.retrieval`) returns pair scores and serves user and item vectors.

On disk (``rayemb export --out DIR``)::

    DIR/model.pt     the model's state dict, plain tensors (torch.load(..., weights_only=True))
    DIR/model.json   format, schema (its dense transforms with the parameters the job computed: standardize's
                     mean and std), model config (with the model's ``name``, ``factory``, ``args``), id_policy,
                     source run/checkpoint, step, valid_auc
    DIR/code/        a factory's module when it is not installed (:mod:`rayemb.serve.user_model`)
    DIR/model.torchscript.pt   torch.jit.script of the DLRM with its dense transforms
                     (:class:`rayemb.serve.scripted.ScriptedRanker`): ``forward(dense after the transforms,
                     KJT of logical ids) -> logits``, ``forward_raw(raw dense, KJT)`` applies the transforms
                     first (bucketized columns: raw values last in ``dense``, their ids computed and
                     appended to the KJT, :mod:`rayemb.serve.scripted`); load with torch.jit.load after ``import torchrec`` (its FBGEMM ops). Not written for
                     models with a user-history tower (``model.sequence_tower``): the DLRM skips that branch
                     under TorchScript, so a scripted form would silently score without the history
                     (model.json: ``torchscript: null`` and ``torchscript_skipped`` says why), nor for
                     models other than the shipped DLRM
    DIR/items.parquet  a retrieval model's catalogue: ``item`` id, ``item_embedding`` (list<float>)

A model of another factory (``model.name: dcn_v2``, ``model.factory``) is
rebuilt by its factory around the same plain tables
(:func:`rayemb.serve.user_model.build_factory_model`); the checkpoint's tables
go to wherever the model holds the embedding modules.

A model with raw-id tables (``ids: raw``, docs/raw_ids.md) keeps each as a plain
table of its capacity, the ids it held in rows ``0..n-1``, and maps raw ids (int64,
or strings hashed as in training) to those rows in the data path
(:mod:`rayemb.serve.raw_rows`; the ids travel in ``model.pt`` as ``raw_ids.<table>``):
an id unseen in training reads the zero row. No TorchScript form is written for it.

A model trained with sequence features (docs/sequence.md) is exported with its
``sequence`` EmbeddingCollection (one table per sequence feature, checkpoint
table ``<name>``) and its tower; it scores the history columns (``list<int64>``,
cut to their ``max_length`` most recent ids as in training) as further inputs.

``torch.export`` of the DLRM works too (non-strict), but specializes the batch
size and the id count of the example batch, so it is not written.

Example::

    >>> m = InferenceModel.load("models/criteo")
    >>> m.predict(pyarrow.parquet.read_table("data/criteo/valid/part-00000.parquet"))
    array([0.031, 0.274, ...])
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import pyarrow as pa

from rayemb.data.schema import DatasetSchema
from rayemb.errors import ConfigError, DataError
# the columns of scoring, re-exported: code that loads a model finds them next to it
from rayemb.serve.columns import (ITEM_EMBEDDING, PREDICTION_COLUMN, SCORE, USER_EMBEDDING, as_arrow, check_output,
                                  feature_columns, id_column, input_columns, missing_columns_error, sigmoid,
                                  task_outputs)

logger = logging.getLogger(__name__)

FORMAT = "rayemb-inference-v1"
STATE_FILE = "model.pt"
INFO_FILE = "model.json"
TORCHSCRIPT_FILE = "model.torchscript.pt"
#: rows converted and scored at once by :meth:`InferenceModel.predict`
DEFAULT_BATCH_ROWS = 8192
#: wrappers whose names DistributedModelParallel / DDP may leave in a training state-dict key
_WRAPPER_PREFIXES = ("_dmp_wrapped_module.", "module.")


def model_config(cfg: Any) -> Dict[str, Any]:
    """The ``model`` section of a :class:`~rayemb.config.JobConfig` as plain JSON values."""
    m = cfg.model
    return {"embedding_dim": int(m.embedding_dim), "bottom_mlp": [int(x) for x in m.bottom_mlp],
            "top_mlp": [int(x) for x in m.top_mlp], "sequence_tower": str(getattr(m, "sequence_tower", "none")),
            "name": str(m.name), "factory": m.factory, "args": dict(m.args or {})}


def uses_sequence(model_cfg: Mapping[str, Any]) -> bool:
    """Whether a model config (model.json's ``model``) has a user-history tower; exports made before
    ``sequence_tower`` existed have none."""
    return str(model_cfg.get("sequence_tower", "none")) != "none"


def _sequence_args(schema: DatasetSchema, model_cfg: Mapping[str, Any], device: Any) -> Dict[str, Any]:
    """The DLRM's sequence arguments as the training job passes them (rayemb.train.sharding.build_model)."""
    from rayemb.serve.user_model import sequence_parts

    sequence, features = sequence_parts(schema, model_cfg, device)
    return {"sequence": sequence, "sequence_features": features,
            "sequence_targets": {f.name: f.target for f in schema.sequence},
            "sequence_tower": str(model_cfg.get("sequence_tower", "none")) if features else "mean"}


def build_dlrm(schema: DatasetSchema, model_cfg: Mapping[str, Any], device: Any = None):
    """A plain DLRM (one EBC table per sparse feature) of the job's shape, on ``device`` (``meta``: no memory).

    ``model_cfg["compression"]`` (table -> storage, from the checkpoint's meta.json) makes the embedding a
    :class:`~rayemb.embedding.compressed.CompressedEmbeddingBagCollection` of the same compression.
    """
    import torch

    from rayemb.models.dlrm import DLRM
    from rayemb.serve.user_model import pooled_module

    device = torch.device(device or "cpu")
    ebc = pooled_module(schema, model_cfg, device)
    # one logit per label column, as the DLRM factory (rayemb.models.dlrm.dlrm) builds the training model
    top_mlp = [*model_cfg["top_mlp"][:-1], len(schema.labels)]
    return DLRM(ebc, feature_names=schema.pooled_features, dense_in_features=len(schema.dense),
                bottom_mlp=list(model_cfg["bottom_mlp"]), top_mlp=top_mlp, dense_device=device,
                **_sequence_args(schema, model_cfg, device))


def build_inference_model(schema: DatasetSchema, model_cfg: Mapping[str, Any],
                          device: Any = None) -> Tuple[Any, Dict[str, str]]:
    """(the plain model of ``model_cfg`` on ``device``, where it holds its embedding modules: ``pooled`` and, with
    sequence features, ``sequence``): :func:`build_dlrm` for the DLRM, else the model's factory."""
    from rayemb.serve.user_model import DLRM_PATHS, build_factory_model, is_dlrm

    if not is_dlrm(model_cfg):
        return build_factory_model(schema, model_cfg, device)
    model = build_dlrm(schema, model_cfg, device)
    return model, {k: v for k, v in DLRM_PATHS.items() if k == "pooled" or model.has_sequence}


def _strip_wrappers(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for p in _WRAPPER_PREFIXES:
            if key.startswith(p):
                key, changed = key[len(p):], True
    return key


def _table_of(key: str, paths: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The checkpoint table of an inference-model weight key (compressed ones: their physical tables), else None.

    ``paths``: where the model holds its pooled and sequence modules (default: the DLRM's)."""
    import re

    from rayemb.serve.user_model import DLRM_PATHS

    pooled, sequence = (re.escape(p) for p in ({**DLRM_PATHS, **(paths or {})}[k] for k in ("pooled", "sequence")))
    m = re.match(pooled + r"\.(?:bags\.)?embedding_bags\.([^.]+)\.weight$", key) or re.match(
        pooled + r"\.rows\.d\d+\.embeddings\.([^.]+)\.weight$", key) or re.match(
        sequence + r"\.embeddings\.([^.]+)\.weight$", key)
    return m.group(1) if m else None


def inference_state(unsharded: Mapping[str, Any], schema: DatasetSchema, model_cfg: Mapping[str, Any],
                    source: str = "checkpoint") -> Dict[str, Any]:
    """The plain model's state dict from :func:`rayemb.checkpoint.export.unsharded_state` (plain tensors, CPU).

    Tables go to ``<pooled>.embedding_bags.<t>.weight`` (``<pooled>``: where the
    model holds its pooled module, ``embedding`` in the DLRM; sequence tables
    likewise under ``<sequence>``); every other model tensor is the training
    model's dense tensor of the same name (wrapper prefixes removed). Raises
    :class:`DataError` (``bad_checkpoint``) when a table or MLP tensor is
    missing or of another shape: the checkpoint is not of this schema and
    model config.
    """
    target_model, paths = build_inference_model(schema, model_cfg, device="meta")
    from rayemb.serve.raw_rows import STATE_PREFIX, raw_table_rows

    target, projections = target_model.state_dict(), paths["pooled"] + ".projections."
    dense = {_strip_wrappers(k): v for k, v in unsharded["dense"].items()}
    fix = ("Export with the job config and dataset the checkpoint was trained with (the run's config.yaml and "
           "its data.path).")
    out: Dict[str, Any] = {}
    raw = unsharded.get("raw_tables", {})
    for key, want in target.items():
        table = _table_of(key, paths)
        if table in schema.raw_names:  # the ids it held in rows 0..n-1, then zeros (rayemb.serve.raw_rows)
            if table not in raw:
                raise DataError(f"{source} holds no raw-id table {table!r}. {fix}", category="bad_checkpoint")
            got, out[STATE_PREFIX + table] = raw_table_rows(raw[table], *want.shape)
        elif table is not None:
            got = unsharded["tables"].get(table, {}).get("weight")
            what = f"table {table!r}"
        elif key.startswith(projections):  # a block table's projection: the trained model's plain child
            got = dense.get(paths["pooled"] + ".plain." + key[len(paths["pooled"]) + 1:])
            what = f"model tensor {key!r}"
        else:
            got, what = dense.get(key), f"model tensor {key!r}"
        if got is None:
            raise DataError(f"{source} holds no {what}. {fix}", category="bad_checkpoint")
        if tuple(got.shape) != tuple(want.shape):
            raise DataError(f"{source} has {what} of shape {tuple(got.shape)}; this schema and model config make "
                            f"it {tuple(want.shape)}. {fix}", category="bad_checkpoint")
        out[key] = got.detach().to("cpu", want.dtype).contiguous().clone()
    return out


class InferenceModel:
    """A plain model in eval mode with its schema and id policy; :meth:`predict` returns probabilities (one
    column per task), or a retrieval model's pair scores (its vectors: :meth:`user_embeddings`,
    :meth:`item_embeddings`).

    Args:
        model: the model (:func:`build_inference_model`) with its weights loaded.
        schema: the training dataset's schema.
        id_policy: ``data.id_policy`` of the job (``error``, ``hash`` or ``clip``).
        info: ``model.json``: the model config (``model``: embedding_dim, bottom_mlp, top_mlp, name, factory,
            args) and where it came from.
        paths: where ``model`` holds its embedding modules (None: a DLRM's, ``sequence`` when it has one).
    """

    def __init__(self, model: Any, schema: DatasetSchema, id_policy: str = "error",
                 info: Optional[Dict[str, Any]] = None, paths: Optional[Mapping[str, str]] = None,
                 raw_rows: Any = None) -> None:
        from rayemb.data.batching import BatchConverter
        from rayemb.train.worker.retrieval import item_feature_of

        self.model = model.eval()
        self.schema = schema
        self.id_policy = id_policy
        self.info = dict(info or {})
        self.paths = dict(paths) if paths is not None else {
            "pooled": "embedding", **({"sequence": "sequence"} if getattr(model, "has_sequence", False) else {})}
        #: the model holds sequence embeddings (a user-history tower): it scores the schema's sequence columns too
        self.sequence = "sequence" in self.paths
        #: raw id -> row of the raw-id tables (rayemb.serve.raw_rows.RawIdRows), None without them
        self.raw_rows = raw_rows
        remap = raw_rows.remap if raw_rows is not None else None
        # ids are logical (one table per feature): no hybrid remap; raw ids become their rows
        self.converter = BatchConverter(schema, id_policy, remap=remap, sequence=self.sequence)
        #: a retrieval model's item feature (rayemb.train.worker.retrieval), None for a ranking model
        self.item_feature = item_feature_of(model)
        #: batches whose item column must hold an item on every row (pair scores, catalogue candidates)
        self.item_converter = None if self.item_feature is None else BatchConverter(
            schema, id_policy, remap=remap, sequence=self.sequence, keep_ids=self.item_feature)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def to(self, device: Any) -> "InferenceModel":
        self.model.to(device)
        return self

    # ---- building, saving and loading ---- #

    @classmethod
    def from_state(cls, state: Mapping[str, Any], schema: DatasetSchema, model_cfg: Mapping[str, Any],
                   id_policy: str = "error", info: Optional[Dict[str, Any]] = None,
                   device: Any = "cpu", code: Optional[str] = None) -> "InferenceModel":
        """Builds the model on the meta device and assigns ``state`` (no second copy of the tables).

        ``code``: a folder put first on ``sys.path`` before a factory is imported (an export's ``code/``)."""
        import itertools

        import torch

        from rayemb.serve.raw_rows import RawIdRows
        from rayemb.serve.user_model import put_on_path

        put_on_path(code)
        raw_rows, state = RawIdRows.split_state(state, schema)
        model, paths = build_inference_model(schema, model_cfg, device="meta")
        model.load_state_dict(dict(state), strict=True, assign=True)
        if any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers())):
            # a tensor of the model's own outside its state dict (a non-persistent buffer): built for real
            model, paths = build_inference_model(schema, model_cfg, device="cpu")
            model.load_state_dict(dict(state), strict=True)
        return cls(model.to(torch.device(device)), schema, id_policy, {**(info or {}), "model": dict(model_cfg)},
                   paths, raw_rows)

    def save(self, directory: str, torchscript: bool = True) -> None:
        """Writes ``model.pt``, ``model.json`` (and the TorchScript form; a retrieval model's ``items.parquet``)
        into ``directory`` (created; the caller renames it into place)."""
        import torch

        from rayemb.serve.user_model import copy_factory_code, is_dlrm, model_name

        os.makedirs(directory, exist_ok=True)
        model_cfg = self.info.get("model", {})
        code = copy_factory_code(model_cfg["factory"], directory) if model_cfg.get("factory") else None
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        state.update(self.raw_rows.state() if self.raw_rows is not None else {})
        torch.save(state, os.path.join(directory, STATE_FILE))
        scripted, skipped = None, None
        if not is_dlrm(model_cfg):
            skipped = (f"TorchScript forms are written for the shipped DLRM only; {model_name(model_cfg)} is rebuilt "
                       "by its factory: use model.pt (InferenceModel.load) or the pyfunc model")
        elif self.sequence:
            skipped = ("the DLRM skips its user-history branch under TorchScript (torch.jit.is_scripting), so a "
                       "scripted form would score without the history; use model.pt (InferenceModel.load)")
        elif self.raw_rows is not None:
            skipped = ("raw ids find their rows in the data path (rayemb.serve.raw_rows), which a scripted form "
                       "would not hold; use model.pt (InferenceModel.load) or the pyfunc model")
        elif torchscript:
            from rayemb.serve.scripted import ScriptedRanker

            try:
                transforms = self.converter.dense_transforms
                ranker = ScriptedRanker(self.model, transforms.module(), transforms.bucket_columns)
                torch.jit.script(ranker).save(os.path.join(directory, TORCHSCRIPT_FILE))
                scripted = TORCHSCRIPT_FILE
            except Exception as e:  # noqa: BLE001 - an optional form; the state dict is the model
                logger.warning("no TorchScript form written (torch.jit.script failed: %s: %s)", type(e).__name__, e)
        retrieval = None
        if self.item_feature is not None:  # the catalogue's vectors, for a nearest-neighbour index
            from rayemb.serve.retrieval import write_items

            retrieval = write_items(self, directory)
        info = {**self.info, "format": FORMAT, "schema": self.schema.to_dict(), "id_policy": self.id_policy,
                "torchscript": scripted, "torchscript_skipped": skipped, "code": code, "retrieval": retrieval}
        with open(os.path.join(directory, INFO_FILE), "w") as f:
            json.dump(info, f, indent=1, sort_keys=True)

    @classmethod
    def load(cls, directory: str, device: Any = "cpu") -> "InferenceModel":
        """The model ``rayemb export`` wrote to ``directory``; :class:`DataError` when it is not one."""
        import torch

        from rayemb.serve.user_model import code_dir

        info_path, state_path = os.path.join(directory, INFO_FILE), os.path.join(directory, STATE_FILE)
        if not (os.path.isfile(info_path) and os.path.isfile(state_path)):
            raise DataError(f"{directory!r} holds no exported model ({INFO_FILE} and {STATE_FILE}). Pass the --out "
                            "directory of `rayemb export`, or an MLflow URI (models:/NAME/VERSION, runs:/ID/model).",
                            category="not_a_model")
        with open(info_path) as f:
            info = json.load(f)
        if info.get("format") != FORMAT:
            raise DataError(f"{info_path} is of format {info.get('format')!r}, not {FORMAT}. Re-export the model "
                            "with this rayemb version (`rayemb export`).", category="not_a_model")
        schema = DatasetSchema.from_dict(info["schema"], source=info_path)
        state = torch.load(state_path, map_location="cpu", weights_only=True)
        return cls.from_state(state, schema, info["model"], info.get("id_policy", "error"), info, device,
                              code=code_dir(directory, info))

    # ---- scoring ---- #

    def check_columns(self, names: List[str], where: str, output: Optional[str] = None) -> None:
        """:class:`DataError` (``missing_columns``) when ``names`` lacks a feature column ``output`` (None: the
        model's default) reads."""
        have = set(names)
        need = input_columns(self.schema, self.sequence, self.item_feature, check_output(output, self.item_feature))
        missing = [c for c in need if c not in have]
        if missing:
            raise missing_columns_error(self.schema, missing, where)

    def _prepared(self, table: pa.Table) -> pa.Table:
        """The feature columns in the training types, and placeholder labels (scoring reads none). A retrieval
        model's item column may be absent (user vectors need no item): its bags are empty."""
        cols, names = [], []
        for c in self.schema.dense:
            cols.append(table.column(c))
            names.append(c)
        sequence = self.schema.sequence if self.sequence else ()
        for feat in (*self.schema.sparse, *sequence):
            absent = feat.name == self.item_feature and feat.name not in table.column_names
            cols.append(pa.nulls(table.num_rows, pa.int64()) if absent else id_column(table, feat))
            names.append(feat.name)
        for label in self.schema.labels:
            cols.append(pa.array(np.zeros(table.num_rows, dtype=np.float32)))
            names.append(label)
        return pa.Table.from_arrays(cols, names=names)

    def rows(self, data: Any, output: Optional[str] = None) -> pa.Table:
        """``data`` (pyarrow Table / RecordBatch or pandas DataFrame) checked for ``output``'s columns and
        converted to the training types."""
        table = as_arrow(data)
        self.check_columns(table.column_names, "The data to score", output)
        return self._prepared(table)

    def outputs(self, table: pa.Table, converter: Any = None, batch_rows: int = DEFAULT_BATCH_ROWS) -> Any:
        """The model's outputs of each batch of ``batch_rows`` rows of a :meth:`rows` table, under no_grad."""
        import torch

        from rayemb.contract.model import model_inputs

        converter, device = converter or self.converter, self.device
        with torch.no_grad():
            for start in range(0, table.num_rows, batch_rows):
                yield self.model(*model_inputs(converter(table.slice(start, batch_rows)), device))

    def logits(self, data: Any, batch_rows: int = DEFAULT_BATCH_ROWS) -> np.ndarray:
        """float32 logits of every row of ``data``: ``(N,)``, or ``(N, T)`` for T label columns; a retrieval
        model's are its pair scores (:meth:`predict`)."""
        if self.item_feature is not None:
            return self.predict(data, batch_rows)
        table, tasks = self.rows(data), len(self.schema.labels)
        out = []
        for logits in self.outputs(table, batch_rows=batch_rows):
            if tasks > 1 and tuple(logits.shape) != (len(logits), tasks):
                raise ConfigError(f"The model returned logits of shape {tuple(logits.shape)} for label columns "
                                  f"{self.schema.labels}; a multi-task model returns (B, {tasks}), one column per "
                                  "label in schema.yaml's order.", category="bad_model_output")
            out.append(logits.float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0,) if tasks == 1 else (0, tasks), dtype=np.float32)

    def predict(self, data: Any, batch_rows: int = DEFAULT_BATCH_ROWS) -> np.ndarray:
        """Probabilities ``sigmoid(logit)`` as float64 (computed in float64: no ties the logits do not have):
        ``(N,)``, or ``(N, T)`` for T label columns; a regression task's (schema.yaml ``task_types``) column is
        its raw output. A retrieval model: ``(N,)`` pair scores ``query . candidate`` (float64), not
        probabilities."""
        if self.item_feature is not None:
            from rayemb.serve.retrieval import pair_scores

            return pair_scores(self, self.rows(data, SCORE), batch_rows)
        return task_outputs(self.logits(data, batch_rows), self.schema)

    # ---- a retrieval model's vectors (rayemb.serve.retrieval) ---- #

    def user_embeddings(self, data: Any, batch_rows: int = DEFAULT_BATCH_ROWS) -> np.ndarray:
        """``(N, d)`` float32 query vectors of the rows of ``data`` (every feature column but the item's)."""
        from rayemb.serve.retrieval import user_vectors

        return user_vectors(self, self.rows(data, USER_EMBEDDING), batch_rows)

    def item_embeddings(self, ids: Any = None, batch_rows: int = DEFAULT_BATCH_ROWS) -> np.ndarray:
        """``(len(ids), d)`` float32 candidate vectors of item ``ids`` (None: the whole catalogue, every id of the
        item table, in id order)."""
        from rayemb.serve.retrieval import item_vectors

        check_output(ITEM_EMBEDDING, self.item_feature)  # a ranking model has no item vectors
        return item_vectors(self, ids, batch_rows)

    def item_ids(self, data: Any) -> np.ndarray:
        """The item column of ``data`` as int64 ids (a null is an error: it names no item)."""
        from rayemb.serve.retrieval import item_column

        check_output(ITEM_EMBEDDING, self.item_feature)
        return item_column(self, as_arrow(data))


__all__ = ["FORMAT", "INFO_FILE", "PREDICTION_COLUMN", "STATE_FILE", "TORCHSCRIPT_FILE", "InferenceModel", "build_dlrm",
           "build_inference_model", "feature_columns", "inference_state", "missing_columns_error", "model_config",
           "sigmoid", "uses_sequence"]
