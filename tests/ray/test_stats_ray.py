"""The streaming stats pass on a real local Ray, against exact numpy oracles over the same parquet files."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayemb.data.checks import check_ids
from rayemb.data.fingerprint import dataset_fingerprint
from rayemb.data.schema import DatasetSchema, SparseFeature, parquet_files
from rayemb.data.stats import compute_stats
from rayemb.cli.stats import add_stats_arguments, stats_main
from rayemb.data.stats_io import load_or_compute_stats, write_stats_json
from rayemb.data.synthetic import SyntheticSpec, generate
from rayemb.errors import DataError

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def ray_local(ray_2_cpus):
    return ray_2_cpus


@pytest.fixture(scope="module")
def zipf_data(tmp_path_factory):
    """One-hot Zipf data in 8 train files; table sizes 40..20000 so some tables overflow k counters."""
    out = str(tmp_path_factory.mktemp("zipf"))
    sizes = [20_000, 5_000, 300, 40]
    generate(SyntheticSpec(rows=44_000, num_tables=4, zipf_alpha=1.05, chunk_rows=5_000, seed=3,
                           cardinalities=sizes, num_signal_tables=2), out)
    return out


def oracle(data_dir, name, multi_hot=False):
    """Exact (ids, counts) of one column from pyarrow + numpy."""
    col = pq.read_table(parquet_files(data_dir), columns=[name]).column(name).combine_chunks()
    v = col.flatten() if multi_hot else col
    v = v.drop_null().to_numpy()
    return np.unique(v, return_counts=True)


def test_approximate_pass_meets_error_bound(ray_local, zipf_data):
    k = 64
    stats = compute_stats(zipf_data, num_heavy_hitters=k, in_process=False)
    assert stats.to_dict()["schema_version"] == 1 and stats.rows == 39_600  # 90 % train split
    assert stats.fingerprint == dataset_fingerprint(zipf_data)
    exercised = 0
    for name, t in stats.tables.items():
        u, c = oracle(zipf_data, name)
        truth = dict(zip(u.tolist(), c.tolist()))
        e = t.error_bound
        assert t.rows == t.values == 39_600 and t.nulls == 0 and t.invalid == 0
        assert e <= t.values / (k + 1)
        assert (t.min_id, t.max_id) == (int(u.min()), int(u.max()))
        assert t.distinct == u.size and t.distinct_exact  # bitmap: exact below 2**20 rows
        hh = t.heavy_hitters.tolist()
        assert len(hh) <= k and [x[1] for x in hh] == sorted((x[1] for x in hh), reverse=True)
        for i, cnt in hh:
            assert truth[i] - e <= cnt <= truth[i]
        assert set(u[c > e].tolist()) <= {i for i, _ in hh}
        exercised += e > 0
    assert exercised >= 2  # the big tables really were truncated


@pytest.mark.parametrize("in_process", [False, True], ids=["ray-data", "in-process"])
def test_exact_pass_equals_numpy(ray_local, zipf_data, in_process):
    stats = compute_stats(zipf_data, exact=True, in_process=in_process)
    for name, t in stats.tables.items():
        u, c = oracle(zipf_data, name)
        order = np.lexsort((u, -c))
        assert t.error_bound == 0 and t.distinct == u.size and t.distinct_exact
        assert t.heavy_hitters.tolist() == np.stack([u[order], c[order]], axis=1).tolist()


@pytest.fixture(scope="module")
def ragged_data(tmp_path_factory):
    """Multi-hot bags with null bags, empty bags, null ids and out-of-range ids, over 3 files."""
    out = str(tmp_path_factory.mktemp("ragged"))
    os.makedirs(os.path.join(out, "train"))
    rng = np.random.default_rng(0)
    for part in range(3):
        n = 500
        bags = []
        for r in range(n):
            if r % 17 == 0:
                bags.append(None)
            elif r % 5 == 0:
                bags.append([])
            else:
                bag = rng.zipf(1.5, size=rng.integers(1, 6)).tolist()
                if r % 41 == 0:
                    bag.append(None)
                bags.append([min(x, 300) - 1 for x in bag if x is not None] + [None] * (None in bag))
        one_hot = pa.array([None if r % 23 == 0 else int(rng.integers(0, 60)) for r in range(n)], pa.int64())
        t = pa.table({
            "label": pa.array(rng.random(n) < 0.3, pa.float32()),
            "C1": pa.array(bags, pa.list_(pa.int64())),
            "C2": one_hot,
        })
        pq.write_table(t, os.path.join(out, "train", f"part-{part:05d}.parquet"))
    DatasetSchema("label", (), (SparseFeature("C1", 250, True), SparseFeature("C2", 50))).save(out)
    return out


@pytest.mark.parametrize("in_process", [False, True], ids=["ray-data", "in-process"])
def test_multi_hot_nulls_empty_bags_and_invalid_ids(ray_local, ragged_data, in_process):
    stats = compute_stats(ragged_data, exact=True, in_process=in_process)
    tab = pq.read_table(parquet_files(ragged_data))
    c1 = tab.column("C1").combine_chunks()
    flat = c1.flatten()
    lengths = np.array([len(b) if b is not None else 0 for b in c1.to_pylist()])
    ids = flat.drop_null().to_numpy()
    t = stats.tables["C1"]
    assert t.rows == 1500
    assert t.values == ids.size
    assert t.nulls == c1.null_count + flat.null_count and c1.null_count > 0 and flat.null_count > 0
    assert (t.pooling_mean, t.pooling_max) == (pytest.approx(ids.size / 1500), int(lengths.max()))
    assert t.invalid == int(np.count_nonzero(ids >= 250)) > 0
    assert t.max_id == int(ids.max()) and all(x >= 250 for x in t.invalid_examples)
    valid = ids[ids < 250]
    assert sum(c for _, c in t.heavy_hitters) == valid.size
    assert t.distinct == np.unique(valid).size

    c2 = tab.column("C2")
    t2 = stats.tables["C2"]
    v2 = c2.drop_null().to_numpy()
    assert t2.nulls == c2.null_count > 0 and t2.values == v2.size
    assert t2.invalid == int(np.count_nonzero(v2 >= 50)) > 0

    with pytest.raises(DataError) as ei:
        check_ids(stats, DatasetSchema.load(ragged_data), "error")
    msg = str(ei.value)
    assert "'C1'" in msg and "'C2'" in msg and f"{t.invalid:,} of" in msg


def test_reuse_matching_stats_json_and_recompute_stale(ray_local, ragged_data, tmp_path):
    path = str(tmp_path / "stats.json")
    stats = dataclasses.replace(compute_stats(ragged_data, num_heavy_hitters=8), elapsed_s=-1.0)  # the marker
    write_stats_json(stats, path)
    assert load_or_compute_stats(ragged_data, path).elapsed_s == -1.0
    victim = parquet_files(ragged_data)[0]
    st = os.stat(victim)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # "rewritten" file
    fresh = load_or_compute_stats(ragged_data, path)
    assert fresh.elapsed_s != -1.0 and fresh.fingerprint != stats.fingerprint


def test_stats_cli_entry(ray_local, zipf_data, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_stats_arguments(parser)
    out = str(tmp_path / "s.json")
    png = str(tmp_path / "f.png")
    args = parser.parse_args(["--data", zipf_data, "--out", out, "--num-heavy-hitters", "32", "--plot", png])
    assert stats_main(args) == 0
    with open(out) as f:
        stats = json.load(f)
    assert set(stats["tables"]) == {"C1", "C2", "C3", "C4"} and stats["num_heavy_hitters"] == 32
    assert os.path.getsize(png) > 1000
    printed = capsys.readouterr().out
    assert "C1" in printed and "wrote" in printed
