"""Categorical values -> embedding row ids: hashing mod N, a frequency-ordered vocabulary, or the values as they are.

Values arrive as uint64 *keys* (a Criteo category's ``int(hex, 16)``, a string's
64-bit FNV-1a hash, a MovieLens id). Two encoders as in DLRM and the MLPerf
reference, and one for tables that map ids to rows themselves:

- :class:`HashEncoder`: ``id = key % N`` for every table (``num_embeddings = N``);
- :class:`Vocabulary`: one counting pass over the training rows
  (:class:`FrequencyCounter`), then ``id = rank`` by descending count (id 0 is
  the most frequent value, ties broken by the smaller key), keeping values seen at
  least ``min_count`` times; every other value, and every value the counting pass
  never saw, maps to one out-of-vocabulary id ``= len(vocabulary)``
  (``num_embeddings = len + 1``);
- :class:`RawEncoder` (``--ids raw``): ``id = key`` as int64, no counting pass;
  ``num_embeddings`` is a capacity (``--capacity N``, else the distinct ids of
  the train rows + 1, counted while writing).

The counter holds one ``(key, count)`` pair per distinct value (16 bytes), merged
in a log-structured way so its cost stays O(n log n) over the whole pass.

Example::

    >>> c = FrequencyCounter(); c.add(np.array([7, 7, 3, 9], np.uint64))
    >>> v = Vocabulary.from_counter(c, min_count=1)
    >>> v.encode(np.array([7, 3, 9, 42], np.uint64))      # 42 unseen -> OOV
    array([0, 1, 2, 3])
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

#: pending (key, count) pairs before the counter merges them into its sorted arrays
_MERGE_MIN = 1 << 22
#: hash mode tracks which ids were used with one byte per id, while all tables together stay under this
_DISTINCT_BITMAP_MAX_BYTES = 256 * 2**20


class FrequencyCounter:
    """Exact count of every distinct uint64 key seen (memory: 16 bytes per distinct key)."""

    def __init__(self) -> None:
        self._keys = np.empty(0, dtype=np.uint64)
        self._counts = np.empty(0, dtype=np.int64)
        self._pending: List[Tuple[np.ndarray, np.ndarray]] = []
        self._pending_n = 0

    def add(self, keys: np.ndarray) -> None:
        if keys.size == 0:
            return
        u, c = np.unique(keys, return_counts=True)
        self.add_counts(u, c)

    def add_counts(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Adds ``counts[i]`` sightings of ``keys[i]`` (another counter's result, say; a key may repeat)."""
        if keys.size == 0:
            return
        self._pending.append((keys.astype(np.uint64, copy=False), counts.astype(np.int64, copy=False)))
        self._pending_n += keys.size
        if self._pending_n > max(self._keys.size, _MERGE_MIN):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([self._keys, *(u for u, _ in self._pending)])
        counts = np.concatenate([self._counts, *(c for _, c in self._pending)])
        self._keys, inverse = np.unique(keys, return_inverse=True)
        self._counts = np.zeros(self._keys.size, dtype=np.int64)
        np.add.at(self._counts, inverse, counts)
        self._pending, self._pending_n = [], 0

    def result(self) -> Tuple[np.ndarray, np.ndarray]:
        """(sorted distinct keys, their counts)."""
        self._merge()
        return self._keys, self._counts


