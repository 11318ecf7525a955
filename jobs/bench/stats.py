"""Benchmark: ids counted per second by rayemb's stats pass vs numpy, pandas and Ray Data groupby.

    python jobs/bench/stats.py --rows 10000000 --cores 1 --out runs/bench/stats.json

Generates ``--rows`` train rows x ``--tables`` one-hot tables with
:mod:`rayemb.data.synthetic` (or uses ``--data DIR``), then measures, every
method on the same ``--cores`` cores (core-for-core):

- ``rayemb``: :func:`rayemb.data.stats.compute_stats` (heavy hitters + distinct +
  ranges, plus the label/dense value checks), one streaming Ray Data pass
  reading the parquet files, on a private local Ray with ``num_cpus=--cores``:
  the best of ``--repeats`` warm passes; ``rayemb_cold``: the first pass, which
  also starts Ray's worker processes;
- ``numpy``: ``np.unique(..., return_counts=True)`` per table on ids already in
  memory (no I/O); ``numpy_bincount``: ``np.bincount`` likewise (only valid
  because ids are dense in ``[0, V)``); ``numpy_io``: ``pq.read_table`` +
  ``np.unique`` per file, merged over files, i.e. numpy *including* the parquet
  decode rayemb's pass has to do;
- ``pandas``: ``pd.Series(ids).value_counts()`` per table, in memory;
- ``ray_groupby``: ``ds.groupby(col).count()`` per table on the same local Ray
  (``num_cpus=--cores``), on data already read into Ray's object store;
  ``ray_groupby_io``: the same plus the ``read_parquet`` that put it there.

Same cores: the numpy/pandas baselines run in ``--cores`` worker processes over
disjoint sets of files (balanced by rows); each worker loads its files first
(untimed, for the in-memory methods), then all start together and the time is
wall clock from the start until the driver has merged the per-worker counts
into one exact histogram per table (with one worker there is nothing to merge).
Unless ``--no-pin``, the whole process tree (Ray's raylet and workers, the
baseline workers) is pinned to ``--cores`` CPUs with ``sched_setaffinity``, so
no method can use more cores than it is credited with.

Same work: Ray Data groupby is far slower, so it runs on the first
``--groupby-rows`` rows (whole files) and ``--groupby-tables`` tables (0: all of
them); rayemb is then also run on exactly that subset (``rayemb_subset``: the
same files and tables, through a schema that declares only those tables), and
the groupby rows are compared with it. Every ratio in the table ("rayemb is")
is taken against the rayemb row of equal cores, rows and tables (``compared
with``); rows with none get no ratio. The ``parquet`` column says whether the
method's time includes reading and decoding the files (``read``) or starts
from ids in memory (``memory``).

Writes ``{"schema_version": 1, "results": [{"method", "cores", "work", "rows",
"tables", "values", "seconds", "values_per_s", "reads_parquet", "rayemb_is",
"compared_with"}], "rayemb_speedup": {method: ratio}, ...}`` to ``--out`` and
prints the table.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import report  # noqa: E402

COLUMNS = [("method", "<15", "{}"), ("cores", ">5", "{}"), ("work", "<6", "{}"), ("rows", ">12", "{:,}"),
           ("tables", ">6", "{}"), ("parquet", "<7", "{}"), ("M ids/s", ">9", "{:.2f}"),
           ("rayemb is", ">10", "{:.2f}x"), ("compared with (same cores, rows, tables)", "", "{}")]
KEYS = ["method", "cores", "work", "rows", "tables", "parquet", "mids_per_s", "rayemb_is", "compared_with"]

#: rows every other row is compared with (the rayemb pass on the same cores and work)
REFERENCES = ("rayemb", "rayemb_subset")
#: methods run by the baseline worker processes, in this order
BASELINES = ("numpy", "numpy_bincount", "pandas", "numpy_io")
IN_MEMORY = {"numpy", "numpy_bincount", "pandas", "ray_groupby"}

_WAIT_S = 3600.0  # a worker that has not answered by then has died


# ---- results and the like-for-like comparison (pure) ---- #


def _result(method: str, rows: int, tables: int, seconds: float, cores: int, work: str, **extra: Any
            ) -> Dict[str, Any]:
    values = rows * tables
    return {"method": method, "cores": cores, "work": work, "rows": rows, "tables": tables, "values": values,
            "seconds": round(seconds, 3), "values_per_s": values / seconds,
            "reads_parquet": method not in IN_MEMORY, **extra}


def _work_key(r: Dict[str, Any]) -> Tuple[Any, ...]:
    return r["cores"], r["rows"], r["tables"], r.get("work")


def compare_like_for_like(results: Sequence[Dict[str, Any]], references: Sequence[str] = REFERENCES
                          ) -> List[Dict[str, Any]]:
    """Copies of ``results`` with ``rayemb_is`` (reference speed / row speed) and ``compared_with``.

    A row is compared only with a reference row (``references``) of equal
    cores, rows, tables and work label; a row without one gets ``None`` for
    both, so no printed ratio ever mixes core counts or amounts of work.
    """
    refs: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for r in results:
        if r["method"] in references:
            refs.setdefault(_work_key(r), r)
    out = []
    for r in results:
        ref = refs.get(_work_key(r))
        ratio = ref["values_per_s"] / r["values_per_s"] if ref is not None else None
        out.append({**r, "rayemb_is": ratio, "compared_with": ref["method"] if ref is not None else None})
    return out


def speedups(compared: Sequence[Dict[str, Any]], references: Sequence[str] = REFERENCES) -> Dict[str, float]:
    """``{method: rayemb_is}`` of the rows that have a like-for-like reference (references left out)."""
    return {r["method"]: r["rayemb_is"] for r in compared
            if r["method"] not in references and r.get("rayemb_is") is not None}


def shard_files(file_rows: Sequence[Tuple[str, int]], n: int) -> List[List[str]]:
    """``n`` disjoint sets of files with about equal rows (largest file first to the lightest set)."""
    shards: List[List[str]] = [[] for _ in range(n)]
    load = [0] * n
    for path, rows in sorted(file_rows, key=lambda x: (-x[1], x[0])):
        i = min(range(n), key=lambda j: (load[j], j))
        shards[i].append(path)
        load[i] += rows
    return [sorted(s) for s in shards]


def _merge_unique(parts: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
    """One (ids, counts) histogram from several."""
    parts = [p for p in parts if len(p[0])]
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ids, inv = np.unique(np.concatenate([p[0] for p in parts]), return_inverse=True)
    counts = np.bincount(inv, weights=np.concatenate([p[1] for p in parts]), minlength=len(ids))
    return ids, counts.astype(np.int64)


def merge_counts(method: str, parts: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The per-table histograms of several workers merged into one per table (the driver's share of the work)."""
    if len(parts) == 1:
        return parts[0]
    names = [n for n in parts[0]] if parts else []
    out: Dict[str, Any] = {}
    for n in names:
        got = [p[n] for p in parts if n in p]
        if method == "numpy_bincount":
            size = max(len(g) for g in got)
            acc = np.zeros(size, np.int64)
            for g in got:
                acc[: len(g)] += g
            out[n] = acc
        elif method == "pandas":
            import pandas as pd

            out[n] = pd.concat(got).groupby(level=0).sum()
        else:
            out[n] = _merge_unique(got)
    return out


