"""Raw-id embedding tables: TorchRec managed-collision tables that map raw 64-bit ids to rows.

A raw-id feature (``ids: raw`` in schema.yaml) has no vocabulary: its table
of ``num_embeddings`` rows is a cache of the ids seen, kept by TorchRec's
``MCHManagedCollisionModule`` inside a ``ManagedCollisionEmbeddingBagCollection``
(:func:`build_raw_id_ebc`), sharded row-wise with
:class:`RawIdEmbeddingBagCollectionSharder` and :func:`row_wise_plan`.

How an id finds its row. The id becomes a key
(:func:`rayemb.embedding.raw_ids.raw_id_keys`, TorchRec's ``input_hash_func``);
row-wise sharding sends the key to the rank that owns its key range
(:func:`key_owner`), and that rank's module looks the key up in its sorted key
array: a hit gives the key's slot, a miss the rank's *default row*, the last
row of its shard. In training, every ``eviction_interval`` forward passes the
module first admits the keys seen since the last pass: while slots are free,
every new key gets one; then the policy chooses who stays (``lru``: the keys
seen most recently; ``lfu``: the keys seen most often, counts kept while a key
stays in the table), and a newcomer that loses the contest looks up the
default row. In eval mode nothing is admitted. Every row-wise shard keeps its
default row for itself, so a table of N rows on W ranks holds at most N - W ids.

What TorchRec's modules leave out, and :class:`RawIdMCH` (the MCH module the
builder uses) adds, once the table is sharded by
:class:`RawIdEmbeddingBagCollectionSharder`:

* **Reset of a reused slot.** TorchRec's sharded module resets an admitted
  slot's weight and row-wise Adagrad state through
  ``fbgemm::reset_weight_momentum``, which has no CPU kernel (the forward pass
  fails), and leaves other optimizers' state alone; the unsharded module resets
  nothing. Here the slot's weight is redrawn with the table's ``init_fn`` and
  every per-row state of the fused optimizer is zeroed, through FBGEMM's table
  views (no device-specific kernel).
* **A zero default row.** The default row is zeroed (weight and optimizer
  state) before every lookup, so an id the table does not hold (never seen,
  evicted, or refused) contributes a zero vector to its bag, in training and
  at inference, on any world size.
* **Eviction counts.** :func:`eviction_counts` reports per table how many ids
  lost their slot (to a newcomer or to the TTL), for logging.
* **TTL.** TorchRec's MCH policies (LRU, LFU, distance-LFU) have no time to
  live; TorchRec's TTL lives in the hash-ZCH module (``HashZchManagedCollisionModule``
  with ``HashZchEvictionConfig.single_ttl``, in hours). With ``ttl_s`` set, a
  key not seen for that many seconds of ``clock`` (wall-clock by default) is
  dropped from the table at the next admission pass and its slot reset.
* **Batches of any size.** TorchRec sizes its buffer of ids seen between
  admission passes from the first batch and silently drops what a larger one
  adds (such ids would never be admitted); the buffer grows instead.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torchrec.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
from torchrec.modules.mc_modules import (
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHEvictionPolicy,
    MCHManagedCollisionModule,
)

from rayemb.embedding.raw_ids import EMPTY_KEY, raw_id_keys
from rayemb.embedding.sharders import CpuCapableEmbeddingBagCollectionSharder
from rayemb.errors import ConfigError

#: the key range TorchRec's MCH modules bucketize over (its default, the whole non-negative int64 range)
INPUT_HASH_SIZE = (1 << 63) - 1
#: eviction policy names of schema.yaml, and TorchRec's policies behind them
POLICIES: Dict[str, Callable[[], MCHEvictionPolicy]] = {"lru": LRU_EvictionPolicy, "lfu": LFU_EvictionPolicy}
#: the per-slot timestamp buffer of a TTL table (seconds of its clock), beside TorchRec's policy metadata
LAST_ACCESS_S = "last_access_s"


class SlotRows:
    """The weight and fused optimizer state rows of one table's local shard (an FBGEMM TBE).

    Not a module, so the MCH module that holds it does not adopt the TBE as a
    submodule (its parameters and state would appear twice).
    """

    def __init__(self, tbe: Any, table_index: int, init_fn: Callable[[torch.Tensor], Any]) -> None:
        self.tbe, self.table_index, self.init_fn = tbe, table_index, init_fn

    def weight(self) -> torch.Tensor:
        """The shard's ``[rows, dim]`` weight (a view: writes reach the table)."""
        return self.tbe.split_embedding_weights()[self.table_index]

    def states(self) -> Dict[str, torch.Tensor]:
        """The optimizer's per-row states of the shard (views), e.g. ``sum`` of row-wise Adagrad: ``[rows]``."""
        if not hasattr(self.tbe, "get_optimizer_state"):
            return {}
        try:
            per_table = self.tbe.get_optimizer_state()
        except (NotImplementedError, AttributeError):  # optimizer NONE: no state
            return {}
        rows = self.weight().shape[0]
        return {k: v for k, v in per_table[self.table_index].items()
                if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == rows}

    @torch.no_grad()
    def reset(self, local_rows: torch.Tensor) -> None:
        """Redraws the weight of ``local_rows`` with the table's ``init_fn`` and zeroes their optimizer state."""
        if local_rows.numel() == 0:
            return
        weight = self.weight()
        idx = local_rows.to(device=weight.device, dtype=torch.int64)
        fresh = torch.empty((idx.numel(), weight.shape[1]), dtype=torch.float32, device=weight.device)
        self.init_fn(fresh)
        weight[idx] = fresh.to(weight.dtype)
        for state in self.states().values():
            state[idx.to(state.device)] = 0

    @torch.no_grad()
    def zero(self, local_rows: torch.Tensor) -> None:
        """Zeroes the weight and optimizer state of ``local_rows``."""
        weight = self.weight()
        weight[local_rows.to(weight.device)] = 0
        for state in self.states().values():
            state[local_rows.to(state.device)] = 0


