"""DLRM's dot interaction, forward + backward: TorchRec's ``InteractionArch`` vs rayemb's ``PairwiseDotInteraction``.

Same inputs (dense ``(B, D)`` and F vectors ``(B, D)``), same output and
gradients (checked each run), one torch thread, the two timed in alternating
rounds on the same tensors. rayemb's version stacks dense and sparse vectors
at once and takes the upper-triangle pairs with one ``index_select`` on the
flattened Gram matrix (backward: ``index_add``) instead of advanced indexing
(backward: an accumulating ``index_put``). The default shape is the default
job's (``jobs/configs/synth_small.yaml``: batch 512 per rank, 26 tables, dim 16).

Usage::

    python jobs/bench/interaction.py [--batch 512 --vectors 26 --dim 16 --rounds 5 --iters 100]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(os.path.dirname(_HERE))]

from _report import alternating_rounds, report  # noqa: E402


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--vectors", type=int, default=26, help="sparse features F (the dense vector is one more)")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=100, help="forward + backward passes per round and side")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(_HERE)), "bench-results",
                                                  "interaction.json"))
    args = ap.parse_args(argv)

    import torch
    from torchrec.models.dlrm import InteractionArch

    from rayemb.models.dlrm import PairwiseDotInteraction

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dense = torch.randn(args.batch, args.dim, requires_grad=True)
    vectors = [torch.randn(args.batch, args.dim, requires_grad=True) for _ in range(args.vectors)]
    theirs, ours = InteractionArch(num_sparse_features=args.vectors), PairwiseDotInteraction(args.vectors)
    sides = {
        "torchrec InteractionArch": lambda: theirs(dense, torch.stack(vectors, dim=1)),
        "rayemb PairwiseDotInteraction": lambda: ours(dense, vectors),
    }
    upstream = torch.randn(args.batch, args.dim + (args.vectors + 1) * args.vectors // 2)

    def grads(fn) -> List[torch.Tensor]:
        for t in [dense, *vectors]:
            t.grad = None
        out = fn()
        out.backward(upstream)
        return [out.detach()] + [t.grad.clone() for t in [dense, *vectors]]

    ref, got = grads(sides["torchrec InteractionArch"]), grads(sides["rayemb PairwiseDotInteraction"])
    max_diff = max(float((a - b).abs().max()) for a, b in zip(ref, got))
    rows = alternating_rounds({name: (lambda fn=fn: grads(fn)) for name, fn in sides.items()}, args.rounds, args.iters)
    doc = {"schema_version": 1, "benchmark": "interaction", "config": vars(args), "rows": rows,
           "max_abs_diff_output_and_grads": max_diff}
    columns = [("side", "<31", "{}"), ("ms fwd+bwd", ">10", "{:.3f}"), ("min ms", ">8", "{:.3f}"),
               ("speedup", ">8", "{:.2f}x")]
    return report(args.out, doc, rows, columns, ["side", "ms", "ms_min", "speedup"],
                  footer=f"batch {args.batch}, {args.vectors}+1 vectors of {args.dim}, {args.threads} thread(s); "
                         f"max |diff| of output and gradients {max_diff:.2e}")


if __name__ == "__main__":
    sys.exit(main())
