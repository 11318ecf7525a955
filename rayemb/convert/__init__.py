"""Raw click logs -> a dataset ``rayemb train`` reads: ``schema.yaml`` + ``train/`` and ``valid/`` parquet parts.

Three formats (``rayemb convert criteo|avazu|movielens``): Criteo's tab-separated
Kaggle and 1TB logs (:mod:`rayemb.convert.criteo`) and Avazu's CSV
(:mod:`rayemb.convert.avazu`) are streamed block by block (memory does not grow
with the input, apart from the vocabulary of ``--vocab-from-train``); MovieLens
ratings (:mod:`rayemb.convert.movielens`) are read whole and sorted per user. Every
conversion writes into a staging folder renamed to ``--out`` at the end, counts
malformed lines, and leaves ``convert_summary.json`` (rows, bad lines, per-table
cardinality, wall time) next to the data. See docs/data.md.

Example::

    >>> from rayemb.convert import ConvertOptions, convert
    >>> summary = convert("criteo", ConvertOptions(inputs=("train.txt",), out="data/kaggle", hash_buckets=10**6))
    >>> summary["rows"]
    {'train': 41256555, 'valid': 4584062}
"""

from __future__ import annotations

from typing import Any, Callable, Dict

from rayemb.convert.common import ConvertOptions
from rayemb.errors import ConfigError

FORMATS = ("criteo", "avazu", "movielens")


def convert(fmt: str, opts: ConvertOptions) -> Dict[str, Any]:
    """Runs the converter of ``fmt`` (one of :data:`FORMATS`); returns the summary it writes."""
    from rayemb.convert.avazu import convert_avazu
    from rayemb.convert.criteo import convert_criteo
    from rayemb.convert.movielens import convert_movielens

    converters: Dict[str, Callable[[ConvertOptions], Dict[str, Any]]] = {
        "criteo": convert_criteo, "avazu": convert_avazu, "movielens": convert_movielens}
    if fmt not in converters:
        raise ConfigError(f"Unknown input format {fmt!r}; use one of {list(FORMATS)}.", category="invalid_option")
    return converters[fmt](opts)


__all__ = ["ConvertOptions", "FORMATS", "convert"]