class RawIdMCH(MCHManagedCollisionModule):
    """TorchRec's MCH module keyed by :func:`raw_id_keys`, with slot resets, a zero default row, counts and TTL.

    Built by :func:`build_raw_id_ebc`; TorchRec's sharder rebuilds one per
    rank for its key range (:meth:`rebuild_with_output_id_range`). Until
    :func:`bind_slot_rows` gives it its shard's rows (the sharder of this
    module does), it behaves as TorchRec's module: nothing is reset or zeroed.

    Attributes (this rank's shard, since construction): ``evictions`` (ids
    that lost their slot, TTL expiries included), ``expired`` (those of the
    TTL), ``admissions`` (ids that got a slot).
    """

    def __init__(self, zch_size: int, device: torch.device, eviction_policy: MCHEvictionPolicy,
                 eviction_interval: int, input_hash_size: int = INPUT_HASH_SIZE,
                 input_hash_func: Optional[Callable[[torch.Tensor, int], torch.Tensor]] = None,
                 mch_size: Optional[int] = None,
                 mch_hash_func: Optional[Callable[[torch.Tensor, int], torch.Tensor]] = None,
                 name: Optional[str] = None, output_global_offset: int = 0, output_segments: Optional[List[int]] = None,
                 buckets: int = 1, ttl_s: Optional[float] = None, clock: Callable[[], float] = time.time) -> None:
        super().__init__(zch_size=zch_size, device=device, eviction_policy=eviction_policy,
                         eviction_interval=eviction_interval, input_hash_size=input_hash_size,
                         input_hash_func=input_hash_func or raw_id_keys, mch_size=mch_size,
                         mch_hash_func=mch_hash_func, name=name, output_global_offset=output_global_offset,
                         output_segments=output_segments, buckets=buckets)
        self._ttl_s = ttl_s
        self._clock = clock
        self._slot_rows: Optional[SlotRows] = None
        self.evictions = self.expired = self.admissions = 0
        if ttl_s is not None:
            self.register_buffer("_mch_" + LAST_ACCESS_S, torch.zeros(zch_size, dtype=torch.int64, device=self.device))
            self._mch_metadata[LAST_ACCESS_S] = getattr(self, "_mch_" + LAST_ACCESS_S)

    @property
    def table(self) -> str:
        return str(self._name)

    @property
    def policy(self) -> str:
        """``lru`` or ``lfu``: the schema name of the eviction policy."""
        return next(n for n, cls in POLICIES.items() if isinstance(self._eviction_policy, cls))

    @property
    def offset(self) -> int:
        """The first global row of this module's slots."""
        return int(self._output_global_offset)

    @property
    def capacity(self) -> int:
        """Ids this module can hold: its slots less the default row."""
        return int(self._zch_size) - 1

    def metadata(self) -> Dict[str, torch.Tensor]:
        """Per-slot-position eviction metadata (TorchRec's ``counts`` / ``last_access_iter``, and the TTL's)."""
        return dict(self._mch_metadata)

    def rebuild_with_output_id_range(self, output_id_range: Tuple[int, int], output_segments: List[int],
                                     device: Optional[torch.device] = None) -> "RawIdMCH":
        return type(self)(zch_size=output_id_range[1] - output_id_range[0], device=device or self.device,
                          eviction_policy=self._eviction_policy, eviction_interval=self._eviction_interval,
                          input_hash_size=self._input_hash_size, input_hash_func=self._input_hash_func,
                          name=self._name, output_global_offset=output_id_range[0], output_segments=output_segments,
                          buckets=len(output_segments) - 1, ttl_s=self._ttl_s, clock=self._clock)

    def bind(self, rows: SlotRows) -> None:
        self._slot_rows = rows

    def profile(self, features: Dict[str, Any]) -> Dict[str, Any]:
        if self.training and self._input_history_buffer_size != -1:
            need = self._current_history_buffer_offset + sum(int(f.values().numel()) for f in features.values())
            if need > self._input_history_buffer_size:
                self._grow_history(max(need, 2 * self._input_history_buffer_size))
        return super().profile(features)

    @torch.no_grad()
    def _grow_history(self, size: int) -> None:
        # a later batch may be larger than the first (more ids per bag, or more routed to this rank): TorchRec
        # would drop the ids beyond the buffer it sized from the first one, and they would never be admitted
        used = self._current_history_buffer_offset

        def grown(old: torch.Tensor) -> torch.Tensor:
            new = torch.zeros(size, dtype=old.dtype, device=old.device)
            new[:used] = old[:used]
            return new

        self._history_accumulator = grown(self._history_accumulator)
        for name in list(self._history_metadata):
            self.register_buffer("_history_" + name, grown(self._history_metadata[name]), persistent=False)
            self._history_metadata[name] = getattr(self, "_history_" + name)
        self._input_history_buffer_size = size

    @torch.no_grad()
    def _keys_by_slot(self) -> torch.Tensor:
        out = torch.empty_like(self._mch_sorted_raw_ids)
        out[self._mch_remapped_ids_mapping - self.offset] = self._mch_sorted_raw_ids
        return out

    @torch.no_grad()
    def _update_and_evict(self, uniq_ids: torch.Tensor, uniq_ids_counts: torch.Tensor,
                          uniq_ids_metadata: Dict[str, torch.Tensor]) -> None:
        before = self._keys_by_slot()
        super()._update_and_evict(uniq_ids, uniq_ids_counts, uniq_ids_metadata)
        if self._ttl_s is not None:
            self._touch_and_expire(uniq_ids)
        after = self._keys_by_slot()
        changed = before != after
        self.admissions += int((changed & (after != EMPTY_KEY)).sum())
        self.evictions += int((changed & (before != EMPTY_KEY)).sum())

    @torch.no_grad()
    def _touch_and_expire(self, uniq_ids: torch.Tensor) -> None:
        keys = self._mch_sorted_raw_ids
        last = self._mch_metadata[LAST_ACCESS_S]
        now = int(self._clock())
        live = keys != EMPTY_KEY
        live[-1] = False  # the default row's position
        seen = live & torch.isin(keys, uniq_ids)
        last[seen] = now
        stale = live & ~seen & (now - last > self._ttl_s)
        if not bool(stale.any()):
            return
        pos = torch.nonzero(stale).flatten()
        slots = self._mch_remapped_ids_mapping[pos]
        keys[pos] = int(EMPTY_KEY)
        for buf in self._mch_metadata.values():
            buf[pos] = 0
        # TorchRec hands the slots it filled to evict(); expired ones are reset the same way
        self._evicted_emb_indices = torch.unique(torch.cat([self._evicted_emb_indices.to(slots), slots])) \
            if self._evicted else slots
        self._evicted = True
        self.expired += int(pos.numel())
        self._sort_mch_buffers()

    @torch.no_grad()
    def evict(self) -> Optional[torch.Tensor]:
        """Resets the slots filled since the last call itself (weight, optimizer state) when bound; then tells
        TorchRec there is nothing left to reset (its own reset has no CPU kernel)."""
        slots = super().evict()
        if self._slot_rows is None or slots is None:
            return slots
        self._slot_rows.reset(slots - self.offset)
        return None

    def remap(self, features: Dict[str, Any], mutate_miss_lengths: bool = True,
              write_weights: Optional[torch.Tensor] = None) -> Dict[str, Any]:
        if self._slot_rows is not None:
            # misses look up the default row: zero, whatever the optimizer did to it after the last lookup
            self._slot_rows.zero(torch.tensor([self._zch_size - 1]))
        return super().remap(features, mutate_miss_lengths, write_weights)


