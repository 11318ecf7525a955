"""jobs/bench/raw_ids_auc.py: its datasets hold the same rows (raw ids a one-to-one map of the encoded ones,
capacities by the rule), and its verdicts FAIL on a missing run, a lost margin, raw tables not placed as the
side says or no logged eviction."""

from __future__ import annotations

import numpy as np
import pytest
import pyarrow.parquet as pq
import yaml

from rayemb.data.synthetic import SyntheticSpec, generate
from tests._bench import load_bench

rb = load_bench("raw_ids_auc")


def test_the_views_map_every_id_one_to_one_and_size_the_tables(tmp_path):
    data = str(tmp_path / "data")
    generate(SyntheticSpec(rows=3_000, num_tables=3, scale=2_000), data)
    views = rb.make_views(data, str(tmp_path / "views"))
    enc = yaml.safe_load(open(f"{data}/schema.yaml"))
    sizes = {s["name"]: s["num_embeddings"] for s in enc["sparse"]}
    for view, capacity in (("raw_full", lambda v: v + rb.CAPACITY_SLACK), ("raw_quarter", lambda v: max(rb.QUARTER_MIN, v // 4)),
                           ("hash_quarter", lambda v: max(rb.QUARTER_MIN, v // 4))):
        got = yaml.safe_load(open(f"{views[view]}/schema.yaml"))
        assert {s["name"]: s["num_embeddings"] for s in got["sparse"]} == {n: capacity(v) for n, v in sizes.items()}
        assert all((s.get("ids") == "raw") == view.startswith("raw") for s in got["sparse"])
        assert got["dense"] == enc["dense"] and got["label"] == enc["label"]
    for split in ("train", "valid"):
        a, b = pq.read_table(f"{data}/{split}"), pq.read_table(f"{views['raw_full']}/{split}")
        assert a.num_rows == b.num_rows and a["label"].equals(b["label"])
        for name in sizes:
            x, y = a[name].to_numpy(), b[name].to_numpy()
            assert y.dtype == np.int64 and (np.abs(y) > 2**40).mean() > 0.99  # 64-bit values, not small ids
            pairs = set(zip(x.tolist(), y.tolist()))
            assert len({p[0] for p in pairs}) == len({p[1] for p in pairs}) == len(pairs)  # one-to-one


def _r(seed, side, auc, evictions=None, placed=None):
    placements = {"raw_full": {"C1": "hybrid", "C2": "row_wise"}, "raw_full_row_wise": {"C1": "row_wise",
                                                                                        "C2": "row_wise"}}
    return {"seed": seed, "side": side, "valid_auc": auc, "best_valid_auc": auc + 0.02, "evictions": evictions,
            "raw_placements": placed if placed is not None else placements.get(side, {})}


def test_verdicts_pass_and_fail_by_margin_placement_order_evictions_and_missing_runs():
    ok = [_r(0, "encoded", 0.910), _r(0, "raw_full", 0.907), _r(0, "raw_full_row_wise", 0.906),
          _r(0, "raw_quarter", 0.90, 12.0), _r(0, "hash_quarter", 0.89)]
    assert {v["verdict"] for v in rb.verdicts(ok, [0]).values()} == {"PASS"}
    far = [_r(0, "encoded", 0.910), _r(0, "raw_full", 0.904)] + ok[2:]
    assert rb.verdicts(far, [0])["raw_full_vs_encoded"]["verdict"] == "FAIL"
    assert rb.verdicts(far, [0])["raw_full_row_wise_vs_encoded"]["verdict"] == "PASS"
    # a side whose plan did not place the raw tables as it says does not count
    unplaced = ok[:1] + [_r(0, "raw_full", 0.907, placed={"C1": "row_wise", "C2": "row_wise"})] + ok[2:]
    assert rb.verdicts(unplaced, [0])["raw_full_vs_encoded"]["verdict"] == "FAIL"
    mixed = ok[:2] + [_r(0, "raw_full_row_wise", 0.906, placed={"C1": "hybrid", "C2": "row_wise"})] + ok[3:]
    assert rb.verdicts(mixed, [0])["raw_full_row_wise_vs_encoded"]["verdict"] == "FAIL"
    worse = ok[:3] + [_r(0, "raw_quarter", 0.88, 12.0), _r(0, "hash_quarter", 0.89)]
    assert rb.verdicts(worse, [0])["raw_quarter_vs_hash_quarter"]["verdict"] == "FAIL"
    quiet = ok[:3] + [_r(0, "raw_quarter", 0.90, None), ok[4]]
    assert rb.verdicts(quiet, [0])["raw_quarter_evictions_logged"]["verdict"] == "FAIL"
    assert {v["verdict"] for v in rb.verdicts(ok, [0, 1]).values()} == {"FAIL"}  # seed 1 missing
    failed = ok[:1] + [{"seed": 0, "side": "raw_full", "error": "boom"}] + ok[2:]
    assert rb.verdicts(failed, [0])["raw_full_vs_encoded"]["verdict"] == "FAIL"
    assert rb.evictions({"evictions.C1": 3, "evictions.C2": 4.0, "valid_auc": 0.9}) == 7.0
    assert rb.evictions({"valid_auc": 0.9}) is None
    plan = {"raw_tables": ["C1"], "tables": {"C1": {"placement": "hybrid"}, "C2": {"placement": "row_wise"}}}
    assert rb.raw_placements(plan) == {"C1": "hybrid"} and rb.raw_placements({}) == {}


def test_verdicts_judge_the_last_epoch_not_the_best_one_picked_on_the_same_rows():
    ok = [_r(0, "encoded", 0.910), _r(0, "raw_full", 0.907), _r(0, "raw_full_row_wise", 0.906),
          _r(0, "raw_quarter", 0.90, 12.0), _r(0, "hash_quarter", 0.89)]
    # raw_full's best epoch matches encoded, its last epoch is 0.01 behind: that is a FAIL
    slipped = ok[:1] + [dict(ok[1], valid_auc=0.900, best_valid_auc=0.930)] + ok[2:]
    assert rb.verdicts(slipped, [0])["raw_full_vs_encoded"]["verdict"] == "FAIL"
    assert rb.verdicts(slipped, [0])["raw_full_vs_encoded"]["diff_per_seed"] == [pytest.approx(-0.010)]
