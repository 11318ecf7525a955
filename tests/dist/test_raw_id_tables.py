"""A raw-id table sharded row-wise over gloo: it learns, resets reused slots, and its state moves between worlds.

2 ranks train a model whose only embedding table is a managed-collision
table of raw 64-bit ids (negative ones and ones above 2**62 among them,
drawn with Zipf frequencies), with fused row-wise Adagrad; the loss falls.
Its logical state (rayemb.checkpoint.raw_state) then loads into 3 ranks and
from there back into 2: every id of the vocabulary pools to the same vector
to 1e-6 in all three, and ids never seen pool to the zero default row. A
table too small for its ids evicts: a reused slot's weight is redrawn and its
optimizer state zeroed before the lookup, the evictions are counted, ids
outliving the TTL leave, and a load into a world whose shards hold fewer ids
drops the ones the policy ranks last, counted, keeping the rest exactly.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch

from rayemb.multiprocess import run_multiprocess

DIM = 8
LR = 0.1
LOCAL_BATCH = 24
GLOBAL_BATCH = LOCAL_BATCH * 6  # divisible by 2 and 3
UNSEEN = np.array([7, -(2 ** 63), 2 ** 63 - 1, 123456789], dtype=np.int64)


def _vocabulary() -> np.ndarray:
    rng = np.random.default_rng(0)
    ids = np.concatenate([rng.integers(-(2 ** 63), 2 ** 63 - 1, size=100, dtype=np.int64),
                          rng.integers(2 ** 62, 2 ** 63 - 1, size=30, dtype=np.int64),
                          np.arange(1000, 1020, dtype=np.int64)])
    ids = np.unique(ids)
    assert not np.isin(UNSEEN, ids).any()
    return rng.permutation(ids)


def _batch(step: int, rank: int, world_size: int, vocab: np.ndarray):
    """This rank's rows of global batch ``step``: bags of 1-3 Zipf-drawn ids, label = the sign of their scores."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    score = np.where(np.random.default_rng(1).random(len(vocab)) < 0.5, -1.0, 1.0)
    rng = np.random.default_rng(100 + step)
    lengths = rng.integers(1, 4, size=GLOBAL_BATCH)
    picks = rng.choice(len(vocab), size=int(lengths.sum()), p=weights / weights.sum())
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    labels = np.array([float(score[picks[offsets[i]:offsets[i + 1]]].sum() > 0) for i in range(GLOBAL_BATCH)])
    lo, hi = rank * GLOBAL_BATCH // world_size, (rank + 1) * GLOBAL_BATCH // world_size
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["u"], values=torch.from_numpy(vocab[picks[offsets[lo]:offsets[hi]]]),
        lengths=torch.from_numpy(lengths[lo:hi]))
    return kjt, torch.from_numpy(labels[lo:hi]).float()


class _Model(torch.nn.Module):
    def __init__(self, sparse: torch.nn.Module) -> None:
        super().__init__()
        self.sparse = sparse
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, kjt) -> torch.Tensor:
        return self.head(self.sparse(kjt)[0].values()).squeeze(1)


def _build(world_size: int, capacity: int, eviction: str, ttl_hours: Optional[float] = None, clock=None):
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingPlan
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from rayemb.data.schema import SparseFeature
    from rayemb.embedding.raw_tables import RawIdEmbeddingBagCollectionSharder, build_raw_id_ebc, row_wise_plan

    torch.manual_seed(0)
    feature = SparseFeature("u", capacity, ids="raw", eviction=eviction, ttl_hours=ttl_hours)
    sparse = build_raw_id_ebc([feature], DIM, device=torch.device("meta"), **({"clock": clock} if clock else {}))
    model = _Model(sparse)
    apply_optimizer_in_backward(RowWiseAdagrad, sparse.parameters(), {"lr": LR})
    plan = ShardingPlan({"sparse": row_wise_plan(sparse, world_size)})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                   sharders=[RawIdEmbeddingBagCollectionSharder()])
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    opt = CombinedOptimizer([dmp.fused_optimizer,
                             KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adagrad(ps, lr=LR))])
    return dmp, opt