def build_raw_id_ebc(features: Sequence[Any], embedding_dim: Union[int, Mapping[str, int]], *,
                     device: Optional[torch.device] = None, eviction_interval: int = 1,
                     clock: Callable[[], float] = time.time) -> ManagedCollisionEmbeddingBagCollection:
    """A ``ManagedCollisionEmbeddingBagCollection`` with one sum-pooled table per raw-id feature.

    ``features``: :class:`rayemb.data.schema.SparseFeature` entries with
    ``ids == "raw"`` (table and KJT key = the feature name; ``num_embeddings``
    = the table's rows, ``eviction`` and ``ttl_hours`` its policy).
    ``embedding_dim``: one dim, or one per feature name. ``device``: ``meta``
    to shard it without allocating. ``eviction_interval``: forward passes
    between admission passes (1: an id gets a slot in the step that first
    sees it). ``clock``: seconds, for the TTL.

    The module's forward takes a KJT of raw int64 ids (strings go through
    :func:`rayemb.embedding.raw_ids.raw_ids_to_int64` first) and returns
    ``(KeyedTensor, None)``. Raises :class:`ValueError` for a feature that is
    not a pooled raw-id one.
    """
    device = device or torch.device("cpu")
    configs: List[EmbeddingBagConfig] = []
    modules: Dict[str, RawIdMCH] = {}
    for f in features:
        if f.ids != "raw" or f.sequence:
            raise ValueError(f"feature {f.name!r} is not a pooled raw-id feature (ids: raw); encoded features "
                             "use the ordinary embedding tables")
        dim = embedding_dim if isinstance(embedding_dim, int) else int(embedding_dim[f.name])
        configs.append(EmbeddingBagConfig(name=f.name, embedding_dim=dim, num_embeddings=int(f.num_embeddings),
                                          feature_names=[f.name]))
        ttl_s = None if f.ttl_hours is None else float(f.ttl_hours) * 3600.0
        modules[f.name] = RawIdMCH(zch_size=int(f.num_embeddings), device=device,
                                   eviction_policy=POLICIES[f.eviction](), eviction_interval=eviction_interval,
                                   name=f.name, ttl_s=ttl_s, clock=clock)
    ebc = EmbeddingBagCollection(configs, device=device)
    return ManagedCollisionEmbeddingBagCollection(ebc, ManagedCollisionCollection(modules, configs))


