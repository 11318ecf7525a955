"""The hybrid_comm benchmark runs end to end on 2 and 4 gloo ranks and both cost models match TorchRec's real traffic.

Not a timing test: it checks the JSON schema, that every plan moved bytes
(counted on the collectives TorchRec really called), that the byte
predictor (:func:`rayemb.planner.traffic.predict_bytes_per_step`) and the planner's cost model (:func:`rayemb.planner.cost.table_bytes`,
fed with what stats.json would tell it) are within 10% of the measurement for
every plan at W = 2 and W = 4, and that hybrid moves fewer
bytes than pooled table-wise on one-hot Zipf 1.1 data.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

_BENCH_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "jobs", "bench")
_ROWS, _DIM = 3000, 32


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hybrid_comm_bench_small(tmp_path) -> None:
    sys.path.insert(0, os.path.abspath(_BENCH_DIR))  # spawned ranks import the bench module by name
    import hybrid_comm

    out = tmp_path / "hybrid_comm.json"
    assert hybrid_comm.main(["--out", str(out), "--quick", "--world-sizes", "2,4", "--rows", str(_ROWS),
                             "--batch", "1024", "--dim", str(_DIM), "--steps", "2", "--stats-batches", "10"]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 1
    assert doc["config"]["hybrid_cold"] == "row_wise"  # the cold sharding the planner deploys for hybrid tables
    by_w = {}
    for r in doc["results"]:
        by_w.setdefault(r["world_size"], {})[r["plan"]] = r
    assert sorted(by_w) == [2, 4]
    for w, rows in by_w.items():
        assert set(rows) == {"hybrid", "table_wise", "row_wise", "data_parallel"}
        for r in rows.values():
            assert {"alpha", "pooling", "world_size", "plan", "bytes_per_step", "predicted_bytes_per_step",
                    "planner_predicted_bytes_per_step", "step_time_s"} <= set(r)
            assert r["alpha"] == 1.1 and r["pooling"] == 1.0
            assert r["bytes_per_step"] > 0 and r["step_time_s"] > 0
            assert abs(r["predicted_bytes_per_step"] / r["bytes_per_step"] - 1) < 0.10, r
            assert abs(r["planner_predicted_bytes_per_step"] / r["bytes_per_step"] - 1) < 0.10, r
        assert rows["hybrid"]["bytes_per_step"] < rows["table_wise"]["bytes_per_step"]
        assert rows["hybrid"]["hot_rows"] > 0 and 0 < rows["hybrid"]["hot_share"] < 1
        # all-reduce of 4 tables x V x D fp32, 2·(W-1)·N bytes summed over ranks
        assert rows["data_parallel"]["bytes_per_step"] == pytest.approx(2 * (w - 1) * 4 * _ROWS * _DIM * 4)
        # one-hot: the stats-sample pooling factor is exactly 1, so the planner's TableSpecs equal the bench's inputs
        assert rows["table_wise"]["planner_predicted_bytes_per_step"] == pytest.approx(
            rows["table_wise"]["predicted_bytes_per_step"], rel=1e-9)
