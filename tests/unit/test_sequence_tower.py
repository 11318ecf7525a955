"""Sequence features without a process group: truncation, the KJT builder, padding, the history tower.

Truncation must keep each row's most recent (last) ``max_length`` ids and
agree with a plain per-row loop; padding must put every id's embedding at its
position with a mask; the tower must ignore masked positions, give zeros for
empty histories (no NaN, also in the gradient) and attend with weights that
sum to 1 over the valid positions. Sharded behaviour lives in
tests/dist/test_sequence_equivalence.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import JaggedTensor

from rayemb.embedding.sequence import (
    SequenceFeature,
    UserHistoryTower,
    pad_jagged,
    pad_sequences,
    sequence_collection,
    sequence_kjt,
    truncate_recent,
)
from rayemb.errors import ConfigError, DataError


def _feats(max_length: int = 3):
    return [SequenceFeature("clicks", 50, 4, max_length), SequenceFeature("cats", 10, 4, 2)]


# ---- truncation and the KJT builder ---- #

def test_truncate_keeps_latest_ids() -> None:
    lengths, values = truncate_recent(np.array([5, 0, 2, 3]), np.arange(10), 3)
    assert lengths.tolist() == [3, 0, 2, 3]
    assert values.tolist() == [2, 3, 4, 5, 6, 7, 8, 9]  # row 0 keeps 2,3,4 (its latest), rows 2, 3 untouched
    assert values.dtype == np.int64 and lengths.dtype == np.int64


def test_truncate_matches_per_row_loop() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 9, size=200)
    lengths[:3] = 0
    values = rng.integers(0, 1000, size=int(lengths.sum()))
    for max_length in (1, 4, 8, 20):
        got_len, got_val = truncate_recent(lengths, values, max_length)
        offs = np.concatenate([[0], np.cumsum(lengths)])
        rows = [values[offs[i]:offs[i + 1]][-max_length:] for i in range(len(lengths))]
        assert got_len.tolist() == [len(r) for r in rows]
        assert got_val.tolist() == np.concatenate(rows).tolist()


def test_truncate_empty_and_invalid() -> None:
    lengths, values = truncate_recent(np.array([0, 0]), np.array([], dtype=np.int64), 3)
    assert lengths.tolist() == [0, 0] and values.size == 0
    with pytest.raises(DataError) as e:
        truncate_recent(np.array([2, -1]), np.array([1]), 3)
    assert e.value.category == "invalid_values"
    with pytest.raises(DataError) as e:
        truncate_recent(np.array([2, 2]), np.array([1, 2, 3]), 3)
    assert e.value.category == "invalid_values"


def test_sequence_kjt_lists_and_arrays() -> None:
    feats = _feats()
    kjt = sequence_kjt(feats, {"clicks": [[1, 2, 3, 4, 5], [], [7, 7]],
                               "cats": (np.array([0, 3, 1]), np.array([9, 8, 7, 6]))})
    assert kjt.keys() == ["clicks", "cats"]
    d = kjt.to_dict()
    assert d["clicks"].lengths().tolist() == [3, 0, 2]
    assert d["clicks"].values().tolist() == [3, 4, 5, 7, 7]
    assert d["cats"].lengths().tolist() == [0, 2, 1]
    assert d["cats"].values().tolist() == [8, 7, 6]
    empty = sequence_kjt(feats, {"clicks": [[], []], "cats": [[], []]})
    assert empty.lengths().tolist() == [0, 0, 0, 0] and empty.values().numel() == 0


def test_sequence_kjt_errors() -> None:
    feats = _feats()
    with pytest.raises(DataError) as e:
        sequence_kjt(feats, {"clicks": [[1, 50]], "cats": [[]]})  # 50 is outside the table; kept (latest)
    assert e.value.category == "invalid_ids" and "clicks" in str(e.value)
    # an out-of-range id that truncation drops is never looked up
    assert sequence_kjt(feats, {"clicks": [[-1, 1, 2, 3]], "cats": [[]]}).values().tolist() == [1, 2, 3]
    with pytest.raises(DataError) as e:
        sequence_kjt(feats, {"clicks": [[1]]})
    assert e.value.category == "missing_column"
    with pytest.raises(DataError) as e:
        sequence_kjt(feats, {"clicks": [[1], [2]], "cats": [[1]]})
    assert e.value.category == "invalid_values"


def test_feature_and_collection_validation() -> None:
    for bad in (dict(name="", num_embeddings=5, embedding_dim=4, max_length=2),
                dict(name="items", num_embeddings=5, embedding_dim=4, max_length=2),  # nn.ModuleDict.items
                dict(name="a.b", num_embeddings=5, embedding_dim=4, max_length=2),
                dict(name="f", num_embeddings=5, embedding_dim=4, max_length=0),
                dict(name="f", num_embeddings=True, embedding_dim=4, max_length=2)):
        with pytest.raises(ConfigError) as e:
            SequenceFeature(**bad)
        assert e.value.category == "invalid_config"
    with pytest.raises(ConfigError):
        sequence_collection([SequenceFeature("a", 5, 4, 2), SequenceFeature("b", 5, 8, 2)])
    with pytest.raises(ConfigError):
        sequence_collection([SequenceFeature("a", 5, 4, 2), SequenceFeature("a", 6, 4, 2)])
    ec = sequence_collection(_feats())
    assert [c.name for c in ec.embedding_configs()] == ["clicks", "cats"]
    assert ec.embeddings["clicks"].weight.shape == (50, 4)


# ---- padding ---- #

def test_pad_sequences_places_latest_embeddings() -> None:
    feats = _feats()
    torch.manual_seed(0)
    ec = sequence_collection(feats)
    rows = {"clicks": [[1, 2, 3, 4], [], [9]], "cats": [[5], [1, 2, 3], []]}
    padded = pad_sequences(ec(sequence_kjt(feats, rows)), feats)
    for f in feats:
        hist, mask = padded[f.name]
        weight = ec.embeddings[f.name].weight
        assert hist.shape == (3, f.max_length, 4) and mask.shape == (3, f.max_length)
        for b, ids in enumerate(rows[f.name]):
            kept = ids[-f.max_length:]
            assert mask[b].tolist() == [i < len(kept) for i in range(f.max_length)]
            for i, idx in enumerate(kept):
                torch.testing.assert_close(hist[b, i], weight[idx])
            assert torch.count_nonzero(hist[b, len(kept):]) == 0


def test_pad_jagged_gradient_and_too_long() -> None:
    values = torch.randn(5, 3, requires_grad=True)
    jt = JaggedTensor(values=values, lengths=torch.tensor([2, 0, 3]))
    hist, mask = pad_jagged(jt, 4)
    assert mask.sum().item() == 5
    (hist * torch.arange(1.0, 13.0).reshape(1, 4, 3)).sum().backward()
    # value j sits at position pos(j) of its row: its gradient is that position's weights
    pos = [0, 1, 0, 1, 2]
    torch.testing.assert_close(values.grad, torch.arange(1.0, 13.0).reshape(4, 3)[pos])
    with pytest.raises(DataError):
        pad_jagged(jt, 2)


# ---- the user-history tower ---- #

def _history(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hist = torch.randn(4, 5, 6, generator=g)
    lengths = torch.tensor([5, 2, 0, 1])
    mask = torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)
    target = torch.randn(4, 6, generator=g)
    return hist, mask, target


def test_mean_tower_respects_mask() -> None:
    hist, mask, target = _history()
    out = UserHistoryTower("mean")(hist, mask, target)
    torch.testing.assert_close(out[0], hist[0].mean(0))
    torch.testing.assert_close(out[1], hist[1, :2].mean(0))
    torch.testing.assert_close(out[3], hist[3, 0])
    assert torch.count_nonzero(out[2]) == 0
    garbage = hist.masked_fill(~mask.unsqueeze(2), 1e6)
    torch.testing.assert_close(UserHistoryTower("mean")(garbage, mask), out)


def test_attention_weights_and_output() -> None:
    hist, mask, target = _history()
    tower = UserHistoryTower("attention")
    w = tower.attention_weights(hist, mask, target)
    torch.testing.assert_close(w.sum(1), torch.tensor([1.0, 1.0, 0.0, 1.0]))
    assert torch.count_nonzero(w[~mask]) == 0
    expect = torch.softmax(hist[1, :2] @ target[1], dim=0)
    torch.testing.assert_close(w[1, :2], expect)
    out = tower(hist, mask, target)
    torch.testing.assert_close(out[1], expect @ hist[1, :2])
    torch.testing.assert_close(out[3], hist[3, 0])
    assert torch.count_nonzero(out[2]) == 0
    garbage = hist.masked_fill(~mask.unsqueeze(2), 1e6)
    torch.testing.assert_close(tower(garbage, mask, target), out)


def test_towers_have_no_nan_for_empty_histories() -> None:
    hist, mask, target = _history()
    mask[:] = False
    for mode in ("mean", "attention"):
        h = hist.clone().requires_grad_(True)
        t = target.clone().requires_grad_(True)
        out = UserHistoryTower(mode)(h, mask, t)
        assert torch.count_nonzero(out) == 0
        out.sum().backward()
        assert torch.isfinite(h.grad).all() and torch.count_nonzero(h.grad) == 0
        assert t.grad is None or torch.count_nonzero(t.grad) == 0


def test_tower_errors() -> None:
    hist, mask, target = _history()
    with pytest.raises(ConfigError):
        UserHistoryTower("max")
    with pytest.raises(ValueError):
        UserHistoryTower("attention")(hist, mask)
    with pytest.raises(ValueError):
        UserHistoryTower("mean")(hist, mask[:, :3])