def raw_id_collection(tables: Sequence[EmbeddingBagConfig], features: Sequence[Any],
                      compression: Optional[Mapping[str, Any]] = None, device: Optional[torch.device] = None,
                      hot_rows: Optional[Mapping[str, int]] = None) -> ManagedCollisionEmbeddingBagCollection:
    """The raw-id tables of a job's pooled module: :func:`build_raw_id_ebc` of ``features`` with the dims of
    their ``tables`` (the job's ``EmbeddingBagConfig`` s, raw and encoded). ``hot_rows``: table -> rows of its
    capacity that a hybrid table keeps for its hot ids elsewhere (its managed-collision table gets the rest).
    Raises :class:`ConfigError` for a raw table stored in fp16 or compressed: its slots are rows of fp32 FBGEMM
    tables, whole."""
    configs, compressed = {t.name: t for t in tables}, compression or {}
    odd = sorted(f.name for f in features if configs[f.name].data_type != DataType.FP32 or f.name in compressed)
    if odd:
        raise ConfigError(f"Raw-id tables {odd} are fp32 and uncompressed only: set model.embedding_dtype: fp32 "
                          "and drop their compression pins, or encode their ids (drop `ids: raw`).",
                          category="invalid_option")
    hot = hot_rows or {}
    features = [replace(f, num_embeddings=int(f.num_embeddings) - int(hot.get(f.name, 0))) if hot.get(f.name) else f
                for f in features]
    return build_raw_id_ebc(features, {f.name: int(configs[f.name].embedding_dim) for f in features}, device=device)


def bind_slot_rows(sharded: Any) -> List[str]:
    """Gives every :class:`RawIdMCH` of a sharded MC-EBC its shard's rows; returns the tables bound.

    :class:`RawIdEmbeddingBagCollectionSharder` calls it; call it yourself
    only for a module sharded by TorchRec's own sharder.
    """
    mcc = sharded._managed_collision_collection
    bound: List[str] = []
    for table, mcm in mcc._managed_collision_modules.items():
        if not isinstance(mcm, RawIdMCH):
            continue
        tbe, index = sharded._table_to_tbe_and_index[table]
        rows = SlotRows(tbe, int(index.item()), sharded._embedding_module._table_name_to_config[table].init_fn)
        if rows.weight().shape[0] != mcm._zch_size:
            raise ValueError(f"raw-id table {table!r}: the shard has {rows.weight().shape[0]} rows, its MCH module "
                             f"{mcm._zch_size} slots; only ROW_WISE sharding lines them up")
        mcm.bind(rows)
        bound.append(table)
    return bound


