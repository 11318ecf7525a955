"""The hybrid_comm benchmark runs end to end on 2 gloo ranks and its cost model matches TorchRec's real traffic.

Not a timing test: it checks the JSON schema, that every plan moved bytes
(counted on the collectives TorchRec really called), that the DESIGN §4
predictor is within 10% of the measurement for every plan, and that hybrid
moves fewer bytes than pooled table-wise on one-hot Zipf 1.1 data.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

_BENCH_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "jobs", "bench")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hybrid_comm_bench_small(tmp_path) -> None:
    sys.path.insert(0, os.path.abspath(_BENCH_DIR))  # spawned ranks import the bench module by name
    import hybrid_comm

    out = tmp_path / "hybrid_comm.json"
    assert hybrid_comm.main(["--out", str(out), "--quick", "--world-sizes", "2", "--rows", "3000",
                             "--batch", "1024", "--dim", "32", "--steps", "2", "--stats-batches", "10"]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 1
    rows = {r["plan"]: r for r in doc["results"]}
    assert set(rows) == {"hybrid", "table_wise", "row_wise", "data_parallel"}
    for r in rows.values():
        assert {"alpha", "pooling", "world_size", "plan", "bytes_per_step", "predicted_bytes_per_step",
                "step_time_s"} <= set(r)
        assert r["world_size"] == 2 and r["alpha"] == 1.1 and r["pooling"] == 1.0
        assert r["bytes_per_step"] > 0 and r["step_time_s"] > 0
        assert abs(r["predicted_bytes_per_step"] / r["bytes_per_step"] - 1) < 0.10, r
    assert rows["hybrid"]["bytes_per_step"] < rows["table_wise"]["bytes_per_step"]
    assert rows["data_parallel"]["bytes_per_step"] == pytest.approx(2 * 1 * 4 * 3000 * 32 * 4)
