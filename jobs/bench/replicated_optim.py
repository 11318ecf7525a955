"""The replicated embedding rows' optimizer step: TorchRec's ``RowWiseAdagrad`` vs rayemb's ``MultiTensorRowWiseAdagrad``.

Replicated rows (data-parallel tables, hybrid hot halves) are one dense parameter per table, updated by the
loop's replicated optimizer after the backward. The default shapes are the 21 smallest tables of
``data/synth_small`` at dim 16 (the data-parallel tables of a ``data_parallel x21 + table_wise x5`` plan; the
row counts are ``schema.yaml``'s). Same parameters and gradients on both sides, one torch thread, the two timed
in alternating rounds; the updated parameters are checked equal each run.

Usage::

    python jobs/bench/replicated_optim.py [--tables 21 --dim 16 --rounds 5 --iters 200]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path[:0] = [_HERE, _REPO]

from _report import alternating_rounds, report  # noqa: E402


def table_rows(data: str, tables: int) -> List[int]:
    """Rows of the ``tables`` smallest tables of a dataset's schema (as a job's data-parallel tables are)."""
    from rayemb.data.schema import DatasetSchema

    schema = DatasetSchema.load(data)
    return sorted(f.num_embeddings for f in schema.sparse)[:tables]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(_REPO, "data", "synth_small"))
    ap.add_argument("--tables", type=int, default=21)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=200, help="optimizer steps per round and side")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(_REPO, "bench-results", "replicated_optim.json"))
    args = ap.parse_args(argv)

    import torch
    from torchrec.optim import RowWiseAdagrad

    from rayemb.train.worker.optim import MultiTensorRowWiseAdagrad

    torch.set_num_threads(args.threads)
    rows = table_rows(args.data, args.tables)
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(r, args.dim, generator=gen) for r in rows]
    grads = [torch.randn(r, args.dim, generator=gen) for r in rows]
    sides = {}
    params = {}
    for name, cls in (("torchrec RowWiseAdagrad", RowWiseAdagrad), ("rayemb MultiTensorRowWiseAdagrad",
                                                                      MultiTensorRowWiseAdagrad)):
        ps = [torch.nn.Parameter(t.clone()) for t in init]
        for p, g in zip(ps, grads):
            p.grad = g
        params[name] = ps
        sides[name] = cls(ps, lr=0.05).step
    table = alternating_rounds(sides, args.rounds, args.iters)
    a, b = params.values()
    equal = all(torch.equal(x, y) for x, y in zip(a, b))  # both took the same number of steps
    doc = {"schema_version": 1, "benchmark": "replicated_optim", "config": vars(args), "rows": table,
           "table_rows": rows, "parameters_equal": equal}
    columns = [("side", "<33", "{}"), ("ms/step", ">8", "{:.3f}"), ("min ms", ">8", "{:.3f}"),
               ("speedup", ">8", "{:.2f}x")]
    return report(args.out, doc, table, columns, ["side", "ms", "ms_min", "speedup"],
                  footer=f"{len(rows)} tables of {min(rows)}-{max(rows)} rows x {args.dim}, {args.threads} thread(s);"
                         f" parameters equal after both: {equal}")


if __name__ == "__main__":
    sys.exit(main())