class RawIdEmbeddingBagCollectionSharder(ManagedCollisionEmbeddingBagCollectionSharder):
    """TorchRec's MC-EBC sharder (ROW_WISE only, CPU included) that binds each shard's rows to its module.

    Pass it to ``DistributedModelParallel(sharders=[...])`` beside the job's
    other sharders, with a plan from :func:`row_wise_plan` (or the planner,
    constrained to ``row_wise`` and the ``fused`` kernel).
    """

    def __init__(self, fused_params: Optional[Dict[str, Any]] = None,
                 qcomm_codecs_registry: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(ebc_sharder=CpuCapableEmbeddingBagCollectionSharder(
            fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry),
            qcomm_codecs_registry=qcomm_codecs_registry)

    def shard(self, module: ManagedCollisionEmbeddingBagCollection, params: Dict[str, Any], env: Any,
              device: Optional[torch.device] = None, module_fqn: Optional[str] = None) -> Any:
        sharded = super().shard(module, params, env, device, module_fqn)
        bind_slot_rows(sharded)
        return sharded


def row_wise_plan(module: ManagedCollisionEmbeddingBagCollection, world_size: int, device_type: str = "cpu",
                  local_size: Optional[int] = None) -> Any:
    """The module's sharding plan: every table ROW_WISE with the fused kernel over ``world_size`` ranks.

    Put it under the module's path in a ``ShardingPlan``. Raises
    :class:`ValueError` when a rank's shard of a table would have fewer than
    2 rows (each shard keeps its last row as the default row).
    """
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise

    tables = [c.name for c in module._embedding_module.embedding_bag_configs()]
    plan = construct_module_sharding_plan(
        module, {t: row_wise(compute_kernel=EmbeddingComputeKernel.FUSED.value) for t in tables},
        sharder=RawIdEmbeddingBagCollectionSharder(), local_size=local_size or world_size, world_size=world_size,
        device_type=device_type)
    for table, ps in plan.items():
        sizes = [int(s.shard_sizes[0]) for s in ps.sharding_spec.shards]
        if len(sizes) < world_size or min(sizes) < 2:
            raise ValueError(f"raw-id table {table!r} cut row-wise over {world_size} ranks gives shards of {sizes} "
                             "rows; every rank needs at least 2 (one is its default row). Raise num_embeddings.")
    return plan


def raw_id_modules(model: torch.nn.Module) -> Dict[str, RawIdMCH]:
    """This rank's :class:`RawIdMCH` of every raw-id table in ``model`` (sharded or not), by table name."""
    return {m.table: m for m in model.modules() if isinstance(m, RawIdMCH)}


def eviction_counts(model: torch.nn.Module, across_ranks: bool = False) -> Dict[str, int]:
    """Ids that lost their slot per table since the model was built: this rank's shards, or all ranks'.

    ``across_ranks=True`` is a collective (every rank calls it; each gets the
    sum), e.g. for rank 0 to log one metric per table.
    """
    mods = raw_id_modules(model)
    if not mods:  # every rank holds the same tables: none of them calls the collective
        return {}
    names = sorted(mods)
    counts = torch.tensor([mods[n].evictions for n in names], dtype=torch.int64)
    if across_ranks:
        import torch.distributed as dist

        if dist.get_backend() == "nccl":
            counts = counts.cuda()
        dist.all_reduce(counts)
    return dict(zip(names, (int(c) for c in counts.cpu().tolist())))


def key_owner(keys: np.ndarray, world_size: int, input_hash_size: int = INPUT_HASH_SIZE) -> np.ndarray:
    """The rank whose row-wise shard holds each key: FBGEMM's ``block_bucketize_sparse_features`` rule.

    Keys are read as unsigned 64-bit numbers; with ``b = ceil(input_hash_size / W)``
    a key below ``b·W`` goes to rank ``key // b``, a larger one to ``key mod W``.
    """
    u = np.asarray(keys, dtype=np.int64).view(np.uint64)
    block = np.uint64(-(-input_hash_size // world_size))
    w = np.uint64(world_size)
    return np.where(u < block * w, u // block, u % w).astype(np.int64)


__all__ = ["INPUT_HASH_SIZE", "LAST_ACCESS_S", "POLICIES", "RawIdEmbeddingBagCollectionSharder", "RawIdMCH",
           "SlotRows", "bind_slot_rows", "build_raw_id_ebc", "eviction_counts", "key_owner", "raw_id_collection",
           "raw_id_modules", "row_wise_plan"]
