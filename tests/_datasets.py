"""Generated datasets the tests share."""

from __future__ import annotations


def synthetic_dataset(tmp_path_factory, name: str, num_tables: int) -> str:
    """A one-hot synthetic dataset of 40,000 rows (seed 7, 6 signal tables) in a new folder ``name``."""
    from rayemb.data.synthetic import SyntheticSpec, generate

    out = str(tmp_path_factory.mktemp(name))
    generate(SyntheticSpec(rows=40_000, num_tables=num_tables, seed=7, num_signal_tables=6), out)
    return out
