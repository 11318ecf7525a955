"""Units shared by every layer: binary byte units and flattening nested mappings.

Example::

    >>> format_bytes(3 * 2**30)
    '3.0 GiB'
    >>> binary_unit(5 * 2**20)
    (1048576, 'MiB')
    >>> flatten({"train": {"epochs": 2}, "name": "x"})
    {'train.epochs': 2, 'name': 'x'}
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

KIB_BYTES = 2**10
MIB_BYTES = 2**20
GIB_BYTES = 2**30
TIB_BYTES = 2**40
_UNITS = (("TiB", TIB_BYTES), ("GiB", GIB_BYTES), ("MiB", MIB_BYTES), ("KiB", KIB_BYTES))


def binary_unit(num_bytes: float) -> Tuple[int, str]:
    """(scale, name) of the largest binary unit not above ``num_bytes`` (bytes for small values)."""
    for name, scale in _UNITS:
        if abs(num_bytes) >= scale:
            return scale, name
    return 1, "B"


def format_bytes(num_bytes: float) -> str:
    """``1536`` -> ``"1.5 KiB"``; whole bytes below 1 KiB: ``"512 B"``."""
    scale, name = binary_unit(num_bytes)
    return f"{int(num_bytes)} B" if scale == 1 else f"{num_bytes / scale:.1f} {name}"


def flatten(nested: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"train": {"epochs": 2}}`` -> ``{"train.epochs": 2}`` (leaves keep their type)."""
    out: Dict[str, Any] = {}
    for key, value in nested.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, full + "."))
        else:
            out[full] = value
    return out
