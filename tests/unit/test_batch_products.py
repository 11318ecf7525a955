"""The global batch is a product, and a rank's batch a division, in one place: :class:`rayemb.batch_shape.BatchShape`.

A job, its elastic worlds, its plan, its checkpoints and its progress line must agree on the rows per step; a
hand-written ``batch_size * world`` somewhere drifts from the rest the day one of them changes (a world resized,
a local batch rounded). This scans the code of ``rayemb/`` and ``jobs/`` (comments and strings left out) for a
batch multiplied by a world size, a batch divided by one, or a batch-named value made from a world size.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("rayemb", "jobs")
ALLOWED = {
    "rayemb/batch_shape.py",  # the one place
    # the hand-written TorchRec peer the benchmarks compare against: written as a user would without rayemb
    "jobs/bench/peer_torchrec.py",
}

_NAME = r"[A-Za-z_][\w.]*"
_BATCH = rf"(?:{_NAME})?(?:batch|\bbs\b)[\w.]*"
_WORLD = r"(?:[\w.]*\b(?:world\w*|num_workers|ranks)|\bw)\b"
#: ``batch * world``, ``batch // world``, ``global_batch / w``, ``world * batch_size``, and ``batch = N * world``
PATTERNS = (
    re.compile(rf"{_BATCH}\s*(?:\*|//|/)\s*\(?\s*{_WORLD}"),
    re.compile(rf"{_WORLD}\s*\*\s*{_BATCH}"),
    re.compile(rf"\b\w*batch\w*\s*=[^=].*(?:\*|//|/)\s*{_WORLD}"),
)


def code_lines(source: str) -> Dict[int, str]:
    """Line number -> that line's code, its comments and string literals (docstrings too) blanked out."""
    lines: Dict[int, List[str]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.NEWLINE):
            continue
        if tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            continue
        lines.setdefault(tok.start[0], []).append(tok.string)
    return {n: " ".join(parts) for n, parts in lines.items()}


def batch_products(source: str) -> List[str]:
    """The lines of ``source`` whose code multiplies or divides a batch by a world size."""
    out = []
    for n, line in sorted(code_lines(source).items()):
        # tokens are joined with spaces: `a . b` back to `a.b` so names read whole
        code = re.sub(r"\s*\.\s*", ".", line)
        if any(p.search(code) for p in PATTERNS):
            out.append(f"{n}: {code}")
    return out


def test_the_pattern_finds_every_hand_written_form():
    found = [
        "global_batch = cfg.data.batch_size * topology.world_size",
        "rule = split_rule(topology, cfg.data.batch_size * topology.world_size, dim)",
        "progress = ProgressPrinter(epochs, steps, cfg.data.batch_size * world)",
        "batch_size=max(1, global_batch // topology.world_size),",
        "local_batch = global_batch / w",
        "global_batch = local_batch * world",
        "per_round = world * batch_size",
        "batch = 1024 * world_size",
        'doc = {"global_batch": args.batch_size * args.world}',
        "x = bs * world",
    ]
    for line in found:
        assert batch_products(line + "\n"), line
    fine = [
        "global_batch = BatchShape(cfg.data.batch_size, topology.world_size).global_size",
        "gathered = [None] * world_size",
        "n = size // 4 // world * world",
        "rate = samples_per_s / self.global_batch",
        "# the global batch is batch_size * num_workers",
        '"""a docstring: batch_size * world"""',
        "seconds = local_batch * table.pooling_factor",
    ]
    for line in fine:
        assert not batch_products(line + "\n"), line


def test_no_global_batch_is_multiplied_or_divided_by_hand():
    found = []
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in ALLOWED:
                continue
            found += [f"{rel}:{hit}" for hit in batch_products(path.read_text())]
    assert not found, ("a global batch made or split by hand; use rayemb.batch_shape.BatchShape "
                       "(.global_size, BatchShape.of_global(...).local):\n" + "\n".join(found))
