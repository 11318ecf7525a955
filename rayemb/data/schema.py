"""The dataset contract: which columns hold the label, dense and sparse features.

A dataset directory looks like::

    DIR/schema.yaml
    DIR/train/part-00000.parquet ...
    DIR/valid/part-00000.parquet ...

``schema.yaml``::

    schema_version: 1
    label: label                   # or a list, one label column per task: [click, like]
    group: user_id                 # optional: the column validation's group AUC groups by (int or string)
    task_types: {rating: regression}  # optional, per label: binary (the default) or regression
    weight: w                      # optional: a float column (finite, >= 0) weighing each row's loss and metrics
    dense: [I1, ..., I13]          # float32 columns
    dense_transform: log1p         # optional: the transform of dense columns not named below (default log1p)
    dense_transforms:              # optional, per dense column: log1p, standardize, identity, {clip: [lo, hi]}
      I1: standardize
    sparse:                        # int64 (one-hot) or list<int64> (multi-hot) columns
      - {name: C1, num_embeddings: 45834, multi_hot: false}
      - {name: H1, num_embeddings: 45834, sequence: true, max_length: 20, target: C1}
      - {name: U1, num_embeddings: 1000000, multi_hot: false, ids: raw, eviction: lfu, ttl_hours: 72}
      - {name: item, num_embeddings: 50000, embedding_dim: 32}
      - {name: history, multi_hot: true, table: item}   # reads item's table (rows and dim)

Each sparse feature is looked up in its own embedding table of ``num_embeddings``
rows, ``embedding_dim`` wide (default ``model.embedding_dim``; a multiple of
:data:`DIM_MULTIPLE`), or with ``table: F`` in pooled feature ``F``'s table
(one TorchRec table, both features in its ``feature_names``; its statistics
are those of the union of their ids, :meth:`DatasetSchema.table_stats`);
ids must lie in ``[0, num_embeddings)``. An ``ids: raw`` feature instead
holds ids of any int64 value or strings (string, or list<string> when
multi-hot): ``num_embeddings`` is then the table's capacity, the ids it keeps
are chosen by ``eviction`` (``lru``, the default, or ``lfu``) and, with
``ttl_hours``, an id unseen that long leaves the table (docs/raw_ids.md,
:mod:`rayemb.embedding.raw_tables`); a raw feature is pooled, never a
sequence. ``ids: encoded`` (the default) is never written, so schema files
without raw features read and write as they always did. A ``sequence: true`` feature is a
list<int64> column of ids in time order (oldest first, e.g. a user's recent
items); it keeps one embedding per id (never pooled, never hybrid, never in the
stats or the pooled plan), cut to its ``max_length`` most recent ids, and
``target`` names the pooled feature its history is compared with (the user
history tower, docs/sequence.md). :class:`DatasetSchema` keeps sequence features
apart (``schema.sequence``) so every pooled consumer (stats, split, planner,
export) sees exactly the pooled features it always did. ``DIR`` may be a local path or a
URI (``s3://bucket/data``; :mod:`rayemb.storage`): the same checks, the same errors.

Every dense column goes through one transform before the model (:mod:`rayemb.data.transforms`): the one
``dense_transforms`` names, else ``dense_transform``, else ``log1p`` (so a schema naming none reads as it always
did). ``standardize``'s mean and std come from the statistics pass: :meth:`DatasetSchema.with_dense_params`.

A label is ``binary`` (0/1, binary cross-entropy on the model's logit) unless ``task_types`` names it
``regression`` (any finite value, MSE or Huber on the model's raw output, ``train.regression_loss``). Only
regression labels are kept in :attr:`DatasetSchema.task_types`, so a schema saying ``binary`` outright equals
one saying nothing. ``weight`` names a column whose value multiplies each row's loss and validation metric
terms (docs/data.md, "Task types and row weights").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml

from rayemb import storage
from rayemb.constants import SCHEMA_FILE, TRAIN_SPLIT, VALID_SPLIT
from rayemb.data.footers import read_footer, read_footer_schema, read_footers
from rayemb.data.transforms import BUCKETIZE, DEFAULT_KIND, STANDARDIZE, DenseTransform
from rayemb.errors import DataError
from rayemb.logs import redact_uri

SCHEMA_VERSION = 1
#: the ``ids`` kinds of a sparse feature: ids already in [0, num_embeddings), or raw int64 / string ids
ENCODED, RAW = "encoded", "raw"
ID_KINDS = (ENCODED, RAW)
#: a raw-id table's eviction policies (rayemb.embedding.raw_tables.POLICIES implements them)
EVICTION_POLICIES = ("lru", "lfu")
#: every key a sparse feature's schema.yaml entry may have
#: a label's task types: 0/1 labels under binary cross-entropy, or real-valued labels under a regression loss
BINARY, REGRESSION = "binary", "regression"
TASK_TYPES = (BINARY, REGRESSION)
FEATURE_KEYS = ("name", "num_embeddings", "multi_hot", "sequence", "max_length", "target", "ids", "eviction",
                "ttl_hours", "embedding_dim", "table")
#: a table's embedding_dim must be a multiple of this: FBGEMM's table-batched kernels (every sharding but
#: data-parallel) read rows in 4-element vectors, and column-wise shards split a row at multiples of it
DIM_MULTIPLE = 4


def _raw_only(name: Any, keys: List[str]) -> DataError:
    return DataError(f"Sparse feature {name!r} sets {keys} but not ids: raw; those keys belong to raw-id features "
                     "only. Add `ids: raw` or drop them.", category="invalid_schema")


@dataclass(frozen=True)
class SparseFeature:
    name: str
    num_embeddings: int
    multi_hot: bool = False
    #: a non-pooled id list in time order (see the module docstring); needs max_length
    sequence: bool = False
    #: sequence only: the most recent ids kept per sample
    max_length: Optional[int] = None
    #: sequence only: the pooled feature the history tower compares the history with
    target: Optional[str] = None
    #: ``encoded`` (ids in [0, num_embeddings)) or ``raw`` (any int64 or string id; num_embeddings is the capacity)
    ids: str = ENCODED
    #: raw only: which ids keep their rows when more arrive than fit, ``lru`` or ``lfu``
    eviction: str = "lru"
    #: raw only: an id unseen for this many hours leaves the table (None: never for its age alone)
    ttl_hours: Optional[float] = None
    #: its table's embedding dimension (None: ``model.embedding_dim``); a feature reading another's table has that
    #: table's
    embedding_dim: Optional[int] = None
    #: the feature whose table this feature reads (None: a table of its own, named after the feature)
    table: Optional[str] = None
    #: a bucketized dense column's boundaries (schema.yaml ``dense_transforms: {col: {bucketize: [...]}}``): its
    #: ids are the raw value's bucket, :meth:`rayemb.data.transforms.DenseTransforms.bucket_ids`; None: ids read
    #: from the column
    bucketize: Optional[Tuple[float, ...]] = None

    def __post_init__(self) -> None:
        if not self.name:
            raise DataError("A sparse feature in schema.yaml has an empty name; give every feature a column name.")
        if int(self.num_embeddings) < 1:
            raise DataError(
                f"Sparse feature {self.name!r} declares num_embeddings={self.num_embeddings}; "
                "it must be a positive row count (the number of distinct ids, ids in [0, num_embeddings))."
            )
        self._check_raw()
        self._check_table()
        if self.bucketize is not None and (self.multi_hot or self.sequence or self.ids != ENCODED
                                           or self.table is not None
                                           or self.num_embeddings != len(self.bucketize) + 1):
            raise DataError(f"Sparse feature {self.name!r} is a bucketized dense column: one encoded id per row "
                            f"in a table of its own of len(boundaries) + 1 rows. Declare it under dense_transforms "
                            f"(`{self.name}: {{bucketize: [b0, ..., bk]}}`), not in the sparse list.",
                            category="invalid_schema")
        if not self.sequence:
            extra = [k for k in ("max_length", "target") if getattr(self, k) is not None]
            if extra:
                raise DataError(f"Sparse feature {self.name!r} sets {extra} but not sequence: true; those keys belong "
                                "to sequence features only. Add `sequence: true` or drop them.",
                                category="invalid_schema")
            return
        ml = self.max_length
        if isinstance(ml, bool) or not isinstance(ml, int) or ml < 1:
            raise DataError(f"Sequence feature {self.name!r} needs max_length, a positive integer (the most recent "
                            f"ids kept per sample); got {ml!r}. Add e.g. `max_length: 20` to its entry in schema.yaml.",
                            category="invalid_schema")
        if self.multi_hot:
            raise DataError(f"Sparse feature {self.name!r} is both multi_hot and sequence; a sequence is never pooled. "
                            "Drop `multi_hot: true` (a sequence column is list<int64> anyway).",
                            category="invalid_schema")
        if self.target == self.name:
            raise DataError(f"Sequence feature {self.name!r} names itself as target; name the pooled feature its "
                            "history is compared with (e.g. the candidate item column).", category="invalid_schema")

    def _check_table(self) -> None:
        dim = self.embedding_dim
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1
                                or dim % DIM_MULTIPLE):
            raise DataError(f"Sparse feature {self.name!r} has embedding_dim: {dim!r}; a table's dim must be a positive "
                            f"multiple of {DIM_MULTIPLE} (FBGEMM's table-batched lookups and column-wise shards "
                            f"split rows in {DIM_MULTIPLE}-element vectors), e.g. 8, 16 or 32.",
                            category="invalid_schema")
        if self.table is None:
            return
        if not self.table or self.table == self.name:
            raise DataError(f"Sparse feature {self.name!r} has table: {self.table!r}; name another pooled feature "
                            "whose table it reads (e.g. `table: item`), or drop `table:` for a table of its own.",
                            category="invalid_schema")
        kind = "sequence: true" if self.sequence else "ids: raw" if self.ids == RAW else None
        if kind is not None:
            raise DataError(f"Sparse feature {self.name!r} sets table: {self.table!r} and {kind}; only pooled "
                            "features with encoded ids share a table. Declare a history that shares the item table "
                            "as a multi_hot pooled column (`multi_hot: true`, `table: item`), or drop `table:`.",
                            category="invalid_schema")

    def _check_raw(self) -> None:
        def bad(key: str, value: Any, allowed: str) -> DataError:
            return DataError(f"Sparse feature {self.name!r} has {key}: {value!r}; allowed: {allowed}.",
                             category="invalid_schema")

        if self.ids not in ID_KINDS:
            raise bad("ids", self.ids, " or ".join(ID_KINDS) + " (the default: encoded)")
        if self.eviction not in EVICTION_POLICIES:
            raise bad("eviction", self.eviction, " or ".join(EVICTION_POLICIES) + " (the default: lru)")
        ttl = self.ttl_hours
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0):
            raise bad("ttl_hours", ttl, "a positive number of hours, or no ttl_hours key (ids never expire)")
        if self.ids == ENCODED:
            extra = [k for k, v in (("eviction", self.eviction != "lru"), ("ttl_hours", ttl is not None)) if v]
            if extra:
                raise _raw_only(self.name, extra)
        elif int(self.num_embeddings) < 2:
            raise DataError(f"Raw-id feature {self.name!r} declares num_embeddings={self.num_embeddings}; a raw-id "
                            "table keeps one row for ids it does not hold, so it needs at least 2 (its capacity).",
                            category="invalid_schema")
        elif self.sequence:
            raise DataError(f"Sparse feature {self.name!r} is both ids: raw and sequence: true; raw ids are "
                            "supported for pooled features only. Encode the sequence's ids into [0, "
                            "num_embeddings) or drop `sequence: true`.",
                            category="invalid_schema")

    def to_dict(self) -> Dict[str, Any]:
        """The schema.yaml entry; pooled features keep their three keys (older readers and files stay alike)."""
        d: Dict[str, Any] = {"name": self.name, "num_embeddings": self.num_embeddings, "multi_hot": self.multi_hot}
        if self.sequence:
            d = {"name": self.name, "num_embeddings": self.num_embeddings, "sequence": True,
                 "max_length": self.max_length}
            if self.target is not None:
                d["target"] = self.target
        if self.ids == RAW:
            d.update(ids=RAW, eviction=self.eviction)
            if self.ttl_hours is not None:
                d["ttl_hours"] = self.ttl_hours
        if self.embedding_dim is not None:
            d["embedding_dim"] = self.embedding_dim
        if self.table is not None:
            d["table"] = self.table
        return d

    @classmethod
    def from_dict(cls, s: Dict[str, Any]) -> "SparseFeature":
        unknown = sorted(set(s) - set(FEATURE_KEYS))
        if unknown:
            raise DataError(f"Sparse feature {s.get('name')!r} in schema.yaml has unknown key(s) {unknown}; allowed: "
                            f"{', '.join(FEATURE_KEYS)}.", category="invalid_schema")
        # an explicit `eviction: lru` is the default's value, but still a raw-only key
        raw_only = [k for k in ("eviction", "ttl_hours") if s.get(k) is not None]
        if raw_only and s.get("ids", ENCODED) != RAW:
            raise _raw_only(s.get("name"), raw_only)
        return cls(str(s["name"]), int(s["num_embeddings"]), bool(s.get("multi_hot", False)),
                   bool(s.get("sequence", False)), s.get("max_length"),
                   None if s.get("target") is None else str(s["target"]),
                   s.get("ids", ENCODED), s.get("eviction", "lru"), s.get("ttl_hours"),
                   s.get("embedding_dim"), None if s.get("table") is None else str(s["table"]))


@dataclass(frozen=True)
class DatasetSchema:
    label: str
    dense: Tuple[str, ...]
    #: the pooled features (one-hot and multi-hot): every table of stats, split, planner and export
    sparse: Tuple[SparseFeature, ...]
    #: the sequence features (``sequence: true`` entries of schema.yaml's sparse list)
    sequence: Tuple[SparseFeature, ...] = ()
    #: the label columns of further tasks (schema.yaml ``label: [click, like]``): a multi-task model
    #: predicts one output per label, in :attr:`labels` order
    extra_labels: Tuple[str, ...] = ()
    #: the transform of dense columns :attr:`dense_transforms` does not name (schema.yaml ``dense_transform``)
    dense_transform: DenseTransform = DenseTransform("*", DEFAULT_KIND)
    #: the dense columns' own transforms (schema.yaml ``dense_transforms``), in dense column order
    dense_transforms: Tuple[DenseTransform, ...] = ()
    #: the column whose values group the validation rows for GAUC (schema.yaml ``group``; int or string, may be a
    #: sparse feature too), None: no GAUC
    group: Optional[str] = None
    #: (label, task type) of every label that is not binary (schema.yaml ``task_types``), in label order
    task_types: Tuple[Tuple[str, str], ...] = ()
    #: the column weighing each row's loss and validation metrics (schema.yaml ``weight``), None: every row 1
    weight: Optional[str] = None

    def __post_init__(self) -> None:
        self._bucketize_columns()
        self._check_tasks()
        if self.group is not None and (not self.group or self.group in self.labels):
            raise DataError(f"schema.yaml's group {self.group!r} must name a column other than the labels "
                            "(e.g. `group: user_id`).", category="invalid_schema")
        names = [*self.labels, *self.dense, *(f.name for f in self.sparse), *(f.name for f in self.sequence)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise DataError(f"schema.yaml names columns {dupes} more than once; every column must be unique.")
        if not self.sparse:
            raise DataError("schema.yaml declares no pooled sparse features; an embedding model needs at least one.")
        misplaced = [f.name for f in self.sparse if f.sequence] + [f.name for f in self.sequence if not f.sequence]
        if misplaced:
            raise DataError(f"Features {misplaced} are in the wrong list: DatasetSchema.sparse holds pooled features, "
                            ".sequence the `sequence: true` ones. Build it with DatasetSchema.from_dict.",
                            category="invalid_schema")
        pooled = set(self.sparse_names)
        for f in self.sequence:
            if f.target is not None and f.target not in pooled:
                raise DataError(f"Sequence feature {f.name!r} has target {f.target!r}, which is not a pooled sparse "
                                f"feature of this schema ({sorted(pooled)[:8]}...). Name the pooled column the "
                                "history is compared with (e.g. the candidate item).", category="invalid_schema")
        self._check_shared_tables()
        self._check_transforms()

    def _bucketize_columns(self) -> None:
        """The effective schema: every ``bucketize`` dense column leaves :attr:`dense` and :attr:`dense_transforms`
        and closes :attr:`sparse` as a one-hot feature of the same name (transforms module docstring). Runs where
        the schema is built, so every reader of ``dense``/``sparse`` sees the rewrite and none special-cases it;
        a schema already rewritten has no ``bucketize`` transform left, so rebuilding it changes nothing."""
        buckets = [t for t in self.dense_transforms if t.kind == BUCKETIZE]
        if self.dense_transform.kind == BUCKETIZE:
            raise DataError("schema.yaml's dense_transform (the default for unnamed columns) is bucketize; "
                            "boundaries are per column. Name each bucketized column under dense_transforms "
                            "(`age: {bucketize: [18, 25, 35, 50]}`).", category="invalid_schema")
        if not buckets:
            return
        taken = {f.name for f in (*self.sparse, *self.sequence)}
        for t in buckets:
            if t.column not in self.dense:
                raise DataError(f"schema.yaml's dense_transforms bucketizes {t.column!r}, which is not a dense "
                                f"column ({list(self.dense)[:8]}...). Add it to `dense` (a numeric column), or drop "
                                "its entry.", category="invalid_schema")
            if t.column in taken:
                raise DataError(f"Dense column {t.column!r} is bucketized (dense_transforms) and also a sparse "
                                f"feature; a bucketized column becomes the sparse feature {t.column!r} itself. Drop "
                                f"{t.column!r} from the sparse list, or drop its bucketize transform.",
                                category="invalid_schema")
        moved = {t.column for t in buckets}
        features = tuple(SparseFeature(t.column, len(t.boundaries) + 1, embedding_dim=t.embedding_dim,
                                       bucketize=t.boundaries)
                         for t in sorted(buckets, key=lambda t: self.dense.index(t.column)))
        object.__setattr__(self, "dense", tuple(c for c in self.dense if c not in moved))
        object.__setattr__(self, "dense_transforms", tuple(t for t in self.dense_transforms if t.column not in moved))
        object.__setattr__(self, "sparse", (*self.sparse, *features))

    @property
    def bucketized(self) -> List[str]:
        """The pooled features that are bucketized dense columns, in schema order (the last of :attr:`sparse`)."""
        return [f.name for f in self.sparse if f.bucketize is not None]

    def _check_shared_tables(self) -> None:
        """Every ``table:`` names a pooled feature with a table of its own, of the same rows and dim."""
        pooled = {f.name: f for f in self.sparse}
        for f in self.sparse:
            if f.table is None:
                continue
            owner = pooled.get(f.table)
            if owner is None:
                where = " (a sequence feature, whose table is not pooled)" if f.table in self.sequence_names else ""
                raise DataError(f"Sparse feature {f.name!r} has table: {f.table!r}, which is not a pooled sparse "
                                f"feature of this schema{where}. Name one of {sorted(pooled)[:8]}, or drop `table:`.",
                                category="invalid_schema")
            if owner.table is not None:
                raise DataError(f"Sparse feature {f.name!r} reads the table of {owner.name!r}, which itself reads "
                                f"{owner.table!r} ({f.name} -> {owner.name} -> {owner.table}); a table: must name "
                                f"the feature that owns the table. Write `table: {owner.table}` for {f.name!r}.",
                                category="invalid_schema")
            if owner.ids == RAW:
                raise DataError(f"Sparse feature {f.name!r} reads the table of {owner.name!r}, which holds raw ids "
                                "(ids: raw); only tables of encoded ids are shared. Drop `table:`.",
                                category="invalid_schema")
            if int(f.num_embeddings) != int(owner.num_embeddings):
                raise DataError(f"Sparse feature {f.name!r} reads the table of {owner.name!r} but declares "
                                f"num_embeddings={f.num_embeddings}, and {owner.name!r} {owner.num_embeddings}; a "
                                f"shared table has one row count. Give both {owner.num_embeddings} (or drop "
                                f"num_embeddings from {f.name!r}: it takes its table's).", category="invalid_schema")
            if f.embedding_dim is not None and f.embedding_dim != owner.embedding_dim:
                has = "model.embedding_dim" if owner.embedding_dim is None else f"embedding_dim {owner.embedding_dim}"
                raise DataError(f"Sparse feature {f.name!r} reads the table of {owner.name!r} but declares "
                                f"embedding_dim {f.embedding_dim}, and that table has {has}; a shared table has one "
                                f"dim. Set embedding_dim on {owner.name!r} only (drop it from {f.name!r}).",
                                category="invalid_schema")

    def _check_tasks(self) -> None:
        types = dict(self.task_types)
        unknown = [t for t in types if t not in self.labels]
        if unknown:
            raise DataError(f"schema.yaml's task_types names {unknown}, which are not label columns "
                            f"({self.labels}). Name label columns only, or add them to `label`.",
                            category="invalid_schema")
        for label, kind in types.items():
            if kind not in TASK_TYPES:
                raise DataError(f"schema.yaml's task_types gives label {label!r} the type {kind!r}; allowed: "
                                f"{', '.join(TASK_TYPES)} (the default: binary).", category="invalid_schema")
        # binary is the default: only the others are kept, in label order, so equal schemas compare equal
        object.__setattr__(self, "task_types", tuple((t, types[t]) for t in self.labels
                                                     if types.get(t, BINARY) != BINARY))
        if self.weight is not None:
            taken = [*self.labels, *self.dense, *(f.name for f in (*self.sparse, *self.sequence)), self.group]
            if not self.weight or self.weight in taken:
                raise DataError(f"schema.yaml's weight {self.weight!r} must name a float column of its own, not a "
                                "label, feature or group column (e.g. `weight: sample_weight`).",
                                category="invalid_schema")

    def task_type(self, label: str) -> str:
        """``binary`` or ``regression``: the task type of label column ``label``."""
        if label not in self.labels:
            raise KeyError(label)
        return dict(self.task_types).get(label, BINARY)

    @property
    def task_kinds(self) -> List[str]:
        """Every label's task type, in :attr:`labels` order."""
        return [self.task_type(t) for t in self.labels]

    @property
    def regression_labels(self) -> List[str]:
        """The labels of regression tasks, in :attr:`labels` order."""
        return [t for t, kind in self.task_types if kind == REGRESSION]

    def _check_transforms(self) -> None:
        named = [t.column for t in self.dense_transforms]
        unknown = [c for c in named if c not in self.dense]
        if unknown:
            raise DataError(f"schema.yaml's dense_transforms names {unknown}, which are not dense columns "
                            f"({list(self.dense)[:8]}...). Name dense columns only, or add them to `dense`.",
                            category="invalid_schema")
        if len(set(named)) != len(named):
            raise DataError(f"schema.yaml's dense_transforms names a column more than once: {named}.",
                            category="invalid_schema")
        if self.dense_transform.mean is not None:
            raise DataError("schema.yaml's dense_transform (the default for unnamed columns) gives a mean and std; "
                            "those are per column. Write `dense_transform: standardize`, or name the column under "
                            "dense_transforms.", category="invalid_schema")
        if [c for c in self.dense if c in named] != named:  # one order, so equal schemas compare equal
            object.__setattr__(self, "dense_transforms", tuple(sorted(
                self.dense_transforms, key=lambda t: self.dense.index(t.column))))

    def dense_transform_of(self, column: str) -> DenseTransform:
        """The transform of dense column ``column``: its own, else the schema's default."""
        for t in self.dense_transforms:
            if t.column == column:
                return t
        if column not in self.dense:
            raise KeyError(column)
        return dataclasses.replace(self.dense_transform, column=column)

    @property
    def standardized(self) -> List[str]:
        """The dense columns under ``standardize`` (their mean and std come from the statistics pass)."""
        return [c for c in self.dense if self.dense_transform_of(c).kind == STANDARDIZE]

    def with_dense_transforms(self, transforms: Mapping[str, DenseTransform]) -> "DatasetSchema":
        """This schema with ``transforms`` (column -> transform) as its columns' own; one that is the default's
        is left unsaid (the schema reads the same, and writes as schema.yaml would say it)."""
        merged = {t.column: t for t in self.dense_transforms}
        merged.update(transforms)
        default = {c: dataclasses.replace(self.dense_transform, column=c) for c in merged}
        return dataclasses.replace(self, dense_transforms=tuple(
            merged[c] for c in self.dense if c in merged and merged[c] != default[c]))

    def with_dense_params(self, stats: Any) -> "DatasetSchema":
        """This schema with every ``standardize`` column's mean and std taken from ``stats`` (a
        :class:`~rayemb.data.stats_types.DatasetStats` of the train split, whose value summary holds each dense
        column's moments); a schema without such columns is returned as it is."""
        columns = self.standardized
        if not columns:
            return self
        moments = getattr(getattr(stats, "values", None), "dense_moments", None) or {}
        missing = [c for c in columns if c not in moments]
        if missing:
            raise DataError(f"The statistics hold no mean and std of the standardize column(s) {missing} (a "
                            "stats.json written by an older rayemb). Recompute them: `rayemb stats --data DIR "
                            "--out stats.json`, or drop data.stats_path.", category="invalid_schema")
        return self.with_dense_transforms({c: DenseTransform(c, STANDARDIZE, mean=moments[c].mean,
                                                             std=moments[c].std) for c in columns})

    @property
    def labels(self) -> List[str]:
        """Every label column, one per task; the first is :attr:`label`."""
        return [self.label, *self.extra_labels]

    @property
    def sparse_names(self) -> List[str]:
        return [f.name for f in self.sparse]

    @property
    def tables(self) -> List[SparseFeature]:
        """The pooled features that own a table (no ``table:``), in schema order: one pooled table each, named
        after its feature, that its own feature and every feature naming it in ``table:`` read."""
        return [f for f in self.sparse if f.table is None]

    @property
    def table_names(self) -> List[str]:
        """The pooled tables' names, in schema order (the features of :attr:`tables`)."""
        return [f.name for f in self.tables]

    def table_of(self, feature: str) -> str:
        """The table pooled feature ``feature`` reads: its own name, or the feature its ``table:`` names."""
        f = self.feature(feature)
        return f.table if f.table is not None else f.name

    def table_features(self, table: str) -> List[str]:
        """The pooled features reading ``table``: its owner first, then the sharers in schema order."""
        return [f.name for f in self.sparse if self.table_of(f.name) == table]

    def table_dims(self, default: int) -> Dict[str, int]:
        """table -> its embedding dim (``default``: ``model.embedding_dim``, for a table declaring none)."""
        return {f.name: int(f.embedding_dim or default) for f in self.tables}

    @property
    def pooled_features(self) -> List[str]:
        """The pooled features in the order a pooled module (TorchRec's EBC, rayemb's hybrid one) returns their
        vectors: table by table, each table's owner then the features sharing it; :attr:`sparse_names` when no
        table is shared."""
        return [n for t in self.table_names for n in self.table_features(t)]

    def feature_dims(self, default: int) -> Tuple[int, ...]:
        """Every pooled feature's vector width (its table's dim), in :attr:`pooled_features` order."""
        dims = self.table_dims(default)
        return tuple(dims[self.table_of(f)] for f in self.pooled_features)

    def table_stats(self, stats: Any) -> Any:
        """``stats`` (a :class:`~rayemb.data.stats_types.DatasetStats` with one entry per pooled feature) with one
        entry per table: a shared table's counts are those of the union of its features' ids (an id's heavy-hitter
        counts added, lookups and bags too), so the hot/cold split and the planner see every lookup of the table.
        Returned as it is when no table is shared."""
        if len(self.tables) == len(self.sparse) or stats is None:
            return stats
        from rayemb.data.stats_types import TableStats

        merged: Dict[str, Any] = {}
        for table in self.table_names:
            parts = [stats.tables[f] for f in self.table_features(table) if f in stats.tables]
            if len(parts) <= 1:
                if parts:
                    merged[table] = parts[0]
                continue
            counts: Dict[int, int] = {}
            for p in parts:
                for i, c in p.heavy_hitters.tolist():
                    counts[i] = counts.get(i, 0) + c
            hh = sorted(counts.items(), key=lambda ic: (-ic[1], ic[0]))
            lows = [p.min_id for p in parts if p.min_id is not None]
            highs = [p.max_id for p in parts if p.max_id is not None]
            merged[table] = TableStats(
                num_embeddings=parts[0].num_embeddings, rows=max(p.rows for p in parts),
                values=sum(p.values for p in parts), distinct=max(p.distinct for p in parts), distinct_exact=False,
                invalid=sum(p.invalid for p in parts),
                invalid_examples=tuple(x for p in parts for x in p.invalid_examples)[:10],
                nulls=sum(p.nulls for p in parts), min_id=min(lows) if lows else None,
                max_id=max(highs) if highs else None,
                # lookups of the table per row: every feature's bags land in it
                pooling_mean=sum(p.pooling_mean for p in parts), pooling_max=sum(p.pooling_max for p in parts),
                heavy_hitters=hh, error_bound=sum(p.error_bound for p in parts), ids=parts[0].ids)
        return dataclasses.replace(stats, tables=merged)

    @property
    def sequence_names(self) -> List[str]:
        return [f.name for f in self.sequence]

    @property
    def raw_names(self) -> List[str]:
        """The pooled features with raw ids (``ids: raw``), in schema order."""
        return [f.name for f in self.sparse if f.ids == RAW]

    def feature(self, name: str) -> SparseFeature:
        for f in self.sparse:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_dict(self) -> Dict[str, Any]:
        """schema.yaml's mapping; the transform keys only where they differ from the defaults."""
        buckets = [f for f in self.sparse if f.bucketize is not None]  # written back as the dense columns they were
        d: Dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "label": self.labels if self.extra_labels else self.label,
            "dense": [*self.dense, *(f.name for f in buckets)],
        }
        if self.dense_transform.kind != DEFAULT_KIND:
            d["dense_transform"] = self.dense_transform.to_yaml()
        if self.dense_transforms or buckets:
            d["dense_transforms"] = {**{t.column: t.to_yaml() for t in self.dense_transforms},
                                     **{f.name: DenseTransform(f.name, BUCKETIZE, boundaries=f.bucketize,
                                                               embedding_dim=f.embedding_dim).to_yaml()
                                        for f in buckets}}
        d["sparse"] = [f.to_dict() for f in (*self.sparse, *self.sequence) if f.bucketize is None]
        if self.group is not None:
            d["group"] = self.group
        if self.task_types:
            d["task_types"] = dict(self.task_types)
        if self.weight is not None:
            d["weight"] = self.weight
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any], source: str = "schema") -> "DatasetSchema":
        declared = d.get("dense_transforms") or {}
        if not isinstance(declared, Mapping):
            raise DataError(f"{source}: dense_transforms must map dense column names to transforms (e.g. "
                            f"`dense_transforms: {{I1: standardize}}`); it holds {type(declared).__name__}.",
                            category="invalid_schema")
        default = DenseTransform.parse("dense_transform", d.get("dense_transform", DEFAULT_KIND))
        transforms = tuple(DenseTransform.parse(str(c), spec) for c, spec in declared.items())
        types = d.get("task_types") or {}
        if not isinstance(types, Mapping):
            raise DataError(f"{source}: task_types must map label columns to binary or regression (e.g. "
                            f"`task_types: {{rating: regression}}`); it holds {type(types).__name__}.",
                            category="invalid_schema")
        try:
            feats = [SparseFeature.from_dict(s) for s in _with_table_rows(d["sparse"])]
            labels = [str(x) for x in d["label"]] if isinstance(d["label"], list) else [str(d["label"])]
            if not labels:
                raise ValueError("'label' is an empty list")
            return cls(
                label=labels[0],
                extra_labels=tuple(labels[1:]),
                dense=tuple(str(c) for c in d.get("dense", [])),
                sparse=tuple(f for f in feats if not f.sequence),
                sequence=tuple(f for f in feats if f.sequence),
                dense_transform=dataclasses.replace(default, column="*"),
                dense_transforms=transforms,
                group=None if d.get("group") is None else str(d["group"]),
                task_types=tuple((str(t), str(kind)) for t, kind in types.items()),
                weight=None if d.get("weight") is None else str(d["weight"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DataError(
                f"{source} is malformed ({type(e).__name__}: {e}). It needs keys 'label', 'dense' and "
                "'sparse' (a list of {name, num_embeddings, multi_hot}); regenerate it with `rayemb gen-data` "
                "or fix it by hand."
            ) from None

    def save(self, directory: str) -> str:
        path = storage.join(directory, SCHEMA_FILE)
        if not storage.is_remote(path):
            with open(path, "w") as f:
                yaml.safe_dump(self.to_dict(), f, sort_keys=False)
            return path
        return storage.write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load(cls, directory: str) -> "DatasetSchema":
        path = storage.join(directory, SCHEMA_FILE)
        if not storage.isfile(path):
            raise DataError(
                f"No {SCHEMA_FILE} in data directory {redact_uri(directory)!r}. Point data.path at a directory made by "
                f"`rayemb gen-data --out DIR` (or write {SCHEMA_FILE} next to your parquet files)."
            )
        shown = redact_uri(path)
        try:
            d = yaml.safe_load(storage.read_text(path)) or {}
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
            raise DataError(
                f"{shown} is not valid YAML{at} ({getattr(e, 'problem', None) or type(e).__name__}). Fix the syntax, "
                "or regenerate the dataset with `rayemb gen-data`.", category="invalid_schema",
            ) from None
        if not isinstance(d, dict):
            raise DataError(f"{shown} must hold a mapping with keys label, dense and sparse; it holds "
                            f"{type(d).__name__}. Fix it, or regenerate the dataset with `rayemb gen-data`.",
                            category="invalid_schema")
        return cls.from_dict(d, source=shown)


def _with_table_rows(entries: List[Any]) -> List[Any]:
    """schema.yaml's sparse entries, one reading another's table (``table:``) without num_embeddings given
    that table's."""
    named = {e.get("name"): e for e in entries if isinstance(e, Mapping)}

    def rows(e: Mapping[str, Any], seen: Tuple[Any, ...]) -> Any:
        if e.get("num_embeddings") is not None or e.get("table") is None or e.get("name") in seen:
            return e.get("num_embeddings")
        target = named.get(e["table"])
        if target is None:
            raise DataError(f"Sparse feature {e.get('name')!r} has table: {e['table']!r}, which is not a sparse "
                            f"feature of this schema. Name one of {sorted(map(str, named))[:8]}, or drop `table:` "
                            "and give it num_embeddings.", category="invalid_schema")
        return rows(target, (*seen, e.get("name")))  # a chain is refused with its links named, once parsed

    return [{**e, "num_embeddings": rows(e, ())} if isinstance(e, Mapping) and e.get("num_embeddings") is None
            and e.get("table") is not None else e for e in entries]


def split_dir(data_dir: str, split: str) -> str:
    return storage.join(data_dir, split)


def parquet_files(data_dir: str, split: str = TRAIN_SPLIT) -> List[str]:
    """Sorted parquet files (URIs for a URI) of one split; raises DataError when there are none."""
    files = storage.list_files(split_dir(data_dir, split), ".parquet")
    if not files:
        shown = redact_uri(data_dir)
        raise DataError(
            f"Data directory {shown!r} has no parquet files under {split}/. Generate data with "
            f"`rayemb gen-data --out {shown} --rows N` or set data.path to a directory with "
            f"{TRAIN_SPLIT}/ and {VALID_SPLIT}/ parquet splits."
        )
    return files


def check_parquet_columns(schema: DatasetSchema, data_dir: str, split: str) -> None:
    """Checks the parquet schema of every file of ``split`` against ``schema``: presence and types.

    Reads only the file footers (a truncated file fails here, named), so it is
    cheap on any data size and runs before any work starts.
    """
    files = parquet_files(data_dir, split)
    where = redact_uri(split_dir(data_dir, split))
    for path, actual in zip(files, read_footers(files, read_footer_schema)):
        _check_file_columns(schema, actual, f"{where}/{storage.basename(path)}")


def count_rows(data_dir: str, split: str) -> int:
    """Rows of a split from the parquet footers (no data pages are read)."""
    import pyarrow.parquet as pq

    files = parquet_files(data_dir, split)
    if not storage.is_remote(data_dir):
        return sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    return sum(md.num_rows for md in read_footers(files, read_footer))


def _check_file_columns(schema: DatasetSchema, actual: Any, where: str) -> None:
    import pyarrow as pa

    missing = [c for c in [*schema.labels, *schema.dense, *schema.sparse_names, *schema.sequence_names,
                           *([schema.group] if schema.group else []), *([schema.weight] if schema.weight else [])]
               if c not in actual.names]
    if missing:
        raise DataError(
            f"Parquet file {where} is missing configured column(s) {missing}; it has {actual.names[:8]}"
            f"{'...' if len(actual.names) > 8 else ''}. Fix data.path, or make schema.yaml match the files."
        )

    def bad(col: str, want: str, got: Any) -> DataError:
        return DataError(
            f"Column {col!r} of parquet file {where} has type {got}, expected {want}. Rewrite the column with "
            f"that type (or fix its entry in schema.yaml)."
        )

    for col in [*schema.labels, *schema.dense, *schema.bucketized]:
        t = actual.field(col).type
        if not (pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_boolean(t)):
            raise bad(col, "a numeric type", t)
    if schema.weight and not (pa.types.is_floating(actual.field(schema.weight).type)
                              or pa.types.is_integer(actual.field(schema.weight).type)):
        raise bad(schema.weight, "a float type (the weight column)", actual.field(schema.weight).type)

    def raw_id_type(t: Any) -> bool:
        return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)

    for feat in schema.sparse:
        if feat.bucketize is not None:  # a numeric column, checked above with the dense ones
            continue
        t = actual.field(feat.name).type
        scalar, kind = (raw_id_type, "int64 or string") if feat.ids == RAW else (pa.types.is_integer, "int64")
        if feat.multi_hot:
            if not ((pa.types.is_list(t) or pa.types.is_large_list(t)) and scalar(t.value_type)):
                raise bad(feat.name, f"list<{kind}> (multi_hot: true)", t)
        elif not scalar(t):
            raise bad(feat.name, f"{kind} (multi_hot: false)", t)
    for feat in schema.sequence:
        t = actual.field(feat.name).type
        if not ((pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)):
            raise bad(feat.name, "list<int64> (sequence: true)", t)
    if schema.group and not raw_id_type(actual.field(schema.group).type):
        raise bad(schema.group, "int64 or string (the group column)", actual.field(schema.group).type)


def load_checked(data_dir: str, splits: Optional[List[str]] = None) -> DatasetSchema:
    """Loads ``DIR/schema.yaml`` and checks every split's parquet columns against it (``DIR`` may be a URI)."""
    storage.check_supported(data_dir, "Data path")
    if not storage.isdir(data_dir):
        shown = redact_uri(data_dir)
        raise DataError(
            f"Data path {shown!r} does not exist. Generate it with `rayemb gen-data --out {shown} "
            "--rows N`, or set data.path (e.g. `--set data.path=/abs/dir`) to an existing dataset."
        )
    schema = DatasetSchema.load(data_dir)
    for split in splits or [TRAIN_SPLIT, VALID_SPLIT]:
        check_parquet_columns(schema, data_dir, split)
    return schema