def _pooled(dmp, ids: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This rank's share of the pooled vectors of ``ids``, one id per bag (every rank looks up as many bags)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    per = -(-len(ids) // world_size)
    mine = np.resize(UNSEEN, per * world_size)
    mine[:len(ids)] = ids
    mine = np.ascontiguousarray(mine[rank * per:(rank + 1) * per])
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["u"], values=torch.from_numpy(mine),
                                              lengths=torch.ones(per, dtype=torch.int64))
    dmp.eval()
    with torch.no_grad():
        out = dmp.module.sparse(kjt)[0].values().numpy().copy()
    dmp.train()
    return out


def _rank(rank: int, world_size: int, capacity: int, eviction: str, parts: Optional[List[dict]], steps: int,
          probe: np.ndarray) -> Dict[str, object]:
    import torch.nn.functional as F

    from rayemb.checkpoint.raw_state import export_raw_tables, load_raw_tables
    from rayemb.embedding.raw_tables import eviction_counts

    dmp, opt = _build(world_size, capacity, eviction)
    dropped = load_raw_tables(dmp, parts[rank::world_size]) if parts is not None else None
    vocab, losses = _vocabulary(), []
    for step in range(steps):
        kjt, labels = _batch(step, rank, world_size, vocab)
        loss = F.binary_cross_entropy_with_logits(dmp(kjt), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return {"losses": losses, "dropped": dropped, "pooled": _pooled(dmp, probe, rank, world_size),
            "part": export_raw_tables(dmp), "evictions": eviction_counts(dmp, across_ranks=True)["u"]}


def _gather(results: List[dict], n: int) -> np.ndarray:
    return np.concatenate([r["pooled"] for r in results])[:n]


def test_trained_table_scores_every_id_the_same_on_3_ranks_and_back_on_2():
    from rayemb.checkpoint.raw_state import IDS, merge_parts

    vocab = _vocabulary()
    probe = np.concatenate([vocab, UNSEEN])
    kw = dict(capacity=400, eviction="lfu", probe=probe)
    trained = run_multiprocess(_rank, 2, parts=None, steps=30, **kw)
    losses = np.mean([r["losses"] for r in trained], axis=0)
    assert losses[-5:].mean() < 0.8 * losses[:5].mean(), losses
    parts2 = [r["part"] for r in trained]
    state = merge_parts(parts2)["u"]
    assert trained[0]["evictions"] == 0 and 0 < len(state[IDS]) <= len(vocab)
    assert set(state[IDS].tolist()) <= set(vocab.tolist())
    assert (state["momentum1"] > 0).all() and (state["meta.counts"] > 0).all() and int(state["iter"]) == 30
    assert (state[IDS] < 0).any() and (state[IDS] > 2 ** 62).any()
    before = _gather(trained, len(probe))
    held = np.isin(probe, state[IDS])
    assert (np.abs(before[held]).sum(axis=1) > 0).all()
    np.testing.assert_array_equal(before[~held], 0.0)  # unseen ids: the zero default row

    on3 = run_multiprocess(_rank, 3, parts=parts2, steps=0, **kw)
    assert on3[0]["dropped"] == {"u": 0}
    np.testing.assert_allclose(_gather(on3, len(probe)), before, rtol=0, atol=1e-6)
    parts3 = [r["part"] for r in on3]
    back = run_multiprocess(_rank, 2, parts=parts3, steps=0, **kw)
    np.testing.assert_allclose(_gather(back, len(probe)), before, rtol=0, atol=1e-6)
    for other in (merge_parts(parts3)["u"], merge_parts([r["part"] for r in back])["u"]):
        assert sorted(other) == sorted(state)
        for key in state:
            np.testing.assert_array_equal(other[key], state[key], err_msg=key)


def _evicting_rank(rank: int, world_size: int) -> Dict[str, object]:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rayemb.checkpoint.raw_state import export_raw_tables
    from rayemb.embedding.raw_ids import EMPTY_KEY
    from rayemb.embedding.raw_tables import eviction_counts, raw_id_modules

    now = [1e9]
    dmp, opt = _build(world_size, 16, "lru", ttl_hours=1, clock=lambda: now[0])
    mcm = raw_id_modules(dmp)["u"]
    rows = mcm._slot_rows

    def forward(ids: np.ndarray) -> torch.Tensor:
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=["u"], values=torch.from_numpy(ids),
                                                  lengths=torch.ones(len(ids), dtype=torch.int64))
        return dmp(kjt).sum()

    old_ids = np.arange(1, 41, dtype=np.int64)  # 40 ids for 2 x 7 slots: the table fills
    forward(old_ids).backward()
    keys, weight, state = mcm._keys_by_slot().clone(), rows.weight().clone(), rows.states()["sum"].clone()
    assert bool((state[:-1] > 0).all()) and bool((keys[:-1] != EMPTY_KEY).all())
    loss = forward(np.arange(-40, 0, dtype=np.int64))  # 40 new ids, seen more recently: they take every slot
    now_keys, now_weight, now_state = mcm._keys_by_slot(), rows.weight(), rows.states()["sum"]
    reused = (now_keys != keys)[:-1]
    assert bool(reused.all())
    # before the new ids' first update: fresh rows from the table's init (|w| <= sqrt(1/16)), no optimizer state
    assert bool((now_state[:-1] == 0).all()) and bool((now_weight[:-1] != weight[:-1]).any(dim=1).all())
    assert float(now_weight[:-1].abs().max()) <= 0.25
    assert bool((now_weight[-1] == 0).all()) and float(now_state[-1]) == 0.0
    loss.backward()
    evictions = eviction_counts(dmp, across_ranks=True)["u"]
    # two hours on, one id seen again: every other id has outlived the 1-hour TTL and leaves
    now[0] += 7200
    forward(np.array([-1, -1], dtype=np.int64)).backward()
    part = export_raw_tables(dmp)["u"]
    return {"evicted_here": int(reused.sum()), "evictions": evictions, "expired": mcm.expired,
            "after_ttl": eviction_counts(dmp, across_ranks=True)["u"], "left": part["ids"].tolist(),
            "seen_s": part["meta.last_access_s"].tolist()}


