import numpy as np
import pyarrow.parquet as pq
import pytest

from rayemb.data.schema import DatasetSchema, load_checked
from rayemb.data.synthetic import SyntheticSpec, generate
from rayemb.errors import DataError


def _read(d, split="train"):
    return pq.read_table(f"{d}/{split}")


def test_deterministic_for_a_seed(tmp_path):
    spec = SyntheticSpec(rows=3000, num_tables=5, seed=3, chunk_rows=700)
    generate(spec, str(tmp_path / "a"))
    generate(spec, str(tmp_path / "b"))
    generate(SyntheticSpec(rows=3000, num_tables=5, seed=4, chunk_rows=700), str(tmp_path / "c"))
    a, b, c = _read(tmp_path / "a"), _read(tmp_path / "b"), _read(tmp_path / "c")
    assert a.equals(b)
    assert not a.column("C1").equals(c.column("C1"))


def test_shapes_schema_and_chunking(tmp_path):
    spec = SyntheticSpec(rows=5000, num_tables=26, seed=0, chunk_rows=1000, valid_fraction=0.2)
    schema = generate(spec, str(tmp_path))
    assert DatasetSchema.load(str(tmp_path)) == schema
    load_checked(str(tmp_path))
    train, valid = _read(tmp_path), _read(tmp_path, "valid")
    assert (train.num_rows, valid.num_rows) == (4000, 1000)
    assert len(list((tmp_path / "train").glob("*.parquet"))) == 4  # chunked: 1000 rows per file
    assert train.column_names == ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    sizes = [f.num_embeddings for f in schema.sparse]
    assert sizes[0] == 45834 and sizes[5] == 3  # Criteo 1TB C1 / 1000, C6 clamped to the minimum
    for f in schema.sparse:
        ids = train.column(f.name).to_numpy()
        assert ids.min() >= 0 and ids.max() < f.num_embeddings
    labels = train.column("label").to_numpy()
    assert set(np.unique(labels)) == {0.0, 1.0} and 0.1 < labels.mean() < 0.6


def test_zipf_skew_and_permutation(tmp_path):
    spec = SyntheticSpec(rows=40000, num_tables=1, zipf_alpha=1.1, seed=1, cardinalities=[10000])
    generate(spec, str(tmp_path))
    ids = _read(tmp_path).column("C1").to_numpy()
    counts = np.bincount(ids, minlength=10000)
    top = np.sort(counts)[::-1]
    # Zipf(1.1) over 10^4 ids: the top 1% of ids hold well over a third of the lookups.
    assert top[:100].sum() / counts.sum() > 0.35
    assert top[0] > 20 * np.median(counts[counts > 0])
    # Hot ids are spread over the id space, not the smallest numbers.
    hottest = np.argsort(counts)[::-1][:10]
    assert not set(hottest) <= set(range(100))


def test_multi_hot_lengths(tmp_path):
    spec = SyntheticSpec(rows=4000, num_tables=3, multi_hot=True, mean_pooling=8, seed=2)
    generate(spec, str(tmp_path))
    col = _read(tmp_path).column("C2").combine_chunks()
    lengths = np.diff(col.offsets.to_numpy())
    assert abs(lengths.mean() - 8) < 0.5
    assert (lengths == 0).any() or lengths.min() <= 2  # Poisson(8) bags, short ones included


def test_label_is_learnable_from_ids(tmp_path):
    """A per-id click-rate table fitted on train ranks valid rows well above chance."""
    spec = SyntheticSpec(rows=60000, num_tables=4, seed=5, num_signal_tables=4, cardinalities=[50, 60, 70, 80])
    generate(spec, str(tmp_path))
    tr, va = _read(tmp_path), _read(tmp_path, "valid")
    from rayemb.train.worker.metrics import auc

    score = np.zeros(va.num_rows)
    y = tr.column("label").to_numpy()
    for c in ["C1", "C2", "C3", "C4"]:
        ids = tr.column(c).to_numpy()
        rate = (np.bincount(ids, weights=y, minlength=100) + 1) / (np.bincount(ids, minlength=100) + 2)
        score += np.log(rate / (1 - rate))[va.column(c).to_numpy()]
    assert auc(va.column("label").to_numpy(), score) > 0.7


@pytest.mark.parametrize("kw", [{"rows": 1}, {"zipf_alpha": 0}, {"valid_fraction": 1.5}, {"num_tables": 0}])
def test_bad_requests(kw):
    args = {"rows": 100, **kw}
    with pytest.raises(DataError):
        SyntheticSpec(**args)
