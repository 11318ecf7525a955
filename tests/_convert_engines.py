"""Both engines of ``rayemb convert criteo`` on the same input, and their datasets compared table for table."""

from __future__ import annotations

import csv
import gzip
import json
import os
from typing import List, Sequence, Tuple

import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "criteo_sample.txt")
#: what may differ between two conversions of the same input
_RUN_KEYS = ("wall_time_s", "lines_per_s", "engine", "out")


def sample_lines() -> List[str]:
    """The real 200-row sample (CSV with a header, dense written as floats) as Criteo lines: tab-separated,
    no header, integer counts."""
    with open(FIXTURE) as f:
        records = list(csv.reader(f))[1:]
    return ["\t".join([str(int(float(r[0])))] + [str(int(float(v))) if v else "" for v in r[1:14]] + r[14:])
            for r in records]


def write_text(path, lines: Sequence[str], compress: bool = False) -> str:
    with (gzip.open if compress else open)(path, "wt") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


def convert_argv(inputs: Sequence[str], out: str, engine: str, *options) -> List[str]:
    return ["convert", "criteo", "--input", *inputs, "--out", out, "--engine", engine, *map(str, options)]


def both_engines(main, tmp_path, inputs: Sequence[str], *options, ray_options: Sequence[str] = ()) -> Tuple[str, str]:
    """The datasets of ``--engine local`` and ``--engine ray`` (with ``ray_options`` too) of the same inputs."""
    local, ray = str(tmp_path / "by_local"), str(tmp_path / "by_ray")
    assert main(convert_argv(inputs, local, "local", *options)) == 0
    assert main(convert_argv(inputs, ray, "ray", *options, *ray_options)) == 0
    return local, ray


def summary(out: str) -> dict:
    with open(os.path.join(out, "convert_summary.json")) as f:
        return json.load(f)


def assert_same_dataset(a: str, b: str) -> None:
    """The same part files holding the same rows, the same schema.yaml, the same summary (bar its timings)."""
    assert sorted(os.listdir(a)) == sorted(os.listdir(b)) == ["convert_summary.json", "schema.yaml", "train", "valid"]
    for split in ("train", "valid"):
        parts = sorted(os.listdir(os.path.join(a, split)))
        assert parts == sorted(os.listdir(os.path.join(b, split))) and parts, split
        for p in parts:
            ta, tb = pq.read_table(os.path.join(a, split, p)), pq.read_table(os.path.join(b, split, p))
            assert ta.schema == tb.schema and ta.num_rows == tb.num_rows, (split, p)
            assert ta.equals(tb), f"{split}/{p} differs"
    with open(os.path.join(a, "schema.yaml")) as fa, open(os.path.join(b, "schema.yaml")) as fb:
        assert fa.read() == fb.read()
    sa, sb = summary(a), summary(b)
    for s in (sa, sb):
        for k in _RUN_KEYS:
            s.pop(k)
        s["bad_lines"]["examples"].sort(key=lambda e: (e["file"], e["line"], e["kind"]))
    assert sa == sb
