"""jobs/bench/link_shape.py's table: bytes sent per rank and the α-β line it compares against."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "jobs", "bench"))

import link_shape  # noqa: E402


def test_rows_price_every_call_on_the_line_through_the_smallest_and_largest_message():
    # all-to-all: 1 ms + 100 ns/B sent; all-reduce: 2 ms + 50 ns/B sent (2 ranks: a rank sends half / all)
    med = {}
    for s in link_shape.SIZES:
        med[f"all_to_all/{s}"] = 1e-3 + 100e-9 * s / 2
        med[f"all_to_all_x3/{s}"] = 0.5 * (3 * 1e-3 + 100e-9 * 3 * s / 2)  # bursts at half the line's time
        med[f"all_reduce/{s}"] = 2e-3 + 50e-9 * s
    rows = {(r["pattern"], r["bytes_per_rank"]): r for r in link_shape.rows_of(med, world=2)}
    one = rows[("all_to_all", 65536)]
    assert one["sent_kb"] == 32.768 and abs(one["ms"] - one["line_ms"]) < 1e-9
    three = rows[("all_to_all_x3", 65536)]
    assert abs(three["sent_kb"] - 3 * 32.768) < 1e-9 and abs(three["line_ms"] - 2 * three["ms"]) < 1e-9
    ar = rows[("all_reduce", 2**20)]
    assert ar["sent_kb"] == 2**20 / 1e3 and abs(ar["ms"] - ar["line_ms"]) < 1e-9
    assert abs(ar["ns_per_byte"] - 1e9 * (2e-3 + 50e-9 * 2**20) / 2**20) < 1e-6
