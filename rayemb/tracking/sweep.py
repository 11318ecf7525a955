"""``rayemb train --config JOB.yaml --sweep key=v1,v2 [--sweep key2=a,b]``: a grid sweep in short.

The specs become a grid space that ``rayemb sweep`` runs (:mod:`rayemb.sweep.engine`, FIFO scheduler): one job
per point of the grid (the Cartesian product of all value lists), each an MLflow child run of one parent run
(tag ``rayemb.kind=sweep``).

Example::

    >>> parse_sweep("model.embedding_dim=8,16,32")
    ('model.embedding_dim', ['8', '16', '32'])
    >>> parse_sweep("model.bottom_mlp=[64,16],[32,16]")     # commas inside brackets belong to a value
    ('model.bottom_mlp', ['[64,16]', '[32,16]'])
    >>> grid_space(["train.dense_lr=0.1,0.02"])
    {'train.dense_lr': {'grid': [0.1, 0.02]}}
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import yaml

from rayemb.errors import ConfigError

_OPEN, _CLOSE = "[{(", "]})"


def _split_top_level(values: str) -> List[str]:
    """Splits on commas outside brackets and quotes (values are YAML, like ``--set`` values)."""
    out, cur, depth, quote = [], [], 0, None
    for ch in values:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def parse_sweep(spec: str) -> Tuple[str, List[str]]:
    """``"key=v1,v2"`` -> ``("key", ["v1", "v2"])``; raises :class:`ConfigError` for a malformed spec."""
    key, sep, values = spec.partition("=")
    key = key.strip()
    fix = "Write it as --sweep section.key=value1,value2 (e.g. --sweep model.embedding_dim=8,16)."
    if not sep or not key:
        raise ConfigError(f"Invalid --sweep {spec!r}: it has no 'key=' part. {fix}", category="invalid_sweep")
    vals = _split_top_level(values)
    if any(v == "" for v in vals):
        raise ConfigError(f"Invalid --sweep {spec!r}: it has an empty value. {fix}", category="invalid_sweep")
    if len(set(vals)) != len(vals):
        raise ConfigError(f"Invalid --sweep {spec!r}: a value is repeated, which would run the same job twice. {fix}",
                          category="invalid_sweep")
    return key, vals


def grid_space(sweep_specs: Sequence[str]) -> Dict[str, Dict[str, List[Any]]]:
    """``--sweep`` specs as a sweep space (:mod:`rayemb.sweep.space`): a grid of each key's values, read as YAML
    as ``--set`` reads them. Raises :class:`ConfigError` for a malformed spec or a key given twice."""
    parsed = [parse_sweep(s) for s in sweep_specs]
    keys = [k for k, _ in parsed]
    if not parsed:
        raise ConfigError("No --sweep spec. Pass at least one --sweep key=v1,v2.", category="invalid_sweep")
    if len(set(keys)) != len(keys):
        raise ConfigError(f"--sweep names the same key twice ({', '.join(keys)}). Give each key once, with all "
                          "its values: --sweep key=v1,v2,v3.", category="invalid_sweep")
    space = {}
    for key, values in parsed:
        try:
            space[key] = {"grid": [yaml.safe_load(v) for v in values]}
        except yaml.YAMLError as e:
            raise ConfigError(f"--sweep {key}=...: a value is not valid YAML ({e}). Write the values as --set "
                              "takes them.", category="invalid_sweep") from None
    return space
