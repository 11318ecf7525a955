"""``rayemb gen-data --profile criteo-1tb-scaled``: Criteo 1TB's proportions, a Zipf exponent per table, and a
plan that cannot replicate the large tables."""

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayemb.cli import main as cli_main
from rayemb.constants import CRITEO_1TB_CARDINALITIES
from rayemb.data.profiles import PROFILE_JSON, generate_profile, get_profile, load_profile_json
from rayemb.data.schema import DatasetSchema
from rayemb.data.synthetic import SyntheticSpec, _ZipfTable
from rayemb.errors import DataError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "criteo-1tb-scaled"
ROWS = 20_000
PROFILE = get_profile(NAME)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("c1tb") / "data")
    generate_profile(NAME, out, rows=ROWS, seed=0)
    return out


def test_tables_keep_criteo_1tb_proportions(generated):
    sizes = [f.num_embeddings for f in DatasetSchema.load(generated).sparse]
    assert len(sizes) == 26 and sizes == PROFILE.cardinalities()
    largest, base_largest = max(sizes), max(CRITEO_1TB_CARDINALITIES)
    assert 1_000_000 <= largest <= 4_000_000
    assert sizes.index(largest) == CRITEO_1TB_CARDINALITIES.index(base_largest)
    for v, base in zip(sizes, CRITEO_1TB_CARDINALITIES):
        if v > PROFILE.min_rows:  # scaled: the ratio to the largest is Criteo's, up to the ceiling's one row
            assert abs(v / largest - base / base_largest) <= 1 / largest, (v, base)
        else:  # a tiny table keeps its real size up to the floor instead of collapsing to a row or two
            assert v == min(base, PROFILE.min_rows), (v, base)
    assert min(sizes) == min(CRITEO_1TB_CARDINALITIES) == 3


def test_each_table_has_its_own_exponent_recorded(generated):
    alphas = PROFILE.zipf_alphas(0)
    assert len(set(alphas)) == 26 and all(0.8 <= a <= 1.3 for a in alphas)
    assert max(alphas) - min(alphas) == pytest.approx(0.5)
    doc = load_profile_json(generated)
    assert doc["profile"] == NAME and doc["rows"] == ROWS and doc["train_rows"] + doc["valid_rows"] == ROWS
    assert [t["zipf_alpha"] for t in doc["tables"]] == alphas
    assert [t["rows"] for t in doc["tables"]] == PROFILE.cardinalities()
    assert PROFILE.zipf_alphas(1) != alphas  # another seed deals the exponents to other tables


def _fitted_slope(rows: int, alpha: float, draws: int = 200_000, top: int = 100) -> float:
    """Least-squares slope of log(count) against log(rank) over the ``top`` most popular ranks."""
    table = _ZipfTable(rows, alpha, np.random.default_rng(0))
    counts = np.bincount(table.sample(draws, np.random.default_rng(1)), minlength=rows)
    ranks = np.arange(1, top + 1)
    observed = counts[table.rank_to_id(ranks - 1)]
    return float(np.polyfit(np.log(ranks), np.log(np.maximum(observed, 1)), 1)[0])


def test_id_frequencies_follow_each_tables_exponent():
    sizes, alphas = PROFILE.cardinalities(), PROFILE.zipf_alphas(0)
    big = [(v, a) for v, a in zip(sizes, alphas) if v >= 1000]
    fits = {a: _fitted_slope(v, a) for v, a in big}
    for alpha, slope in fits.items():
        assert abs(-slope - alpha) < 0.1, (alpha, slope)
    flat, steep = min(fits), max(fits)
    assert steep - flat > 0.3 and -fits[steep] > -fits[flat] + 0.2  # the tolerance separates the exponents


def test_generated_ids_hold_each_tables_top_share(generated):
    """The rows written use each table's own exponent: the most popular id's share is 1 / sum_r r^-alpha."""
    train = pq.read_table(os.path.join(generated, "train"))
    for t, (v, alpha) in enumerate(zip(PROFILE.cardinalities(), PROFILE.zipf_alphas(0))):
        if v < 1000:
            continue
        ids = train.column(f"C{t + 1}").to_numpy()
        top_share = np.bincount(ids).max() / len(ids)
        expected = 1.0 / np.sum(np.arange(1, v + 1, dtype=np.float64) ** -alpha)
        assert abs(top_share - expected) < 0.02, (t, alpha, top_share, expected)


