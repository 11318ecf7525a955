"""Raw-id features: the schema entries, the string hash and key mix, and an unsharded managed-collision table.

The sharded table (row-wise over gloo, slot resets, the world-size-free
checkpoint form) is tests/dist/test_raw_id_tables.py.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rayemb.data.schema import DatasetSchema, SparseFeature, check_parquet_columns
from rayemb.embedding.raw_ids import (
    EMPTY_KEY,
    FOLD_PARTNER_RAW_ID,
    FOLDED_KEY,
    FOLDED_RAW_ID,
    hash_string,
    keys_to_raw_ids,
    raw_id_keys,
    raw_ids_to_int64,
    raw_ids_to_keys,
)
from rayemb.errors import DataError


def _schema_dict(**raw):
    u = {"name": "U1", "num_embeddings": 100, "multi_hot": False, "ids": "raw", **raw}
    return {"label": "label", "dense": ["I1"], "sparse": [{"name": "C1", "num_embeddings": 10, "multi_hot": False}, u]}


# ---- schema ---- #


def test_raw_entries_round_trip_and_encoded_entries_keep_their_keys(tmp_path):
    s = DatasetSchema.from_dict(_schema_dict(eviction="lfu", ttl_hours=48))
    u = s.feature("U1")
    assert (u.ids, u.eviction, u.ttl_hours, u.num_embeddings) == ("raw", "lfu", 48, 100)
    assert s.feature("C1").ids == "encoded" and s.feature("C1").eviction == "lru"
    assert DatasetSchema.from_dict(s.to_dict()) == s
    entries = s.to_dict()["sparse"]
    # an encoded entry is written as before raw ids existed; a raw one with every key it has
    assert entries[0] == {"name": "C1", "num_embeddings": 10, "multi_hot": False}
    assert entries[1] == {"name": "U1", "num_embeddings": 100, "multi_hot": False, "ids": "raw", "eviction": "lfu",
                          "ttl_hours": 48}
    d = DatasetSchema.from_dict(_schema_dict())
    assert d.feature("U1").eviction == "lru" and "ttl_hours" not in d.to_dict()["sparse"][1]
    d.save(str(tmp_path))
    assert DatasetSchema.load(str(tmp_path)) == d


@pytest.mark.parametrize("change, words", [
    ({"ids": "hashed"}, r"'U1' has ids: 'hashed'; allowed: encoded or raw"),
    ({"eviction": "fifo"}, r"'U1' has eviction: 'fifo'; allowed: lru or lfu"),
    ({"ttl_hours": 0}, r"'U1' has ttl_hours: 0; allowed: a positive number"),
    ({"ttl_hours": "1d"}, r"'U1' has ttl_hours: '1d'"),
    ({"ttl_hours": True}, r"'U1' has ttl_hours: True"),
    ({"ids": "encoded", "eviction": "lru"}, r"'U1' sets \['eviction'\] but not ids: raw"),
    ({"ids": "encoded", "ttl_hours": 3}, r"'U1' sets \['ttl_hours'\] but not ids: raw"),
    ({"sequence": True, "max_length": 4, "multi_hot": False}, r"'U1' is both ids: raw and sequence: true"),
    ({"num_embeddings": 1}, r"'U1' declares num_embeddings=1; a raw-id table keeps one row"),
])
def test_bad_raw_entries_name_the_feature_the_key_and_what_is_allowed(change, words):
    with pytest.raises(DataError, match=words) as e:
        DatasetSchema.from_dict(_schema_dict(**change))
    assert e.value.category == "invalid_schema"


def test_dataclass_checks_what_from_dict_checks():
    with pytest.raises(DataError, match="sets \\['ttl_hours'\\] but not ids: raw"):
        SparseFeature("C", 5, ttl_hours=2.0)
    with pytest.raises(DataError, match="both ids: raw and sequence"):
        SparseFeature("H", 5, sequence=True, max_length=2, ids="raw")
    assert SparseFeature("U", 5, ids="raw", eviction="lfu", ttl_hours=0.5).to_dict()["ttl_hours"] == 0.5


def test_parquet_check_lets_raw_features_hold_strings_and_encoded_ones_not(tmp_path):
    s = DatasetSchema.from_dict({**_schema_dict(), "sparse": [
        {"name": "C1", "num_embeddings": 10, "multi_hot": False},
        {"name": "U1", "num_embeddings": 100, "multi_hot": False, "ids": "raw"},
        {"name": "T1", "num_embeddings": 100, "multi_hot": True, "ids": "raw"}]})
    os.makedirs(tmp_path / "train")
    path = tmp_path / "train" / "part-0.parquet"
    base = {"label": pa.array([1.0]), "I1": pa.array([1.0]), "T1": pa.array([["a", "b"]])}
    for u in (pa.array(["user-7"]), pa.array([-(2 ** 62)], pa.int64())):
        pq.write_table(pa.table({**base, "C1": pa.array([1], pa.int64()), "U1": u}), path)
        check_parquet_columns(s, str(tmp_path), "train")
    pq.write_table(pa.table({**base, "C1": pa.array(["x"]), "U1": pa.array([1], pa.int64())}), path)
    with pytest.raises(DataError, match=r"'C1'.*expected int64 \(multi_hot: false\)"):
        check_parquet_columns(s, str(tmp_path), "train")
    pq.write_table(pa.table({**base, "C1": pa.array([1], pa.int64()), "U1": pa.array([1.5])}), path)
    with pytest.raises(DataError, match=r"'U1'.*expected int64 or string \(multi_hot: false\)"):
        check_parquet_columns(s, str(tmp_path), "train")


# ---- string hash and key mix ---- #

#: the documented string hash, computed once; docs/raw_ids.md lists the same pairs
VECTORS = [("", -5426141060434712860), ("a", 3405396810240292928), ("user_42", -8546347491668559927),
           ("héllo wörld", 1394302091215309163), ("🙂", -5217523031617171271)]


@pytest.mark.parametrize("text, expected", VECTORS)
def test_string_hash_vectors(text, expected):
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    assert int.from_bytes(digest, "little", signed=True) == expected
    assert hash_string(text) == expected


def test_columns_become_int64_ids_whatever_their_container():
    texts, want = [t for t, _ in VECTORS], np.array([v for _, v in VECTORS], dtype=np.int64)
    for values in (pa.array(texts), pa.array(texts, pa.large_string()), pa.chunked_array([texts[:2], texts[2:]]),
                   np.array(texts, dtype=object), np.array(texts), texts):
        np.testing.assert_array_equal(raw_ids_to_int64(values), want)
    # each value keeps its id when repeated (strings are hashed once per distinct value)
    np.testing.assert_array_equal(raw_ids_to_int64(pa.array(["a", "", "a"])), want[[1, 0, 1]])
    ints = np.array([0, -1, 2 ** 63 - 1, -(2 ** 63), 12345], dtype=np.int64)
    np.testing.assert_array_equal(raw_ids_to_int64(pa.array(ints)), ints)
    np.testing.assert_array_equal(raw_ids_to_int64(pa.array([3, 4], pa.int32())), [3, 4])
    assert raw_ids_to_int64(pa.array([], pa.string())).dtype == np.int64
    with pytest.raises(DataError, match="'U1' holds 1 null id"):
        raw_ids_to_int64(pa.array(["a", None]), name="U1")
    with pytest.raises(DataError, match="has type double"):
        raw_ids_to_int64(pa.array([1.5]))


def test_key_mix_is_a_bijection_that_avoids_the_empty_key_and_agrees_in_torch():
    rng = np.random.default_rng(0)
    raw = np.concatenate([rng.integers(-(2 ** 63), 2 ** 63 - 1, size=50_000, dtype=np.int64),
                          np.array([0, 1, -1, 2 ** 63 - 1, -(2 ** 63), FOLD_PARTNER_RAW_ID], dtype=np.int64)])
    keys = raw_ids_to_keys(raw)
    np.testing.assert_array_equal(raw_id_keys(torch.from_numpy(raw)).numpy(), keys)
    np.testing.assert_array_equal(keys_to_raw_ids(keys), raw)
    assert len(np.unique(keys)) == len(raw) and not (keys == EMPTY_KEY).any()
    # the one raw id whose key would mark an empty slot shares its partner's key
    folded = raw_ids_to_keys(np.array([FOLDED_RAW_ID, FOLD_PARTNER_RAW_ID], dtype=np.int64))
    assert folded.tolist() == [FOLDED_KEY, FOLDED_KEY]
    # consecutive small ids spread over the whole key range (both signs, both halves)
    small = raw_ids_to_keys(np.arange(1000, dtype=np.int64))
    assert 400 < int((small < 0).sum()) < 600


def test_key_owner_is_fbgemms_row_wise_bucketization():
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)

    from rayemb.embedding.raw_tables import INPUT_HASH_SIZE, key_owner

    rng = np.random.default_rng(1)
    keys = np.concatenate([raw_ids_to_keys(rng.integers(-(2 ** 63), 2 ** 63 - 1, size=3000, dtype=np.int64)),
                           np.array([0, 1, 2 ** 62, 2 ** 63 - 2, -1, -(2 ** 63)], dtype=np.int64)])
    for world in (2, 3, 5):
        lengths, values = torch.ops.fbgemm.block_bucketize_sparse_features(
            torch.tensor([len(keys)]), torch.from_numpy(keys), False, True,
            torch.tensor([-(-INPUT_HASH_SIZE // world)]), world, None, total_num_blocks=torch.tensor([world]),
            keep_orig_idx=True)[:2]
        owner = key_owner(keys, world)
        assert lengths.tolist() == np.bincount(owner, minlength=world).tolist()
        np.testing.assert_array_equal(values.numpy(), keys[np.argsort(owner, kind="stable")])


# ---- an unsharded managed-collision table ---- #


def _table(capacity: int, eviction: str = "lru", ttl_hours=None, clock=None):
    from rayemb.embedding.raw_tables import build_raw_id_ebc, raw_id_modules

    feature = SparseFeature("u", capacity, ids="raw", eviction=eviction, ttl_hours=ttl_hours)
    kwargs = {"clock": clock} if clock else {}
    ebc = build_raw_id_ebc([feature], 4, **kwargs)
    ebc._return_remapped_features = True
    return ebc, raw_id_modules(ebc)["u"]


def _slots(ebc, ids) -> np.ndarray:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    ids = torch.as_tensor(np.ascontiguousarray(ids, dtype=np.int64))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["u"], values=ids, lengths=torch.ones(len(ids), dtype=torch.int64))
    _, remapped = ebc(kjt)
    return remapped.values().numpy()


def test_raw_64_bit_ids_get_stable_slots_and_evictions_are_counted():
    ebc, mcm = _table(32)
    rng = np.random.default_rng(7)
    ids = np.unique(np.concatenate([rng.integers(-(2 ** 63), 2 ** 63 - 1, size=20, dtype=np.int64),
                                    rng.integers(2 ** 62, 2 ** 63 - 1, size=5, dtype=np.int64),
                                    np.array([-1, 0, 2 ** 63 - 1, -(2 ** 63)], dtype=np.int64)]))
    first = _slots(ebc, ids)
    assert ((first >= 0) & (first < 31)).all() and len(set(first.tolist())) == len(ids)  # 31: a slot each
    np.testing.assert_array_equal(_slots(ebc, ids[::-1]), first[::-1])  # the same id, the same slot
    assert (mcm.admissions, mcm.evictions) == (len(ids), 0)
    # more distinct ids than the 31 slots: the newest take the oldest ids' slots (LRU), each eviction counted
    new = np.arange(1, 21, dtype=np.int64)
    got = _slots(ebc, new)
    assert len(set(got.tolist())) == 20 and (got < 31).all()
    assert mcm.evictions == len(ids) + 20 - 31 and mcm.admissions == len(ids) + 20
    from rayemb.embedding.raw_tables import eviction_counts

    assert eviction_counts(ebc) == {"u": mcm.evictions}
    ebc.eval()
    # at inference nothing is admitted: ids the table does not hold look up the default row, the last one
    assert _slots(ebc, [10 ** 12, -5]).tolist() == [31, 31]
    np.testing.assert_array_equal(_slots(ebc, new), got)


def test_lfu_keeps_the_frequent_ids_and_refused_ids_read_the_default_row():
    ebc, mcm = _table(8, eviction="lfu")
    frequent = np.arange(100, 107, dtype=np.int64)
    _slots(ebc, np.repeat(frequent, 3))
    got = _slots(ebc, np.arange(1, 5, dtype=np.int64))  # each seen once: fewer than any held id
    assert got.tolist() == [7, 7, 7, 7] and mcm.evictions == 0
    assert sorted(_slots(ebc, frequent).tolist()) == list(range(7))


def test_a_batch_larger_than_the_first_is_admitted_whole():
    # TorchRec sizes its buffer of ids seen between admission passes after the first batch
    ebc, mcm = _table(64)
    _slots(ebc, [1, 2])
    got = _slots(ebc, np.arange(10, 50, dtype=np.int64))
    assert len(set(got.tolist())) == 40 and (got < 63).all() and mcm.admissions == 42


def test_ttl_drops_ids_unseen_for_longer_than_it():
    now = [1_000_000.0]
    ebc, mcm = _table(16, ttl_hours=1, clock=lambda: now[0])
    _slots(ebc, [1, 2, 3])
    now[0] += 1800
    _slots(ebc, [1])
    now[0] += 2400  # 2 and 3: 70 minutes unseen; 1: 40 minutes
    _slots(ebc, [4])
    assert (mcm.expired, mcm.evictions) == (2, 2)
    ebc.eval()
    held = _slots(ebc, [1, 2, 3, 4])
    assert held[1] == held[2] == 15 and held[0] != 15 and held[3] != 15
