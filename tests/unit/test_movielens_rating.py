"""`rayemb convert movielens --label rating`: the rating kept as it is in a float `rating` column declared a
regression task; the statistics pass's row weight check (null, NaN, infinite, negative, all-zero weights)
refusing a dataset before training, naming the column."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from rayemb.cli import main
from rayemb.convert import ConvertOptions, convert
from rayemb.data.checks import ValueSummary, check_values
from rayemb.data.schema import DatasetSchema, load_checked
from rayemb.data.stats import compute_stats
from rayemb.data.synthetic_ratings import RatingsSpec, ratings
from rayemb.errors import ConfigError, DataError

# (user, item, rating, timestamp): user 7 rates 4 items, user 3 two (half stars, 0.5 and 5 included)
RATINGS = [(7, 50, 4.5, 300), (7, 10, 0.5, 100), (3, 10, 3.5, 50), (7, 20, 5.0, 200), (3, 20, 2.0, 60),
           (7, 40, 1.5, 500)]


def _ratings_csv(tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n" + "".join(f"{u},{m},{r},{t}\n" for u, m, r, t in RATINGS))
    return str(path)


def _split(out, split):
    return pq.read_table(os.path.join(out, split)).to_pylist()


def test_label_rating_keeps_the_rating_as_a_regression_label(tmp_path):
    out = str(tmp_path / "ml")
    assert main(["convert", "movielens", "--input", _ratings_csv(tmp_path), "--out", out, "--label", "rating"]) == 0
    schema = load_checked(out)
    assert schema.labels == ["rating"] and schema.task_kinds == ["regression"]
    with open(os.path.join(out, "schema.yaml")) as f:
        assert yaml.safe_load(f)["task_types"] == {"rating": "regression"}
    train, valid = _split(out, "train"), _split(out, "valid")
    assert sorted(r["rating"] for r in train) == [0.5, 3.5, 4.5, 5.0]  # each user's last one is validation
    assert sorted(r["rating"] for r in valid) == [1.5, 2.0]
    assert pq.read_schema(os.path.join(out, "train", os.listdir(os.path.join(out, "train"))[0])) \
        .field("rating").type == pa.float32()
    with open(os.path.join(out, "convert_summary.json")) as f:
        s = json.load(f)
    assert s["label"] == "rating (regression)" and s["label_mean"]["train"] == pytest.approx(3.375)


def test_the_default_label_stays_binary(tmp_path):
    out = str(tmp_path / "ml")
    assert main(["convert", "movielens", "--input", _ratings_csv(tmp_path), "--out", out]) == 0
    schema = load_checked(out)
    assert schema.labels == ["label"] and schema.task_kinds == ["binary"]
    assert sorted(r["label"] for r in _split(out, "train")) == [0.0, 0.0, 1.0, 1.0]


def test_label_rating_is_refused_for_click_logs_and_unknown_labels(tmp_path):
    src = _ratings_csv(tmp_path)
    with pytest.raises(ConfigError, match="--label rating keeps MovieLens ratings"):
        convert("avazu", ConvertOptions(inputs=(src,), out=str(tmp_path / "a"), label="rating"))
    with pytest.raises(ConfigError, match="--label 'stars': use binary"):
        convert("movielens", ConvertOptions(inputs=(src,), out=str(tmp_path / "m"), label="stars"))


def test_synthetic_ratings_have_movielens_structure():
    rows = ratings(RatingsSpec(users=200, items=300), seed=1)
    stars = rows[:, 2]
    assert set(np.unique(stars)) <= set(np.arange(1, 11) / 2.0) and stars.min() == 0.5 and stars.max() == 5.0
    counts = np.sort(np.bincount(rows[:, 1].astype(np.int64)))[::-1]
    assert counts[:30].sum() > 0.3 * counts.sum()  # a long tail: the top 10% of items hold a third of the ratings
    np.testing.assert_array_equal(rows, ratings(RatingsSpec(users=200, items=300), seed=1))


# -- the statistics pass's weight check ---------------------------------------------------------------------------


def _weighted_dataset(tmp_path, weights, files=2):
    """A dataset whose ``w`` column holds ``weights``, its rows over ``files`` parquet parts."""
    out = tmp_path / "data"
    (out / "train").mkdir(parents=True)
    DatasetSchema.from_dict({"label": ["click"], "dense": ["I1"], "sparse": [{"name": "C1", "num_embeddings": 4}],
                             "weight": "w"}).save(str(out))
    n = len(weights)
    table = pa.table({"click": np.arange(n) % 2 * 1.0, "I1": np.ones(n), "C1": np.arange(n) % 4,
                      "w": pa.array(weights, pa.float64())})
    step = -(-n // files)
    for i in range(files):
        pq.write_table(table.slice(i * step, step), str(out / "train" / f"part-{i}.parquet"))
    return str(out)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), None])
def test_the_statistics_pass_refuses_bad_weights_naming_the_column(tmp_path, bad):
    weights = [1.0] * 7 + [bad]  # in the second file
    stats = compute_stats(_weighted_dataset(tmp_path, weights), in_process=True)
    assert stats.values.weight == "w" and stats.values.weight_invalid == 1
    with pytest.raises(DataError, match="weight column 'w' has 1 null, NaN, infinite or negative value.*finite "
                                        "number >= 0: fix or drop those rows"):
        check_values(stats.values, "click", "data/train")
    again = ValueSummary.from_dict(json.loads(json.dumps(stats.values.to_dict(), allow_nan=True)))
    assert again.weight == "w" and again.weight_invalid == 1  # a kept stats.json checks the same


def test_the_statistics_pass_refuses_all_zero_weights_and_passes_good_ones(tmp_path):
    with pytest.raises(DataError, match="weight column 'w' is 0 on every row.*remove `weight:` from schema.yaml"):
        check_values(compute_stats(_weighted_dataset(tmp_path, [0.0] * 6), in_process=True).values, "click", "d")
    ok = compute_stats(_weighted_dataset(tmp_path / "ok", [0.0, 0.0, 2.5, 0.0, 1.0, 0.0]), in_process=True).values
    check_values(ok, "click", "d")  # zeros on some rows are fine: those rows do not count
    assert ok.weight_sum == pytest.approx(3.5)
    unweighted = ValueSummary.of_table(pa.table({"click": [0.0, 1.0]}), "click", [])
    assert unweighted.weight is None and "weight" not in unweighted.to_dict()