def test_reused_slots_are_reset_and_evictions_counted_and_a_smaller_world_drops_by_policy():
    from rayemb.checkpoint.raw_state import IDS, merge_parts
    from rayemb.embedding.raw_ids import raw_ids_to_keys
    from rayemb.embedding.raw_tables import key_owner

    res = run_multiprocess(_evicting_rank, 2)
    assert res[0]["evictions"] == res[1]["evictions"] == sum(r["evicted_here"] for r in res) == 14
    assert sum(r["expired"] for r in res) == 13 and res[0]["after_ttl"] == 14 + 13
    assert [r["left"] for r in res if r["left"]] == [[-1]]
    assert [r["seen_s"] for r in res if r["seen_s"]] == [[1e9 + 7200]]

    vocab = _vocabulary()
    probe = np.concatenate([vocab, UNSEEN])
    kw = dict(capacity=16, eviction="lru", probe=probe)
    full = run_multiprocess(_rank, 2, parts=None, steps=3, **kw)
    assert full[0]["evictions"] > 0
    state = merge_parts([r["part"] for r in full])["u"]
    assert len(state[IDS]) == 14  # 2 shards x (8 rows - the default row)
    before = _gather(full, len(probe))
    on3 = run_multiprocess(_rank, 3, parts=[r["part"] for r in full], steps=0, **kw)  # shards of 6, 6 and 4 rows
    after = _gather(on3, len(probe))
    kept = merge_parts([r["part"] for r in on3])["u"]
    assert on3[0]["dropped"]["u"] == 14 - len(kept[IDS]) > 0
    held = np.isin(probe, kept[IDS])
    np.testing.assert_allclose(after[held], before[held], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(after[~held], 0.0)
    # each shard keeps the ids it received that were seen last (LRU), the smaller key first among equals
    keys = raw_ids_to_keys(state[IDS])
    owner, last = key_owner(keys, 3), state["meta.last_access_iter"]
    for r in range(3):
        mine = np.nonzero(owner == r)[0]
        ranked = mine[np.lexsort((keys[mine], -last[mine]))]
        got = on3[r]["part"]["u"][IDS]
        assert sorted(state[IDS][ranked[:len(got)]].tolist()) == sorted(got.tolist()), r
