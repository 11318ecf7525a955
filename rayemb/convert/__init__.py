"""Raw click logs -> a dataset ``rayemb train`` reads: ``schema.yaml`` + ``train/`` and ``valid/`` parquet parts.

Three formats (``rayemb convert criteo|avazu|movielens``): Criteo's tab-separated
Kaggle and 1TB logs (:mod:`rayemb.convert.criteo`) and Avazu's CSV
(:mod:`rayemb.convert.avazu`) are streamed block by block (memory does not grow
with the input, apart from the vocabulary of ``--vocab-from-train``); MovieLens
ratings (:mod:`rayemb.convert.movielens`) are read whole and sorted per user. Every
conversion writes into a staging folder renamed to ``--out`` at the end, counts
malformed lines, and leaves ``convert_summary.json`` (rows, bad lines, per-table
cardinality, wall time) next to the data. See docs/data.md.

Criteo also converts on a Ray cluster's CPUs (``--engine ray``,
:mod:`rayemb.convert.ray_engine`) into the same dataset; ``--engine auto``, the
default, takes it when a cluster address is given or the inputs hold at least
1 GiB, where the cluster's CPUs repay Ray's start-up seconds.

Example::

    >>> from rayemb.convert import ConvertOptions, convert
    >>> summary = convert("criteo", ConvertOptions(inputs=("train.txt",), out="data/kaggle", hash_buckets=10**6))
    >>> summary["rows"]
    {'train': 41256555, 'valid': 4584062}
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict

from rayemb import storage
from rayemb.convert.common import AUTO_RAY_MIN_BYTES, ENGINES, ConvertOptions
from rayemb.errors import ConfigError, RayembError

FORMATS = ("criteo", "avazu", "movielens")
#: the formats the Ray engine converts (the others always run in one process)
RAY_FORMATS = ("criteo",)


def engine_for(fmt: str, opts: ConvertOptions) -> str:
    """``local`` or ``ray``: ``opts.engine``, with ``auto`` resolved (:data:`rayemb.convert.common.ENGINES`)."""
    if opts.engine == "ray" and fmt not in RAY_FORMATS:
        raise ConfigError(f"--engine ray converts {list(RAY_FORMATS)}; rayemb convert {fmt} runs in one process: "
                          "drop --engine or pass --engine local.", category="invalid_option")
    if opts.engine != "auto":
        return opts.engine
    if fmt not in RAY_FORMATS:
        return "local"
    if opts.address:
        return "ray"
    paths = [*opts.inputs, *opts.valid_inputs]
    try:
        total = sum(size for size, _ in storage.sizes_and_mtimes_ns(paths))
    except (RayembError, OSError):  # a missing input: the engine's own checks say which
        return "local"
    return "ray" if total >= AUTO_RAY_MIN_BYTES and (os.cpu_count() or 1) > 1 else "local"


def convert(fmt: str, opts: ConvertOptions) -> Dict[str, Any]:
    """Runs the converter of ``fmt`` (one of :data:`FORMATS`) on its engine; returns the summary it writes."""
    from rayemb.convert.avazu import convert_avazu
    from rayemb.convert.criteo import convert_criteo
    from rayemb.convert.movielens import convert_movielens

    converters: Dict[str, Callable[[ConvertOptions], Dict[str, Any]]] = {
        "criteo": convert_criteo, "avazu": convert_avazu, "movielens": convert_movielens}
    if fmt not in converters:
        raise ConfigError(f"Unknown input format {fmt!r}; use one of {list(FORMATS)}.", category="invalid_option")
    if opts.raw_ids and fmt != "criteo":
        raise ConfigError(f"--ids raw keeps Criteo's hex values as ids; rayemb convert {fmt} makes ids with "
                          "--hash-buckets or --vocab-from-train.", category="invalid_option")
    if opts.label != "binary" and fmt != "movielens":
        raise ConfigError(f"--label {opts.label} keeps MovieLens ratings as the label; rayemb convert {fmt} reads its "
                          "0/1 click column: drop --label.", category="invalid_option")
    if engine_for(fmt, opts) == "ray":
        from rayemb.convert.ray_engine import convert_criteo_ray

        return convert_criteo_ray(opts)
    return converters[fmt](opts)


__all__ = ["ConvertOptions", "ENGINES", "FORMATS", "RAY_FORMATS", "convert", "engine_for"]