def total_count(method: str, hist: Any) -> int:
    """Ids a histogram counts (checks that a method did all the work)."""
    if method == "numpy_bincount":
        return int(hist.sum())
    if method == "pandas":
        return int(hist.sum())
    return int(hist[1].sum())


# ---- the baselines, in --cores worker processes ---- #


def _count(method: str, files: List[str], names: List[str], sizes: Dict[str, int],
           arrays: Optional[Dict[str, np.ndarray]]) -> Dict[str, Any]:
    """One worker's timed work: a histogram per table of its files."""
    if method == "numpy":
        return {n: np.unique(a, return_counts=True) for n, a in arrays.items()}
    if method == "numpy_bincount":
        return {n: np.bincount(a, minlength=sizes[n]) for n, a in arrays.items()}
    if method == "pandas":
        import pandas as pd

        return {n: pd.Series(a).value_counts() for n, a in arrays.items()}
    if method == "numpy_io":
        import pyarrow.parquet as pq

        per_file: Dict[str, list] = {n: [] for n in names}
        for f in files:
            tab = pq.read_table(f, columns=names, use_threads=False)
            for n in names:
                per_file[n].append(np.unique(tab.column(n).to_numpy(), return_counts=True))
        return {n: _merge_unique(parts) for n, parts in per_file.items()}
    raise ValueError(f"unknown baseline {method!r}")