def test_deterministic_for_a_seed(generated, tmp_path):
    again = str(tmp_path / "again")
    generate_profile(NAME, again, rows=ROWS, seed=0)
    other = str(tmp_path / "other")
    generate_profile(NAME, other, rows=ROWS, seed=1)
    for split in ("train", "valid"):
        assert pq.read_table(os.path.join(generated, split)).equals(pq.read_table(os.path.join(again, split)))
    assert load_profile_json(generated) == load_profile_json(again)
    assert not pq.read_table(os.path.join(generated, "train")).column("C1").equals(
        pq.read_table(os.path.join(other, "train")).column("C1"))


def test_default_rows_give_2000_steps_at_global_batch_4096():
    spec = PROFILE.spec()
    train = spec.rows - max(1, int(round(spec.rows * spec.valid_fraction)))
    assert train // 4096 >= 2000


def test_profile_rejects_the_shape_it_fixes(tmp_path):
    with pytest.raises(DataError, match="zipf_alpha"):
        PROFILE.spec(ROWS, zipf_alpha=1.0)
    with pytest.raises(DataError, match="Unknown data profile"):
        get_profile("criteo-2tb")
    with pytest.raises(DataError, match="one per table"):
        SyntheticSpec(rows=100, num_tables=3, zipf_alphas=[1.0, 1.1])
    assert cli_main(["gen-data", "--profile", NAME, "--out", str(tmp_path / "d"), "--scale", "8"]) == 2
    assert cli_main(["gen-data", "--out", str(tmp_path / "d")]) == 2  # neither --rows nor --profile
    assert not (tmp_path / "d").exists()


def test_plain_gen_data_drops_a_stale_profile_record(tmp_path):
    out = str(tmp_path / "d")
    assert cli_main(["gen-data", "--profile", NAME, "--out", out, "--rows", "3000"]) == 0
    assert load_profile_json(out)["rows"] == 3000
    assert cli_main(["gen-data", "--out", out, "--rows", "3000", "--tables", "3"]) == 0
    assert not os.path.exists(os.path.join(out, PROFILE_JSON))


def test_job_config_plan_does_not_replicate_the_large_tables(generated, tmp_path):
    """The job's tables at dim 64 on 2 ranks: the four tables over 1M rows are hybrid or sharded, never replicated."""
    cfg = os.path.join(REPO, "jobs", "configs", "criteo_1tb_scaled.yaml")
    stats, out = str(tmp_path / "stats.json"), str(tmp_path / "plan.json")
    assert cli_main(["stats", "--data", generated, "--out", stats]) == 0
    assert cli_main(["plan", "--config", cfg, "--set", f"data.path={generated}", "--stats", stats,
                     "--world-size", "2", "--cpu", "--out", out]) == 0
    with open(out) as f:
        plan = json.load(f)
    assert plan["global_batch"] == 4096
    large = [f"C{t + 1}" for t, v in enumerate(PROFILE.cardinalities()) if v >= 1_000_000]
    assert len(large) == 4
    for name in large:
        assert plan["tables"][name]["placement"] != "data_parallel", (name, plan["tables"][name])


def test_memory_benchmark_verdict_is_on_peak_growth():
    from tests._bench import load_bench

    bench = load_bench("gen_data_memory")
    flat = [{"rows": 1_000_000, "peak_rss_mib": 520.0}, {"rows": 4_000_000, "peak_rss_mib": 540.0}]
    grows = [{"rows": 1_000_000, "peak_rss_mib": 520.0}, {"rows": 4_000_000, "peak_rss_mib": 900.0}]
    assert bench.verdict(flat)["verdict"] == "PASS"
    assert bench.verdict(grows)["verdict"] == "FAIL" and bench.verdict(grows)["rows_ratio"] == 4.0
