"""HybridRemapper and the unsharded HybridEmbeddingBagCollection (no process group).

The remap must keep every id in its bag (hot part + cold part), the module must
pool exactly like an EmbeddingBagCollection over the same logical rows, and
user errors must carry their category. Multi-rank behaviour lives in
tests/dist/test_hybrid_equivalence.py.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rayemb.embedding.hybrid import HybridEmbeddingBagCollection
from rayemb.embedding.placements import hybrid_from_placements
from rayemb.embedding.remap import HybridRemapper
from rayemb.errors import ConfigError, DataError
from rayemb.planner.traffic import predict_table_bytes


def _cfg(name, rows, dim=4, pooling=PoolingType.SUM):
    return EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=rows, feature_names=[f"f_{name}"],
                              pooling=pooling)


def test_remap_splits_each_bag_into_hot_and_cold_rows() -> None:
    r = HybridRemapper([_cfg("a", 10)], {"a": np.array([7, 2, 2])})  # duplicates dropped, sorted
    assert r.hot_ids("a").tolist() == [2, 7]
    assert r.cold_ids("a").tolist() == [0, 1, 3, 4, 5, 6, 8, 9]
    values = np.array([2, 5, 7, 9, 2, 0, 8])
    lengths = np.array([3, 0, 2, 2])  # [2,5,7] [] [9,2] [0,8]
    weights = np.arange(7, dtype=np.float32)
    out = r.remap_arrays({"f_a": (values, lengths, weights)})
    hv, hl, hw = out["f_a__hot"]
    cv, cl, cw = out["f_a__cold"]
    assert hv.tolist() == [0, 1, 0] and hl.tolist() == [2, 0, 1, 0] and hw.tolist() == [0, 2, 4]
    # cold row j holds cold_ids[j]: 5 -> 4, 9 -> 7, 0 -> 0, 8 -> 6
    assert cv.tolist() == [4, 7, 0, 6] and cl.tolist() == [1, 0, 1, 2] and cw.tolist() == [1, 3, 5, 6]
    assert r.cold_ids("a")[cv].tolist() == [5, 9, 0, 8]
    assert r.hot_share("a", values) == pytest.approx(3 / 7)


def test_remap_kjt_key_order_and_segments() -> None:
    tables = [_cfg("p", 5), _cfg("h", 10), _cfg("x", 6, dim=8), _cfg("e", 4)]
    r = HybridRemapper(tables, {"h": np.array([1]), "x": np.arange(6), "e": np.array([], np.int64)})
    assert r.output_keys == ["f_p", "f_h__hot", "f_x__hot", "f_h__cold", "f_e__cold"]
    assert r.segments == [1, 2, 2]  # plain, hot, cold dim 4 (x is all hot: no cold half)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f_p", "f_h", "f_x", "f_e"], values=torch.tensor([0, 1, 2, 5, 3]), lengths=torch.tensor([1, 0, 2, 0, 1, 0, 0, 1]))
    out = r.remap(kjt)
    assert out.keys() == r.output_keys
    assert out.stride() == 2
    # int32 bag lengths whatever the input's (the data path's dtype): the row-wise cold exchange sends every
    # bag's length to every rank, and rayemb.planner.traffic prices them at 4 bytes
    assert out.lengths().dtype == torch.int32 and out.lengths().tolist() == [1, 0, 1, 0, 1, 0, 1, 0, 0, 1]
    r2 = pickle.loads(pickle.dumps(r))
    assert torch.equal(r2.remap(kjt).values(), out.values())


@pytest.mark.parametrize("weighted", [False, True])
def test_unsharded_hybrid_pools_like_embedding_bag_collection(weighted: bool) -> None:
    mean = PoolingType.SUM if weighted else PoolingType.MEAN
    tables = [_cfg("mixed", 20), _cfg("mean", 20, pooling=mean), _cfg("nohot", 20, dim=2),
              _cfg("allhot", 8), _cfg("plain", 20)]
    hot = {"mixed": np.array([1, 3, 5]), "mean": np.array([0, 2]), "nohot": np.array([], np.int64),
           "allhot": np.arange(8)}
    torch.manual_seed(0)
    ref = EmbeddingBagCollection(tables, is_weighted=weighted)
    hy = HybridEmbeddingBagCollection(tables, hot, is_weighted=weighted)
    r = hy.remapper
    full = {t.name: ref.state_dict()[f"embedding_bags.{t.name}.weight"] for t in tables}
    for name in hot:
        torch.testing.assert_close(r.merge_weight(name, *r.split_weight(name, full[name])), full[name])
    hy.load_state_dict(hy.split_state_dict(full))  # strict: every half and plain table gets its rows
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 4, size=len(tables) * 6)
    values = np.concatenate([rng.integers(0, t.num_embeddings, size=lengths[i * 6:(i + 1) * 6].sum())
                             for i, t in enumerate(tables)])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{t.name}" for t in tables], values=torch.from_numpy(values), lengths=torch.from_numpy(lengths),
        weights=torch.rand(values.size) if weighted else None)
    a, b = ref(kjt), hy(r.remap(kjt))
    assert a.keys() == b.keys() and a.length_per_key() == b.length_per_key()
    torch.testing.assert_close(b.values(), a.values(), atol=1e-6, rtol=0)
    b.values().sum().backward()  # gradients reach both halves
    assert hy.hot.embedding_bags["mixed__hot"].weight.grad is not None
    assert hy.cold["d4"].embeddings["mixed__cold"].weight.grad is not None


def test_user_errors_have_categories() -> None:
    tables = [_cfg("a", 10)]
    with pytest.raises(ConfigError):
        HybridRemapper(tables, {"a": np.array([10])})
    with pytest.raises(ConfigError):
        HybridRemapper(tables, {"zz": np.array([1])})
    r = HybridRemapper(tables, {"a": np.array([1])})
    with pytest.raises(DataError) as e:
        r.remap_arrays({"f_a": (np.array([11]), np.array([1]), None)})
    assert e.value.category == "invalid_input"
    hy = HybridEmbeddingBagCollection(tables, {"a": np.array([1])})
    raw = KeyedJaggedTensor.from_lengths_sync(keys=["f_a"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    with pytest.raises(DataError):
        hy(raw)  # not remapped


def test_predictor_matches_the_byte_formulas() -> None:
    kw = dict(batch_size=1024, dim=16, world_size=4, pooling=1.0, num_rows=1000)
    tw = predict_table_bytes("table_wise", **kw)["all_to_all"]
    # hybrid without hot rows and table-wise cold = pooled table-wise for one-hot bags
    assert predict_table_bytes("hybrid", cold_sharding="table_wise", **kw) == {"all_to_all": pytest.approx(tw)}
    assert predict_table_bytes("data_parallel", **kw) == {"all_reduce": 2 * 3 * 1000 * 16 * 4}
    hy = predict_table_bytes("hybrid", hot_share=0.75, num_hot=40, cold_sharding="table_wise", **kw)
    assert hy["all_reduce"] == 2 * 3 * 40 * 16 * 4
    assert hy["all_to_all"] < 0.5 * tw
    rw = predict_table_bytes("row_wise", **kw)
    assert rw["reduce_scatter"] == rw["all_gather"] == 3 * 1024 * 16 * 4
    with pytest.raises(ConfigError):
        predict_table_bytes("nonsense", **kw)


def test_halves_keep_the_logical_tables_init_range() -> None:
    # TorchRec's default init is uniform(±sqrt(1/rows)); a 4-row hot half must not get ±0.5
    hy = HybridEmbeddingBagCollection([_cfg("big", 10000)], {"big": np.arange(4)})
    bound = (1 / 10000) ** 0.5
    assert hy.hot.embedding_bags["big__hot"].weight.abs().max() <= bound
    assert hy.cold["d4"].embeddings["big__cold"].weight.abs().max() <= bound


def test_hybrid_from_placements_builds_module_and_constraints() -> None:
    from types import SimpleNamespace as P

    tables = [_cfg("h", 10), _cfg("d", 10), _cfg("t", 10), _cfg("free", 10)]
    placements = {"h": P(placement="hybrid", sharding_type="table_wise"),
                  "d": P(placement="data_parallel", sharding_type="data_parallel"),
                  "t": P(placement="table_wise", sharding_type="table_wise")}
    module, cons = hybrid_from_placements(tables, placements, {"h": np.array([1, 2])})
    assert module.remapper.hybrid_tables() == ["h"]
    assert cons["h__hot"].sharding_types == ["data_parallel"] and cons["h__hot"].compute_kernels == ["dense"]
    assert cons["h__cold"].sharding_types == ["table_wise"] and cons["h__cold"].compute_kernels == ["fused"]
    assert cons["d"].compute_kernels == ["dense"] and cons["t"].sharding_types == ["table_wise"]
    assert "free" not in cons
    with pytest.raises(ConfigError):
        hybrid_from_placements(tables, placements, {})
    with pytest.raises(ConfigError):
        module.parameter_constraints("data_parallel")
