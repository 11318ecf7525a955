"""Retrieval models: the logQ-corrected in-batch softmax, item sampling probabilities from the statistics,
the catalogue batches and hit rate@K (rayemb.train.worker.retrieval), and the two-tower factory's checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayemb.data.batching import BatchConverter
from rayemb.data.schema import DatasetSchema, SparseFeature
from rayemb.data.stats_types import TableStats
from rayemb.errors import ConfigError, DataError
from rayemb.train.worker.retrieval import InBatchSoftmax, evaluate_retrieval, item_feature_of, item_log_q

SCHEMA = DatasetSchema(label="label", dense=("n",), sparse=(SparseFeature("user", 7), SparseFeature("item", 9),
                                                            SparseFeature("tags", 5, multi_hot=True)))


def test_item_log_q_is_each_ids_share_of_the_values():
    exact = item_log_q(TableStats(values=100, distinct=3, heavy_hitters=[[0, 50], [3, 30], [1, 20]]), 5)
    assert np.allclose(np.exp(exact[[0, 3, 1]]), [0.5, 0.3, 0.2])
    # ids never seen (every value is listed): half the smallest share, so logits stay finite
    assert np.allclose(np.exp(exact[[2, 4]]), 0.1)
    # more distinct ids than counters: the unlisted ids share what the listed ones do not hold
    partial = np.exp(item_log_q(TableStats(values=100, distinct=5, heavy_hitters=[[0, 50], [3, 30]]), 6))
    assert np.allclose(partial[[0, 3]], [0.5, 0.3]) and np.allclose(partial[[1, 2, 4, 5]], 0.05)
    assert partial.sum() == pytest.approx(1.0)


def _reference(query, candidate, ids, log_q):
    logits = query @ candidate.t() - torch.from_numpy(log_q)[ids].unsqueeze(0)
    same = ids.unsqueeze(0) == ids.unsqueeze(1)
    same.fill_diagonal_(False)
    return torch.nn.functional.cross_entropy(logits.masked_fill(same, float("-inf")), torch.arange(len(ids)))


def test_in_batch_softmax_subtracts_log_q_and_masks_the_rows_own_item_elsewhere():
    g = torch.Generator().manual_seed(0)
    query, candidate = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    ids = torch.tensor([2, 5, 2, 0, 7, 5])
    log_q = np.log(np.linspace(0.01, 0.3, 9)).astype(np.float32)
    loss = InBatchSoftmax(log_q)((query, candidate), ids)
    assert float(loss) == pytest.approx(float(_reference(query, candidate, ids, log_q)), rel=1e-6)
    # the correction and the mask change the loss: without ids it is the plain in-batch softmax
    plain = torch.nn.functional.cross_entropy(query @ candidate.t(), torch.arange(6))
    assert float(InBatchSoftmax(log_q)((query, candidate))) == pytest.approx(float(plain), rel=1e-6)
    assert abs(float(loss) - float(plain)) > 1e-3


def test_in_batch_softmax_names_the_output_it_needs():
    with pytest.raises(ConfigError, match=r"returns \(query, candidate\)") as e:
        InBatchSoftmax()(torch.zeros(4))
    assert e.value.category == "bad_model_output"


def test_converter_keeps_the_item_ids_before_the_remap_and_builds_catalogue_batches():
    import pyarrow as pa

    conv = BatchConverter(SCHEMA, remap=lambda kjt: kjt, keep_ids="item")
    table = pa.table({"label": [1.0, 0.0, 1.0], "n": [1.0, 2.0, 3.0], "user": [1, 2, 3], "item": [8, 0, 4],
                      "tags": [[1], [], [2, 3]]})
    batch = conv(table, pad_to=5)
    assert batch.ids.tolist() == [8, 0, 4, -1, -1] and batch.mask.tolist() == [True] * 3 + [False] * 2
    cat = conv.candidates(np.array([3, 6]), pad_to=4)
    assert cat.ids.tolist() == [3, 6, -1, -1]
    assert cat.sparse["item"].values().tolist() == [3, 6] and cat.sparse["item"].lengths().tolist() == [1, 1, 0, 0]
    assert cat.sparse["user"].lengths().tolist() == [0] * 4 and cat.sparse["tags"].lengths().tolist() == [0] * 4
    with pytest.raises(DataError, match="null id"):
        conv(pa.table({"label": [1.0, 0.0], "n": [1.0, 2.0], "user": [1, 2], "item": pa.array([3, None]),
                       "tags": [[1], [2]]}))
    with pytest.raises(DataError, match="one-id-per-row"):
        BatchConverter(SCHEMA, keep_ids="tags")


class _Lookup(torch.nn.Module):
    """A retrieval model over fixed vectors: query = user vector, candidate = item vector (no training)."""

    item_feature = "item"

    def __init__(self, users: torch.Tensor, items: torch.Tensor) -> None:
        super().__init__()
        self.users, self.items = users, items

    def forward(self, dense, sparse):
        d = sparse.to_dict()
        def rows(feature, table):
            jt = d[feature]
            out = torch.zeros(len(jt.lengths()), table.shape[1])
            out[jt.lengths() > 0] = table[jt.values()]
            return out
        return rows("user", self.users), rows("item", self.items)


def test_hit_rate_counts_the_items_scored_above_the_rows_own_over_the_whole_catalogue():
    import pyarrow as pa

    g = torch.Generator().manual_seed(1)
    users, items = torch.randn(7, 3, generator=g), torch.randn(9, 3, generator=g)
    conv = BatchConverter(SCHEMA, keep_ids="item")
    user_ids, item_ids = np.array([0, 1, 2, 3, 4, 5, 6]), np.array([8, 0, 4, 4, 2, 7, 1])
    table = pa.table({"label": np.ones(7), "n": np.zeros(7), "user": user_ids, "item": item_ids,
                      "tags": [[]] * 7})
    batches = [conv(table.slice(0, 4)), conv(table.slice(4, 3), pad_to=4)]
    got = evaluate_retrieval(_Lookup(users, items), iter(batches), torch.device("cpu"), conv.candidates, 9,
                             batch_size=4, ks=(1, 3, 9))
    scores = (users @ items.t()).numpy()
    rank = (scores > scores[user_ids, item_ids][:, None]).sum(axis=1)
    for k in (1, 3, 9):
        assert got[f"valid_hit_rate_at_{k}"] == pytest.approx(float((rank < k).mean()))
    assert got["valid_hit_rate_at_9"] == 1.0 and got["valid_rows"] == 7 and got["catalogue_items"] == 9
    assert 0 < got["valid_hit_rate_at_3"] < 1


def test_two_tower_factory_checks_its_arguments_and_marks_itself_a_retrieval_model():
    from rayemb.contract.model import Embeddings
    from rayemb.contract.factory import ModelSpec
    from rayemb.contract.tables import table_configs
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    def embeddings():
        ebc = EmbeddingBagCollection(tables=table_configs(SCHEMA, 8), device=torch.device("cpu"))
        return Embeddings(ebc, tuple(SCHEMA.sparse_names), 8, device=torch.device("cpu"))

    spec = ModelSpec("rayemb.models.two_tower:two_tower", {"tower_mlp": [16, 4]}, "two_tower")
    model, paths = spec.build(embeddings(), SCHEMA)
    assert item_feature_of(model) == "item" and paths["pooled"] == "embedding"
    assert model.user_features == ["user", "tags"]
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = KeyedJaggedTensor.from_lengths_sync(["user", "item", "tags"], torch.tensor([1, 2, 3, 4, 0, 1, 2]),
                                              torch.tensor([1, 1, 1, 1, 2, 1], dtype=torch.int32))
    query, candidate = model(torch.zeros(2, 1), kjt)
    assert query.shape == candidate.shape == (2, 4)
    # unit candidates, queries of norm 1 / temperature: the score is a scaled cosine
    assert torch.allclose(candidate.norm(dim=1), torch.ones(2), atol=1e-5)
    assert torch.allclose(query.norm(dim=1), torch.full((2,), 20.0), atol=1e-4)
    for args, match in (({"item_feature": "movie"}, "not a pooled sparse feature"),
                        ({"user_features": ["item"]}, "other than the item"),
                        ({"temperature": 0}, "positive")):
        with pytest.raises(ConfigError, match=match) as e:
            ModelSpec("rayemb.models.two_tower:two_tower", args, "two_tower").build(embeddings(), SCHEMA)
        assert e.value.category == "bad_model_factory"
    with pytest.raises(ConfigError, match="one-id-per-row") as e:
        ModelSpec("rayemb.models.two_tower:two_tower", {"item_feature": "tags"}, "two_tower").build(
            embeddings(), SCHEMA)
