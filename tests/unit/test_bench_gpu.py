"""jobs/bench/gpu.py: a tiny CPU run end to end (its JSON checked against what it measured), and its pure parts."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests._bench import BENCH_DIR, load_bench

gb = load_bench("gpu")
REPO = Path(__file__).resolve().parents[2]
BATCHES, STEPS, REPEATS = (64, 256), 4, 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "gpu_tiny.json"
    # the bounds guard a hang, not the speed: alone the run takes about 30 s, beside the whole suite at the lowest
    # CPU priority (CI's Python 3.12 pass) over 85 s
    cmd = ["timeout", "300", sys.executable, str(Path(BENCH_DIR) / "gpu.py"), "--device", "cpu", "--tiny",
           "--steps", str(STEPS), "--repeats", str(REPEATS), "--out", str(out)]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=310)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text()), p.stdout


def test_three_rows_per_batch_size_each_timed_and_trained(tiny):
    doc, _ = tiny
    rows = doc["rows"]
    assert sorted((r["global_batch"], r["row"]) for r in rows) == sorted(
        (b, n) for b in BATCHES for n in ("rayemb", "dmp_on_device", "torchrec_pipeline"))
    for r in rows:
        where = f"{r['global_batch']} {r['row']}"
        assert r["failed"] == 0 and r["error"] is None, where
        assert r["runs"] == REPEATS and r["steps_per_round"] == STEPS and r["steps_timed"] == REPEATS * STEPS, where
        ms = (r["step_ms_min"], r["step_ms"], r["step_ms_max"])
        assert all(math.isfinite(x) and x > 0 for x in ms) and ms[0] <= ms[1] <= ms[2], where
        assert r["samples_per_s"] == pytest.approx(r["global_batch"] / (r["step_ms"] / 1e3)), where
        # one mean loss per round, the warm-up round included, read from the device after the timing
        assert len(r["losses"]) == REPEATS + 1 and all(math.isfinite(x) for x in r["losses"]), where
        assert r["losses_finite"] is True and r["loss_first"] == r["losses"][0], where
        assert r["loss_last"] < r["loss_first"], f"{where} did not train: {r['losses']}"
        assert sum(r["plan"].values()) == 26, where  # every table of the default job placed


def test_ratios_are_rayembs_samples_per_s_over_each_rows(tiny):
    doc, _ = tiny
    for b in BATCHES:
        by = {r["row"]: r for r in doc["rows"] if r["global_batch"] == b}
        mine = by["rayemb"]["samples_per_s"]
        assert by["rayemb"]["rayemb_ratio"] == pytest.approx(1.0)
        for peer in ("dmp_on_device", "torchrec_pipeline"):
            assert by[peer]["rayemb_ratio"] == pytest.approx(mine / by[peer]["samples_per_s"])
        phases = by["rayemb"]["phases_ms"]  # the loop's StepTimer, per step
        assert set(phases) == {"data_wait", "forward", "backward", "optimizer"} and phases["forward"] > 0


def test_the_document_names_device_versions_and_verdicts(tiny):
    import fbgemm_gpu
    import torch
    import torchrec

    doc, stdout = tiny
    assert doc["device"]["type"] == "cpu" and doc["device"]["name"]
    assert doc["versions"] == {"torch": torch.__version__, "fbgemm_gpu": fbgemm_gpu.__version__,
                               "torchrec": torchrec.__version__}
    assert doc["config"]["batches"] == list(BATCHES) and doc["config"]["world_size"] == 1
    assert set(doc["verdicts"]) == {"b8192_samples_per_s", "b8192_vs_dmp_on_device", "b512_vs_dmp_on_device"}
    assert all(v["verdict"] == "n/a (cpu)" and v["rule"] for v in doc["verdicts"].values())
    assert doc["job"] is None and doc["config"]["compile"] is None  # no compiled row unless asked
    assert "torchrec_pipeline" in stdout and "n/a (cpu)" in stdout  # the printed table and verdicts


def _row(batch, name, sps, runs=5, failed=0):
    return {"global_batch": batch, "row": name, "samples_per_s": sps, "runs": runs, "failed": failed}


def _passing():
    return [_row(8192, "rayemb", 4.0e6), _row(8192, "dmp_on_device", 1.5e6), _row(8192, "torchrec_pipeline", 3e6),
            _row(512, "rayemb", 2.0e5), _row(512, "dmp_on_device", 1.0e5)]


def test_verdicts_pass_on_numbers_that_meet_the_targets():
    v = gb.verdicts(_passing(), "cuda")
    assert {k: x["verdict"] for k, x in v.items()} == dict.fromkeys(v, "PASS")
    assert v["b8192_samples_per_s"]["value"] == 4.0e6
    assert v["b8192_vs_dmp_on_device"]["value"] == pytest.approx(4.0 / 1.5)
    assert v["b512_vs_dmp_on_device"]["value"] == pytest.approx(2.0)


def test_a_missing_failed_or_short_row_fails_its_verdict():
    rows = [r for r in _passing() if (r["global_batch"], r["row"]) != (512, "dmp_on_device")]
    v = gb.verdicts(rows, "cuda")
    assert v["b512_vs_dmp_on_device"]["verdict"] == "FAIL"
    assert v["b512_vs_dmp_on_device"]["problems"] == {"dmp_on_device": "missing"}
    assert v["b8192_vs_dmp_on_device"]["verdict"] == "PASS"  # the other targets stand
    failed = [dict(r, failed=1, samples_per_s=None, runs=0) if r["row"] == "rayemb" else r for r in _passing()]
    assert all(x["verdict"] == "FAIL" for x in gb.verdicts(failed, "cuda").values())
    short = [dict(r, runs=gb.MIN_RUNS - 1) for r in _passing()]
    assert all(x["verdict"] == "FAIL" for x in gb.verdicts(short, "cuda").values())


def test_verdicts_fail_below_target_and_read_na_on_a_cpu():
    slow = [dict(r, samples_per_s=1.2e5) if (r["global_batch"], r["row"]) == (512, "rayemb") else r
            for r in _passing()]
    v = gb.verdicts(slow, "cuda")
    assert v["b512_vs_dmp_on_device"]["verdict"] == "FAIL" and v["b512_vs_dmp_on_device"]["value"] == pytest.approx(1.2)
    assert all(x["verdict"] == "n/a (cpu)" for x in gb.verdicts(_passing(), "cpu").values())


def test_summarise_reads_per_step_times_and_marks_a_failed_row():
    timed = SimpleNamespace(steps=2, losses=[0.7, 0.5, 0.4], error=None, built={"plan": {"table_wise": 26}})
    r = gb.summarise(512, "rayemb", timed, [0.004, 0.002, 0.003])
    assert (r["runs"], r["step_ms"], r["step_ms_min"], r["step_ms_max"]) == (3, 1.5, 1.0, 2.0)
    assert r["samples_per_s"] == pytest.approx(512 / 0.0015) and r["steps_timed"] == 6
    assert (r["loss_first"], r["loss_last"], r["losses_finite"]) == (0.7, 0.4, True)
    bad = gb.summarise(512, "dmp_on_device", SimpleNamespace(steps=2, losses=[], error="step: boom", built={}), [])
    assert (bad["runs"], bad["failed"], bad["samples_per_s"], bad["error"]) == (0, 1, None, "step: boom")


def test_the_default_result_name_carries_the_date_and_seven_hex_digits():
    assert gb.default_out("630839fabcdef", "2026-11-27") == "bench-results/gpu_2026-11-27_630839f.json"


def test_a_row_that_raises_is_marked_failed_and_the_others_are_still_timed():
    import torch

    calls = []

    def good():
        return {"run": lambda n: (calls.append(n), torch.tensor(0.5 * n))[1]}

    def breaks_later():
        return {"run": lambda n: 1 / 0}

    timed = gb.time_batch({"good": good, "no_build": lambda: {}["missing"], "breaks": breaks_later}, steps=2,
                          repeats=3, device=torch.device("cpu"))
    row, times = timed["good"]
    assert calls == [2] * 4 and len(times) == 3 and row.error is None  # a warm-up round, then three timed
    assert [float(x) for x in row.losses] == [0.5] * 4
    assert timed["no_build"][0].error.startswith("build: KeyError")
    assert timed["breaks"][0].error.startswith("step: ZeroDivisionError")
    assert gb.summarise(64, "breaks", *timed["breaks"])["failed"] == 1


def test_compile_adds_a_rayemb_compiled_row_that_no_verdict_rests_on():
    import torch

    args = [None, None, None, 512, [], torch.device("cpu"), None]  # cfg, schema, stats, batch, tables, device, hbm
    assert list(gb.row_builders(None, *args)) == ["rayemb", "dmp_on_device", "torchrec_pipeline"]
    assert list(gb.row_builders("reduce-overhead", *args)) == ["rayemb", "dmp_on_device", "torchrec_pipeline",
                                                               "rayemb_compiled"]
    assert gb.parse_args(["--compile", "reduce-overhead", "--out", "x.json"]).compile == "reduce-overhead"
    assert gb.parse_args(["--out", "x.json"]).compile is None
    with pytest.raises(SystemExit):
        gb.parse_args(["--compile", "fast"])
    fast_compiled = [_row(8192, "rayemb_compiled", 9e9), _row(512, "rayemb_compiled", 9e9)]
    assert gb.verdicts(_passing() + fast_compiled, "cuda") == gb.verdicts(_passing(), "cuda")
    slow = [dict(r, samples_per_s=1.2e5) if (r["global_batch"], r["row"]) == (512, "rayemb") else r
            for r in _passing()]
    assert gb.verdicts(slow + fast_compiled, "cuda")["b512_vs_dmp_on_device"]["verdict"] == "FAIL"


def test_a_compiled_rows_losses_are_compared_with_rayembs():
    rows = [dict(_row(64, "rayemb", 1.0), losses=[0.7, 0.6, 0.5]),
            dict(_row(64, "rayemb_compiled", 1.0), losses=[0.7, 0.61, 0.5]),
            dict(_row(256, "rayemb_compiled", 1.0), losses=[0.7])]  # no rayemb row at 256 to compare with
    gb.add_loss_diffs(rows)
    assert rows[1]["loss_max_diff_vs_rayemb"] == pytest.approx(0.01)
    assert rows[2]["loss_max_diff_vs_rayemb"] is None and "loss_max_diff_vs_rayemb" not in rows[0]
