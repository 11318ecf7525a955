"""Benchmark: ids counted per second by rayemb's stats pass vs numpy, pandas and Ray Data groupby.

    python jobs/bench/stats.py --rows 10000000 --out runs/bench/stats.json

Generates ``--rows`` train rows x ``--tables`` one-hot tables with
:mod:`rayemb.data.synthetic` (or uses ``--data DIR``), then measures:

- ``rayemb``: :func:`rayemb.data.stats.compute_stats` (heavy hitters + distinct +
  ranges), one streaming Ray Data pass reading the parquet files, on a local
  Ray of ``--num-cpus`` CPUs: the best of ``--repeats`` warm passes;
  ``rayemb_cold``: the first pass, which also starts Ray's worker processes;
- ``numpy``: single-core ``np.unique(..., return_counts=True)`` per table on
  the same ids already in memory (no I/O: the practical single-core limit of
  general counting); ``numpy_bincount``: ``np.bincount`` likewise (only valid
  because ids are dense in ``[0, V)``); ``numpy_io``: single-core
  ``pq.read_table`` + ``np.unique`` per file, i.e. numpy *including* the
  parquet decode rayemb's pass has to do (the like-for-like single-core figure);
- ``pandas``: ``pd.Series(ids).value_counts()`` per table, in memory;
- ``ray_groupby``: ``ds.groupby(col).count()`` on the first ``--groupby-rows``
  rows and ``--groupby-tables`` tables (it is far slower; the JSON records
  the rows and tables it was measured on).

Writes ``{"schema_version": 1, "results": [{"method", "rows", "tables",
"values", "seconds", "values_per_s"}], ...}`` to ``--out`` and prints a table
with each method's speed relative to rayemb.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import report  # noqa: E402

COLUMNS = [("method", "<16", "{}"), ("rows", ">13", "{:,}"), ("tables", ">8", "{}"), ("M ids/s", ">10", "{:.2f}"),
           ("rayemb is", ">11", "{:.2f}x")]
KEYS = ["method", "rows", "tables", "mids_per_s", "rayemb_is"]


def _result(method: str, rows: int, tables: int, seconds: float) -> Dict[str, Any]:
    values = rows * tables
    return {"method": method, "rows": rows, "tables": tables, "values": values, "seconds": round(seconds, 3),
            "values_per_s": values / seconds}


def _generate(rows: int, tables: int, out: str) -> None:
    from rayemb.data.synthetic import SyntheticSpec, generate, log_progress

    spec = SyntheticSpec(rows=math.ceil(rows / 0.99) + 1, num_tables=tables, valid_fraction=0.01, seed=0)
    generate(spec, out, progress=log_progress(10.0))


def _load_columns(files: List[str], names: List[str]) -> Dict[str, np.ndarray]:
    import pyarrow.parquet as pq

    tab = pq.read_table(files, columns=names)
    return {n: tab.column(n).to_numpy() for n in names}


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000, help="train rows to generate (default %(default)s)")
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--data", default=None, help="use this dataset instead of generating one")
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="warm rayemb passes; the best counts (default %(default)s)")
    p.add_argument("--groupby-rows", type=int, default=1_000_000)
    p.add_argument("--groupby-tables", type=int, default=2)
    p.add_argument("--skip", nargs="*", default=[], help="methods to skip, e.g. ray_groupby pandas")
    args = p.parse_args(argv)

    import ray
    import pyarrow.parquet as pq

    from rayemb.data.schema import DatasetSchema, parquet_files
    from rayemb.data.stats import compute_stats

    load_before = os.getloadavg()[0]
    tmp = None
    data = args.data
    if data is None:
        tmp = tempfile.mkdtemp(prefix="rayemb-bench-stats-")
        data = tmp
        print(f"generating {args.rows:,} rows x {args.tables} tables in {data}", flush=True)
        _generate(args.rows, args.tables, data)
    try:
        schema = DatasetSchema.load(data)
        names = schema.sparse_names
        files = parquet_files(data)
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        results: List[Dict[str, Any]] = []

        # address="local": a private Ray of --num-cpus CPUs, even when another cluster is running here
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, logging_level="WARNING")
        # The first pass also starts Ray's worker processes (a one-time cost of a few seconds per
        # cluster, paid before training anyway): it is recorded as rayemb_cold, and "rayemb" is the
        # best of --repeats warm passes. The in-memory baselines have no start-up to exclude.
        t0 = time.perf_counter()
        stats = compute_stats(data)
        results.append(_result("rayemb_cold", stats.rows, len(names), time.perf_counter() - t0))
        warm = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            stats = compute_stats(data)
            warm.append(time.perf_counter() - t0)
        results.insert(0, _result("rayemb", stats.rows, len(names), min(warm)))
        print(f"rayemb: {results[0]['values_per_s'] / 1e6:.1f} M ids/s warm, "
              f"{results[1]['values_per_s'] / 1e6:.1f} M ids/s cold", flush=True)

        if "ray_groupby" not in args.skip:
            sub, n_sub = [], 0
            for f in files:  # whole files covering the first --groupby-rows rows
                sub.append(f)
                n_sub += pq.ParquetFile(f).metadata.num_rows
                if n_sub >= args.groupby_rows:
                    break
            cols = names[: args.groupby_tables]
            ds = ray.data.read_parquet(sub).select_columns(cols).materialize()  # I/O excluded, like numpy
            ray.data.DataContext.get_current().enable_progress_bars = False
            sec = sum(_time(lambda c=c: ds.groupby(c).count().materialize()) for c in cols)
            results.append(_result("ray_groupby", n_sub, len(cols), sec))
            print(f"ray_groupby: {results[-1]['values_per_s'] / 1e6:.2f} M ids/s", flush=True)
            del ds
        ray.shutdown()

        arrays = _load_columns(files, names)
        sizes = {f.name: f.num_embeddings for f in schema.sparse}
        if "numpy" not in args.skip:
            sec = sum(_time(lambda a=a: np.unique(a, return_counts=True)) for a in arrays.values())
            results.append(_result("numpy", rows, len(names), sec))
            sec = sum(_time(lambda n=n, a=a: np.bincount(a, minlength=sizes[n])) for n, a in arrays.items())
            results.append(_result("numpy_bincount", rows, len(names), sec))
        if "numpy_io" not in args.skip:
            def read_and_count() -> None:
                for f in files:
                    tab = pq.read_table(f, columns=names, use_threads=False)
                    for n in names:
                        np.unique(tab.column(n).to_numpy(), return_counts=True)

            results.append(_result("numpy_io", rows, len(names), _time(read_and_count)))
        if "pandas" not in args.skip:
            import pandas as pd

            sec = sum(_time(lambda a=a: pd.Series(a).value_counts()) for a in arrays.values())
            results.append(_result("pandas", rows, len(names), sec))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    base = results[0]["values_per_s"]
    out = {
        "schema_version": 1,
        "benchmark": "stats",
        "num_cpus": args.num_cpus,
        # other processes share the machine: 1-minute load averages before and after the run
        "load_average": [load_before, os.getloadavg()[0]],
        "results": results,
        "rayemb_speedup": {r["method"]: base / r["values_per_s"] for r in results[1:]},
    }
    shown = [{**r, "mids_per_s": r["values_per_s"] / 1e6, "rayemb_is": base / r["values_per_s"]} for r in results]
    return report(args.out, out, shown, COLUMNS, KEYS, indent=1)


if __name__ == "__main__":
    sys.exit(main())
