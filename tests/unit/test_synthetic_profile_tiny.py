"""``criteo-1tb-tiny``, criteo-1tb-scaled's CI-size twin: the same 26 tables in the same proportions, the same floor
and the same exponents, at a size whose jobs cost a test seconds; ``rayemb gen-data --profile`` and
``multinode.py --workload`` know it."""

import os

import pytest

from rayemb.cli import main as cli_main
from rayemb.data.profiles import get_profile, load_profile_json
from rayemb.data.schema import DatasetSchema

TINY = get_profile("criteo-1tb-tiny")
SCALED = get_profile("criteo-1tb-scaled")


def test_tiny_keeps_the_scaled_profiles_tables_in_proportion():
    tiny, scaled = TINY.cardinalities(), SCALED.cardinalities()
    assert len(tiny) == len(scaled) == 26 and TINY.min_rows == SCALED.min_rows
    largest, scaled_largest = max(tiny), max(scaled)
    assert 10_000 <= largest <= 20_000
    assert tiny.index(largest) == scaled.index(scaled_largest)
    for v, s, base in zip(tiny, scaled, TINY.base_cardinalities):
        if v > TINY.min_rows:  # the ratio to the largest is the scaled one's, up to each ceiling's row
            assert abs(v / largest - s / scaled_largest) <= 1 / largest + 1 / scaled_largest, (v, s, base)
        else:  # a table under the floor keeps its real size up to the floor, as in the scaled profile
            assert v == min(base, TINY.min_rows), (v, s, base)
    # a table no larger than the floor in the scaled profile is the same table here
    assert [v for v, s in zip(tiny, scaled) if s <= SCALED.min_rows] == [s for s in scaled if s <= SCALED.min_rows]
    # the order of the tables by size is the scaled one's, ties aside
    assert all((a - b) * (c - d) >= 0 for i, (a, c) in enumerate(zip(tiny, scaled))
               for b, d in zip(tiny[i + 1:], scaled[i + 1:]))


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_tiny_deals_the_scaled_profiles_exponents(seed):
    assert TINY.alpha_range == SCALED.alpha_range == (0.8, 1.3)
    alphas = TINY.zipf_alphas(seed)
    assert alphas == SCALED.zipf_alphas(seed)  # every table keeps its exponent: the same table, smaller
    assert len(set(alphas)) == 26 and min(alphas) == 0.8 and max(alphas) == 1.3


def test_gen_data_writes_the_tiny_profile(tmp_path):
    out = str(tmp_path / "d")
    assert cli_main(["gen-data", "--profile", "criteo-1tb-tiny", "--out", out, "--rows", "2000"]) == 0
    assert [f.num_embeddings for f in DatasetSchema.load(out).sparse] == TINY.cardinalities()
    doc = load_profile_json(out)
    assert doc["profile"] == "criteo-1tb-tiny" and doc["rows"] == 2000 and doc["scale"] == TINY.scale
    assert [t["zipf_alpha"] for t in doc["tables"]] == SCALED.zipf_alphas(0)
    # at the scaled job's dim 64 its fp32 tables hold MiBs (a test's checkpoints), the scaled profile's GiBs
    assert sum(TINY.cardinalities()) * 64 * 4 < 32 * 2**20 and sum(SCALED.cardinalities()) * 64 * 4 > 2 * 2**30


def test_multinode_runs_tiny_on_the_scaled_workloads_config():
    from tests._bench import load_bench

    bench = load_bench("multinode")
    assert bench.WORKLOADS["criteo-1tb-tiny"] == bench.WORKLOADS["criteo-1tb-scaled"]
    assert bench.PROFILE["criteo-1tb-tiny"] == "criteo-1tb-tiny"
    assert os.path.basename(bench.WORKLOADS["criteo-1tb-tiny"][0]) == "criteo_1tb_scaled.yaml"