def _baseline_worker(methods: List[str], files: List[str], names: List[str], sizes: Dict[str, int],
                     barrier: Any, queue: Any) -> None:
    """Loads its files (untimed), then for each method: waits for the start, counts, sends the histograms."""
    arrays: Optional[Dict[str, np.ndarray]] = None
    if files and any(m in IN_MEMORY for m in methods):
        import pyarrow.parquet as pq

        tab = pq.read_table(files, columns=names)
        arrays = {n: tab.column(n).to_numpy() for n in names}
        del tab
    for method in methods:
        barrier.wait(timeout=_WAIT_S)
        t0 = time.perf_counter()
        hist = _count(method, files, names, sizes, arrays) if files else {}
        queue.put((method, time.perf_counter() - t0, hist))


def run_baselines(methods: List[str], shards: List[List[str]], names: List[str], sizes: Dict[str, int],
                  log: Callable[[str], None] = print) -> Dict[str, Dict[str, Any]]:
    """``{method: {"seconds", "worker_seconds", "hist"}}``: wall time from the common start to the merged result."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # not fork: the driver has run Ray and pyarrow thread pools
    n = len(shards)
    barrier, queue = ctx.Barrier(n + 1), ctx.Queue()
    procs = [ctx.Process(target=_baseline_worker, args=(methods, s, names, sizes, barrier, queue), daemon=True)
             for s in shards]
    for p in procs:
        p.start()
    out: Dict[str, Dict[str, Any]] = {}
    try:
        for method in methods:
            barrier.wait(timeout=_WAIT_S)  # every worker has loaded its data (and finished the previous method)
            t0 = time.perf_counter()
            got = [queue.get(timeout=_WAIT_S) for _ in range(n)]
            hist = merge_counts(method, [h for _, _, h in got if h])
            sec = time.perf_counter() - t0
            out[method] = {"seconds": sec, "worker_seconds": sorted(round(s, 3) for _, s, _ in got), "hist": hist}
            log(f"{method}: {sec:.2f} s on {n} worker(s)")
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
    return out


# ---- data ---- #


def _generate(rows: int, tables: int, out: str) -> None:
    from rayemb.data.synthetic import SyntheticSpec, generate, log_progress

    spec = SyntheticSpec(rows=math.ceil(rows / 0.99) + 1, num_tables=tables, valid_fraction=0.01, seed=0)
    generate(spec, out, progress=log_progress(10.0))


def _subset_dataset(data: str, files: List[str], tables: List[str], out: str) -> str:
    """A dataset directory holding only ``files`` (symlinks) and a schema declaring only ``tables``."""
    import dataclasses

    from rayemb.constants import TRAIN_SPLIT
    from rayemb.data.schema import DatasetSchema, split_dir

    schema = DatasetSchema.load(data)
    keep = set(tables)
    sub = dataclasses.replace(schema, sparse=tuple(f for f in schema.sparse if f.name in keep))
    os.makedirs(split_dir(out, TRAIN_SPLIT), exist_ok=True)
    sub.save(out)
    for f in files:
        os.symlink(os.path.abspath(f), os.path.join(split_dir(out, TRAIN_SPLIT), os.path.basename(f)))
    return out


def pin_cores(cores: int) -> Optional[List[int]]:
    """Pins this process (and so every process it starts later) to ``cores`` of the CPUs it may use."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if cores > len(allowed):
        raise SystemExit(f"--cores {cores}: only {len(allowed)} CPUs are available to this process")
    chosen = allowed[:cores]
    os.sched_setaffinity(0, chosen)
    return chosen


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _best_of(repeats: int, fn) -> Tuple[float, Any]:
    best, value = math.inf, None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000, help="train rows to generate (default %(default)s)")
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--data", default=None, help="use this dataset instead of generating one")
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--cores", "--num-cpus", dest="cores", type=int, default=1,
                   help="cores given to every method: rayemb's and groupby's Ray num_cpus, and the number of "
                        "numpy/pandas worker processes (default %(default)s; --num-cpus is the old name)")
    p.add_argument("--no-pin", action="store_true", help="do not pin the process tree to --cores CPUs")
    p.add_argument("--repeats", type=int, default=2, help="warm rayemb passes; the best counts (default %(default)s)")
    p.add_argument("--groupby-rows", type=int, default=1_000_000,
                   help="rows (whole files) of the groupby subset, 0 for all (default %(default)s)")
    p.add_argument("--groupby-tables", type=int, default=2, help="tables of the groupby subset, 0 for all")
    p.add_argument("--skip", nargs="*", default=[], help="methods to skip, e.g. ray_groupby pandas")
    args = p.parse_args(argv)
    if args.cores < 1:
        p.error("--cores must be at least 1")
    affinity = None if args.no_pin else pin_cores(args.cores)  # before Ray or any pool starts a thread

    import ray
    import pyarrow.parquet as pq

    from rayemb.data.schema import DatasetSchema, parquet_files
    from rayemb.data.stats import compute_stats

    cores = args.cores
    load_before = os.getloadavg()[0]
    tmp = tempfile.mkdtemp(prefix="rayemb-bench-stats-")
    data = args.data
    if data is None:
        data = os.path.join(tmp, "data")
        print(f"generating {args.rows:,} rows x {args.tables} tables in {data}", flush=True)
        _generate(args.rows, args.tables, data)
    try:
        schema = DatasetSchema.load(data)
        names = schema.sparse_names
        files = parquet_files(data)
        file_rows = [(f, pq.ParquetFile(f).metadata.num_rows) for f in files]
        rows = sum(r for _, r in file_rows)
        results: List[Dict[str, Any]] = []

        # the groupby subset: whole files covering the first --groupby-rows rows, the first --groupby-tables tables
        sub_files, sub_rows = [], 0
        for f, r in file_rows:
            if args.groupby_rows > 0 and sub_rows >= args.groupby_rows:
                break
            sub_files.append(f)
            sub_rows += r
        sub_tables = names[: args.groupby_tables] if args.groupby_tables > 0 else list(names)
        sub_is_all = len(sub_files) == len(files) and len(sub_tables) == len(names)
        sub_work = "all" if sub_is_all else "subset"
        groupby = "ray_groupby" not in args.skip

        # address="local": a private Ray of --cores CPUs, even when another cluster is running here
        ray.init(address="local", num_cpus=cores, include_dashboard=False, _node_ip_address="127.0.0.1",
                 logging_level="WARNING")
        ray.data.DataContext.get_current().enable_progress_bars = False
        # The first pass also starts Ray's worker processes (a one-time cost of a few seconds per
        # cluster, paid before training anyway): it is recorded as rayemb_cold, and "rayemb" is the
        # best of --repeats warm passes. The in-memory baselines have no start-up to exclude.
        t0 = time.perf_counter()
        stats = compute_stats(data, in_process=False)
        cold = time.perf_counter() - t0
        sec, stats = _best_of(args.repeats, lambda: compute_stats(data, in_process=False))
        assert all(stats.tables[n].values == stats.rows for n in names), "rayemb did not count every id"
        results.append(_result("rayemb", stats.rows, len(names), sec, cores, "all"))
        results.append(_result("rayemb_cold", stats.rows, len(names), cold, cores, "all"))
        print(f"rayemb ({cores} cores): {results[0]['values_per_s'] / 1e6:.1f} M ids/s warm, "
              f"{results[1]['values_per_s'] / 1e6:.1f} M ids/s cold", flush=True)

        if groupby:
            if not sub_is_all:  # rayemb on exactly the groupby's files and tables
                sub_data = _subset_dataset(data, sub_files, sub_tables, os.path.join(tmp, "subset"))
                compute_stats(sub_data, in_process=False)  # warm-up: the subset's first pass
                sec, sub_stats = _best_of(args.repeats, lambda: compute_stats(sub_data, in_process=False))
                assert sub_stats.rows == sub_rows and sorted(sub_stats.tables) == sorted(sub_tables)
                results.append(_result("rayemb_subset", sub_stats.rows, len(sub_tables), sec, cores, sub_work))
                print(f"rayemb_subset ({cores} cores, {sub_rows:,} rows x {len(sub_tables)} tables): "
                      f"{results[-1]['values_per_s'] / 1e6:.1f} M ids/s", flush=True)
            t0 = time.perf_counter()
            ds = ray.data.read_parquet(sub_files).select_columns(sub_tables).materialize()
            read_s = time.perf_counter() - t0
            counted = []
            group_s = sum(_time(lambda c=c: counted.append(ds.groupby(c).count().materialize())) for c in sub_tables)
            assert all(int(g.sum("count()")) == sub_rows for g in counted), "groupby did not count every id"
            del ds, counted
            extra = {"read_s": round(read_s, 3), "groupby_s": round(group_s, 3)}
            results.append(_result("ray_groupby", sub_rows, len(sub_tables), group_s, cores, sub_work, **extra))
            results.append(_result("ray_groupby_io", sub_rows, len(sub_tables), read_s + group_s, cores, sub_work,
                                   **extra))
            print(f"ray_groupby ({cores} cores): {results[-2]['values_per_s'] / 1e6:.2f} M ids/s in memory, "
                  f"{results[-1]['values_per_s'] / 1e6:.2f} M ids/s with the read", flush=True)
        ray.shutdown()

        methods = [m for m in BASELINES if m not in args.skip]
        if methods:
            shards = shard_files(file_rows, cores)
            if len(files) < cores:
                print(f"warning: {len(files)} files for {cores} baseline workers: some workers idle", flush=True)
            sizes = {f.name: f.num_embeddings for f in schema.sparse}
            timed = run_baselines(methods, shards, names, sizes)
            for m in methods:
                got = timed[m]
                assert all(total_count(m, got["hist"][n]) == rows for n in names), f"{m} did not count every id"
                results.append(_result(m, rows, len(names), got["seconds"], cores, "all",
                                        workers=len(shards), worker_seconds=got["worker_seconds"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    compared = compare_like_for_like(results)
    out = {
        "schema_version": 1,
        "benchmark": "stats",
        "num_cpus": cores,  # kept from the first version: every method's cores
        "cores": cores,
        "cpu_affinity": affinity,
        # other processes share the machine: 1-minute load averages before and after the run
        "load_average": [load_before, os.getloadavg()[0]],
        "comparison": "rayemb_is = speed of the rayemb row of equal cores, rows and tables / this row's speed",
        "subset": {"work": sub_work, "rows": sub_rows, "tables": sub_tables,
                   "files": [os.path.basename(f) for f in sub_files]} if groupby else None,
        "results": compared,
        "rayemb_speedup": speedups(compared),
    }
    shown = [{**r, "mids_per_s": r["values_per_s"] / 1e6, "parquet": "read" if r["reads_parquet"] else "memory"}
             for r in compared]
    footer = (f"every row ran on {cores} core(s); 'rayemb is' compares only rows of equal cores, rows and tables; "
              "parquet=memory: the time starts from ids already in memory")
    return report(args.out, out, shown, COLUMNS, KEYS, footer=footer, indent=1)


if __name__ == "__main__":
    sys.exit(main())