class Vocabulary:
    """Frequency-ordered ids of one table; unknown and rare keys map to the OOV id ``size``."""

    def __init__(self, ranked_keys: np.ndarray, counts: np.ndarray, rare: int = 0) -> None:
        #: keys by id (id 0 first) and their training counts
        self.ranked_keys = ranked_keys
        self.counts = counts
        #: distinct training values dropped for being seen fewer than min_count times
        self.rare = rare
        order = np.argsort(ranked_keys, kind="stable")
        self._sorted_keys = ranked_keys[order]
        self._ids_of_sorted = order.astype(np.int64)

    @classmethod
    def from_counter(cls, counter: FrequencyCounter, min_count: int = 1) -> "Vocabulary":
        keys, counts = counter.result()
        keep = counts >= min_count
        keys, counts_kept = keys[keep], counts[keep]
        rank = np.lexsort((keys, -counts_kept))  # by count descending, then key ascending
        return cls(keys[rank], counts_kept[rank], rare=int((~keep).sum()))

    @classmethod
    def empty(cls) -> "Vocabulary":
        """The vocabulary of a table whose train rows hold no value: every value is out of vocabulary."""
        return cls(np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64))

    @property
    def size(self) -> int:
        return int(self.ranked_keys.size)

    @property
    def num_embeddings(self) -> int:
        return self.size + 1  # + the OOV row

    @property
    def oov_id(self) -> int:
        return self.size

    def encode(self, keys: np.ndarray) -> np.ndarray:
        if self.size == 0:
            return np.full(keys.shape, self.oov_id, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._sorted_keys, keys), self.size - 1)
        hit = self._sorted_keys[pos] == keys
        return np.where(hit, self._ids_of_sorted[pos], self.oov_id)


class HashEncoder:
    """``id = key % num_embeddings`` (the DLRM convention for Criteo's hex categories)."""

    def __init__(self, num_embeddings: int) -> None:
        self.num_embeddings = int(num_embeddings)
        self.oov_id: Optional[int] = None

    def encode(self, keys: np.ndarray) -> np.ndarray:
        return (keys % np.uint64(self.num_embeddings)).astype(np.int64)


#: what the summary and docs say of ``--ids raw``
RAW_CAPACITY_RULE = ("num_embeddings = --capacity N, or without it the distinct ids of the table's train rows + 1 "
                     "(the row a raw table keeps for ids it does not hold)")
RAW_OVERFLOW_RULE = "id = int(hex, 16) as int64; a value above 2**63 - 1 keeps its low 63 bits; empty -> null"
_LOW_63_BITS = np.uint64(2**63 - 1)


class RawEncoder:
    """``id = key`` as int64 (``--ids raw``): the value itself, for tables that map ids to rows on their own."""

    def __init__(self, capacity: Optional[int]) -> None:
        #: None until the write pass has counted the distinct ids (no --capacity)
        self.num_embeddings = capacity
        self.oov_id: Optional[int] = None

    def encode(self, keys: np.ndarray) -> np.ndarray:
        # Criteo's 8 hex digits always fit; only 16-digit values with the top bit set lose it (a non-negative id)
        return (keys & _LOW_63_BITS).astype(np.int64)


class TableTally:
    """What the summary says of one table: rows with no value, out-of-vocabulary rows, distinct ids used."""

    def __init__(self, num_embeddings: int, oov_id: Optional[int], track_distinct: bool) -> None:
        self.num_embeddings = num_embeddings
        self.oov_id = oov_id
        self.empty: Dict[str, int] = {}
        self.oov: Dict[str, int] = {}
        self._used = np.zeros(num_embeddings, dtype=bool) if track_distinct else None

    def add(self, split: str, ids: np.ndarray, empty: int) -> None:
        self.empty[split] = self.empty.get(split, 0) + int(empty)
        if self.oov_id is not None:
            self.oov[split] = self.oov.get(split, 0) + int((ids == self.oov_id).sum())
        if self._used is not None:
            self._used[ids] = True

    def to_dict(self) -> Dict[str, object]:
        d: Dict[str, object] = {"num_embeddings": self.num_embeddings, "empty_rows": dict(self.empty)}
        if self.oov_id is not None:
            d["oov_rows"] = dict(self.oov)
        if self._used is not None:
            d["distinct_ids_used"] = int(self._used.sum())
        return d


def tallies(sizes: Dict[str, int], oov_ids: Dict[str, Optional[int]],
            untracked: Sequence[str] = ()) -> Dict[str, TableTally]:
    """One :class:`TableTally` per table; distinct ids are tracked while all tables fit the bitmap budget (never
    for ``untracked`` ones, whose ids are not bounded by their size)."""
    track = sum(v for k, v in sizes.items() if k not in untracked) <= _DISTINCT_BITMAP_MAX_BYTES
    return {name: TableTally(v, oov_ids.get(name), track and name not in untracked) for name, v in sizes.items()}
