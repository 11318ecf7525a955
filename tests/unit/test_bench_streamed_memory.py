"""The pure parts of jobs/bench/streamed_memory.py: the verdict (a missing, failed or short row FAILs, and so
does a job that did not stream every step under its limit), the rows and the data still to read. No Ray."""

from __future__ import annotations

import re

import pytest

from tests._bench import load_bench

sm = load_bench("streamed_memory")
GIB = 2**30


def _memory(**changes):
    rec = {"returncode": 0, "status": "FINISHED", "trained_steps": 439, "epoch_steps": 439, "streamed_line": True,
           "in_memory_resolved": "False", "limit_bytes": 5 * GIB, "peak_before_bytes": 4.75 * GIB,
           "headroom_bytes": GIB // 4, "read_after_limit": {"parquet_bytes": GIB, "converted_bytes": 2 * GIB},
           "read_after_limit_over_headroom": 4.0, "data_over_workers_share": 0.4, "peak_bytes": 5 * GIB,
           "peak_anon_shmem_bytes": 4.5 * GIB, "failcnt": 12, "oom_kill": 0, "under_oom": 0}
    rec.update(changes)
    return rec


def _runs(b512=(50_000.0,) * 3, b8192=(80_000.0,) * 3, errors=()):
    runs = [{"batch_size": 512, "rows_per_s": v, "ids_per_s": 128 * v, "parquet_mb_per_s": v / 1e3, "start_s": 2.0}
            for v in b512]
    runs += [{"batch_size": 8192, "rows_per_s": v, "ids_per_s": 128 * v, "start_s": 2.5} for v in b8192]
    runs += [{"batch_size": bs, "error": "RayTaskError: boom"} for bs in errors]
    return runs


def _rows(runs):
    return [sm.rate_row(bs, runs) for bs in sm.BATCH_SIZES]


def test_a_streamed_job_under_its_limit_and_full_rows_pass():
    v = sm.verdict(_memory(), _rows(_runs()))
    assert v["verdict"] == "PASS" and v["problems"] == [], v


@pytest.mark.parametrize("memory,rows,problem", [
    (None, lambda: _rows(_runs()), "memory: missing"),
    (_memory(), lambda: [sm.rate_row(8192, _runs())], "b512: missing"),  # batch 512 never ran
    (_memory(), lambda: _rows(_runs(errors=(8192,))), "b8192: 1 failed run(s)"),
    (_memory(), lambda: _rows(_runs(b512=(50_000.0,) * 2)), "b512: 2 run(s), fewer than the 3 it needs"),
    (_memory(), lambda: _rows(_runs(b8192=())), "b8192: no run"),
])
def test_a_missing_failed_or_short_row_fails(memory, rows, problem):
    v = sm.verdict(memory, rows())
    assert v["verdict"] == "FAIL" and problem in v["problems"], v


@pytest.mark.parametrize("changes,problem", [
    ({"returncode": 1, "status": "FAILED"}, "the job did not finish (exit 1, status FAILED)"),
    ({"trained_steps": 300}, "trained 300 of 439 steps"),
    ({"in_memory_resolved": "True"}, "the job did not stream (data.in_memory_resolved=True)"),
    ({"streamed_line": False}, "the job did not stream (data.in_memory_resolved=False)"),
    ({"oom_kill": 1}, "OOM: oom_kill=1 under_oom=0"),
    ({"peak_anon_shmem_bytes": 5 * GIB}, "the peak passed the limit"),
    ({"read_after_limit_over_headroom": 3.5}, "data read under the limit is 3.50x the headroom, below 4x"),
    ({"error": "RuntimeError: the head did not start"}, "memory: RuntimeError: the head did not start"),
])
def test_a_job_that_did_not_stream_every_step_under_its_limit_fails(changes, problem):
    v = sm.verdict(_memory(**changes), _rows(_runs()))
    assert v["verdict"] == "FAIL" and problem in v["problems"], v


def test_a_limit_never_tightened_fails_and_says_so():
    rec = {k: v for k, v in _memory().items() if k != "limit_bytes"}
    assert "the limit was never tightened (the job printed no progress past the point)" in sm.memory_problems(rec)


def test_the_workers_share_ratio_is_asked_only_when_given():
    assert sm.memory_problems(_memory()) == []
    assert sm.memory_problems(_memory(), share_ratio=4.0) == [
        "the dataset is 0.40x the workers' share of the limit, below 4x"]
    assert sm.memory_problems(_memory(data_over_workers_share=4.2), share_ratio=4.0) == []


def test_rate_row_gives_median_spread_and_per_worker_cpu():
    row = sm.rate_row(512, _runs(b512=(40_000.0, 50_000.0, 70_000.0)), worker_cpus=1.0)
    assert (row["runs"], row["failed"], row["rows_per_s"]) == (3, 0, 50_000.0)
    assert row["rows_per_s_spread"] == {"median": 50_000.0, "min": 40_000.0, "max": 70_000.0, "n": 3}
    assert row["per_worker_cpu"] == 50_000.0 and row["m_ids_per_s"] == pytest.approx(6.4)
    assert sm.rate_row(512, _runs(b512=(40_000.0,)), worker_cpus=0.5)["per_worker_cpu"] == 80_000.0
    empty = sm.rate_row(8192, [])
    assert (empty["runs"], empty["rows_per_s"], empty["per_worker_cpu"]) == (0, None, None)


def test_data_still_to_read_is_the_rest_of_train_and_all_of_valid():
    sizes = {"train": {"parquet_bytes": 1000, "converted_bytes": 2000},
             "valid": {"parquet_bytes": 100, "converted_bytes": 200}}
    assert sm.still_to_read(sizes, 25, 100) == {"parquet_bytes": 850, "converted_bytes": 1700}
    assert sm.still_to_read(sizes, 100, 100) == {"parquet_bytes": 100, "converted_bytes": 200}
    ratios = sm.memory_ratios({"headroom_bytes": 200, "read_after_limit": {"parquet_bytes": 850,
                                                                            "converted_bytes": 1700},
                               "limit_bytes": 1500, "store_bytes": 300},
                              {"parquet_bytes": 1100, "converted_bytes": 2200}, idle_head_bytes=200)
    assert ratios["read_after_limit_over_headroom"] == 4.25
    assert ratios["workers_share_bytes"] == 1000 and ratios["data_over_workers_share"] == 1.1


def test_process_kinds_name_ray_workers_and_daemons():
    assert sm.process_kind("ray::RayTrainWorker.train_fn") == "RayTrainWorker"
    assert sm.process_kind("ray::ReadFilesParquetV2->SplitBlocks(2)").startswith("ReadFiles")
    assert sm.process_kind("/v/bin/python /v/bin/ray start --head --block") == "ray start"
    assert sm.process_kind("/r/raylet/raylet --python_worker_command=/v/python /r/default_worker.py") == "raylet"
    assert sm.process_kind("/v/bin/python3.11 -u /r/_private/log_monitor.py --x") == "log_monitor.py"
    assert sm.process_kind("/v/bin/python -m ray.util.client.server --x") == "ray.util.client.server"


def test_result_file_is_named_by_date_and_commit():
    name = sm.default_out().rsplit("/", 1)[-1]
    assert re.fullmatch(r"streamed_memory_\d{4}-\d{2}-\d{2}_([0-9a-f]{7}|unknown)\.json", name)
