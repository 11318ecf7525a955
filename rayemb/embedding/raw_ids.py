"""Raw ids: string ids to int64, and int64 ids to the keys a managed-collision table stores.

A raw-id feature (``ids: raw`` in schema.yaml) carries ids of any 64-bit value
or strings, not row numbers. Two fixed, documented functions turn them into
what the table (:mod:`rayemb.embedding.raw_tables`) works with; neither
depends on the world size, the table's capacity or anything trained, so a
checkpoint taken on one cluster means the same ids on another.

**Strings → int64** (:func:`raw_ids_to_int64`): the first 8 bytes of
``blake2b(utf-8 bytes, digest_size=8)`` read as a little-endian signed int64::

    int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "little", signed=True)

Integer columns pass through unchanged (cast to int64). Two different strings
share an id with probability about ``n² / 2⁶⁵`` for ``n`` distinct strings.

**int64 → key** (:func:`raw_id_keys`, inverse :func:`keys_to_raw_ids`): the
SplitMix64 finalizer, a bijection of the 64-bit integers (xor-shift 30,
multiply ``0xbf58476d1ce4e5b9``, xor-shift 27, multiply ``0x94d049bb133111eb``,
xor-shift 31; arithmetic modulo 2⁶⁴, read back as signed int64). It exists for
two reasons. TorchRec's row-wise input exchange sends an id to rank
``id // ceil((2⁶³-1) / W)``, so raw ids that are small consecutive numbers
(user 1, 2, 3, ...) would all land on rank 0; mixed keys spread evenly. And
TorchRec's MCH module marks an empty slot with the key ``2⁶³-1``, so that one
key is folded onto ``2⁶³-2`` (:data:`FOLDED_RAW_ID` is the single raw id whose
key is folded; it shares a slot with :data:`FOLD_PARTNER_RAW_ID`, a chance of
2⁻⁶⁴ per id). Keys may be negative: TorchRec's bucketization reads them as
unsigned 64-bit numbers, which still spreads them evenly over the ranks.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from rayemb.errors import DataError

if TYPE_CHECKING:
    import torch

#: the key TorchRec's MCH module stores in an empty slot; never used for an id
EMPTY_KEY = np.iinfo(np.int64).max
#: where the one id whose key would be EMPTY_KEY is stored instead
FOLDED_KEY = EMPTY_KEY - 1

_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_M1_INV = pow(_M1, -1, 1 << 64)
_M2_INV = pow(_M2, -1, 1 << 64)
_SHIFTS = (30, 27, 31)


def _signed(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


def _unmix_int(key: int) -> int:
    return int(keys_to_raw_ids(np.array([key], dtype=np.int64))[0])


def hash_string(value: str) -> int:
    """The int64 id of one string id (the documented algorithm, one value at a time)."""
    digest = hashlib.blake2b(value.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _hash_strings(unique: Any) -> np.ndarray:
    digests = b"".join(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest() for s in unique)
    return np.frombuffer(digests, dtype="<i8").astype(np.int64)


def raw_ids_to_int64(values: Any, name: Optional[str] = None) -> np.ndarray:
    """The int64 ids of a column's flat values: strings hashed (module docstring), integers unchanged.

    ``values``: a pyarrow ``Array`` / ``ChunkedArray`` (string, large_string
    or integer), a numpy array (str, object of str, or integer) or a list.
    Each distinct string is hashed once. Raises :class:`DataError` (naming
    ``name``) for null values or another type; callers drop nulls first, as
    :func:`rayemb.data.batching.sparse_arrays` does.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    where = f"Raw-id column {name!r}" if name else "A raw-id column"
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    else:
        arr = pa.array(np.asarray(values) if not isinstance(values, list) else values)
    if arr.null_count:
        raise DataError(f"{where} holds {arr.null_count} null id(s); drop those values (a null one-hot id is an "
                        "empty bag) before turning ids into int64.")
    if pa.types.is_integer(arr.type):
        return arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        raise DataError(f"{where} has type {arr.type}; a raw-id column holds int64 or string ids "
                        "(or lists of them when multi_hot: true).")
    if len(arr) == 0:
        return np.zeros(0, dtype=np.int64)
    encoded = pc.dictionary_encode(arr)
    ids = _hash_strings(encoded.dictionary.to_pylist())
    return ids[encoded.indices.to_numpy(zero_copy_only=False)]


def _xorshift_inverse(z: np.ndarray, shift: int) -> np.ndarray:
    # y ^ (y >> s) = z is solved by fixed-point iteration: each round fixes `shift` more high bits
    y = z.copy()
    for _ in range(64 // shift + 1):
        y = z ^ (y >> np.uint64(shift))
    return y


def raw_ids_to_keys(raw: np.ndarray) -> np.ndarray:
    """The stored key of every raw int64 id (numpy; the same function as :func:`raw_id_keys`)."""
    z = np.asarray(raw, dtype=np.int64).view(np.uint64).copy()
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    keys = (z ^ (z >> np.uint64(31))).view(np.int64)
    keys[keys == EMPTY_KEY] = FOLDED_KEY
    return keys


def keys_to_raw_ids(keys: np.ndarray) -> np.ndarray:
    """The raw int64 id of every stored key (exact inverse, except the folded key: see the module docstring)."""
    z = np.asarray(keys, dtype=np.int64).view(np.uint64).copy()
    z = _xorshift_inverse(z, _SHIFTS[2]) * np.uint64(_M2_INV)
    z = _xorshift_inverse(z, _SHIFTS[1]) * np.uint64(_M1_INV)
    return _xorshift_inverse(z, _SHIFTS[0]).view(np.int64)


def raw_id_keys(values: "torch.Tensor", input_hash_size: int = 0) -> "torch.Tensor":
    """The stored key of every raw int64 id (torch, any device): TorchRec's MCH ``input_hash_func``.

    ``input_hash_size`` is TorchRec's argument; the mix covers the whole
    64-bit range, so it is not used.
    """
    import torch

    def srl(z: torch.Tensor, s: int) -> torch.Tensor:
        # a logical right shift: torch shifts int64 arithmetically (copies the sign bit)
        return (z >> s) & ((1 << (64 - s)) - 1)

    z = values.to(torch.int64)
    # int64 multiplication wraps modulo 2**64, as the uint64 arithmetic of the algorithm
    z = (z ^ srl(z, 30)) * _signed(_M1)
    z = (z ^ srl(z, 27)) * _signed(_M2)
    z = z ^ srl(z, 31)
    return torch.where(z == int(EMPTY_KEY), torch.full_like(z, int(FOLDED_KEY)), z)


#: the one raw id whose key would be EMPTY_KEY (stored under FOLDED_KEY instead)
FOLDED_RAW_ID = _unmix_int(int(EMPTY_KEY))
#: the raw id whose key is FOLDED_KEY; FOLDED_RAW_ID shares its slot
FOLD_PARTNER_RAW_ID = _unmix_int(int(FOLDED_KEY))

__all__ = ["EMPTY_KEY", "FOLDED_KEY", "FOLDED_RAW_ID", "FOLD_PARTNER_RAW_ID", "hash_string", "keys_to_raw_ids",
           "raw_id_keys", "raw_ids_to_int64", "raw_ids_to_keys"]
