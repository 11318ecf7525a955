"""What one task of the Ray engine does with one chunk: count its values, or encode it.

Plain functions of a :class:`~rayemb.convert.chunks.Chunk` and a
:class:`ChunkJob` (no Ray here: :mod:`rayemb.convert.ray_engine` and
:mod:`rayemb.convert.ray_encode` run them as Ray tasks, and tests run them in
order in one process). Each reads its chunk block by block
(:func:`~rayemb.convert.chunks.text_blocks`), parses with
:func:`~rayemb.convert.criteo_columns.parse_block`, picks validation rows with
the single-process engine's :func:`~rayemb.convert.stream.valid_mask`, and
encodes with the same encoders, so the rows, ids and split are those of the
single-process engine whatever the chunking. :func:`encode_chunk` hands out one
:class:`EncodedBlock` per block: its rows of each split as Arrow tables (they
travel through Ray's object store without a copy into another format) and what
the summary adds up.

Example::

    >>> job = ChunkJob(opts, encoders, pa_schema)
    >>> for block in encode_chunk(chunk, job):
    ...     train = block.tables["train"]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np
import pyarrow as pa

from rayemb.constants import TRAIN_SPLIT
from rayemb.convert.chunks import Chunk, text_blocks
from rayemb.convert.common import BadLines, ConvertOptions
from rayemb.convert.criteo import CATEGORICAL
from rayemb.convert.criteo_columns import parse_block
from rayemb.convert.stream import Encoder, Records, split_tables, valid_mask
from rayemb.convert.vocab import FrequencyCounter, Vocabulary


@dataclass(frozen=True)
class ChunkJob:
    """What every task of one conversion needs (put in the object store once)."""

    opts: ConvertOptions
    #: the encoder of every table (None in the counting pass, which makes them)
    encoders: Optional[Dict[str, Encoder]] = None
    #: the dataset's parquet schema (the encoding pass's tables)
    pa_schema: Optional[pa.Schema] = None
    #: raw tables whose distinct train ids are counted (--ids raw without --capacity)
    count_distinct: Tuple[str, ...] = field(default_factory=tuple)


def _records(chunk: Chunk, opts: ConvertOptions) -> Iterator[Tuple[Records, BadLines, int]]:
    """``(records, the block's bad lines, its text bytes)`` per block of ``chunk``, lines numbered on from the
    chunk's first line."""
    first_line = chunk.first_line
    for buf in text_blocks(chunk, opts.block_size):
        bad = BadLines()
        rec = parse_block(buf, first_line, chunk.path, bad)
        first_line += bad.lines_read
        yield rec, bad, len(buf)


def count_values(chunk: Chunk, job: ChunkJob) -> Iterator[Dict[str, Any]]:
    """Per table: the distinct keys of the chunk's train rows and how often each occurs (bytes of uint64 / int64)."""
    counters = {t: FrequencyCounter() for t in CATEGORICAL}
    for rec, _, _ in _records(chunk, job.opts):  # the encoding pass counts the bad lines
        train = ~valid_mask(rec, chunk.role, chunk.file_index, job.opts)
        for t in CATEGORICAL:
            keys, empty = rec.keys[t]
            counters[t].add(keys[train & ~empty])
    for t, counter in counters.items():
        keys, counts = counter.result()
        yield {"table": t, "keys": keys.tobytes(), "counts": counts.tobytes()}


def merge_counts(table: str, keys: Any, counts: Any, min_count: int) -> Dict[str, Any]:
    """One table's vocabulary from every chunk's counts (in any order: the sums and the ranking do not depend on
    it): ``ranked`` keys by id, their ``counts``, and how many values were ``rare``."""
    counter = FrequencyCounter()
    for k, c in zip(keys, counts):
        counter.add_counts(np.frombuffer(k, dtype=np.uint64), np.frombuffer(c, dtype=np.int64))
    vocab = Vocabulary.from_counter(counter, min_count)
    return {"table": table, "ranked": vocab.ranked_keys.tobytes(), "counts": vocab.counts.tobytes(),
            "rare": vocab.rare}


def vocabulary_of(row: Dict[str, Any]) -> Vocabulary:
    return Vocabulary(np.frombuffer(row["ranked"], dtype=np.uint64).copy(),
                      np.frombuffer(row["counts"], dtype=np.int64).copy(), rare=int(row["rare"]))


@dataclass
class EncodedBlock:
    """One block of a chunk, encoded: its rows of each split (None for none) and what the summary adds up."""

    tables: Dict[str, Optional[pa.Table]]
    #: the block's bad lines (and lines read)
    bad: BadLines
    #: the block's bytes of text (progress)
    nbytes: int
    #: the distinct train ids of ``ChunkJob.count_distinct`` tables
    distinct: Dict[str, np.ndarray]


def encode_chunk(chunk: Chunk, job: ChunkJob) -> Iterator[EncodedBlock]:
    """Per block of the chunk, in order: its rows of each split and what the summary adds up from it."""
    opts, encoders = job.opts, job.encoders
    for rec, bad, nbytes in _records(chunk, opts):
        ids = {t: encoders[t].encode(rec.keys[t][0]) for t in CATEGORICAL}
        tables = split_tables(rec, ids, valid_mask(rec, chunk.role, chunk.file_index, opts), job.pa_schema)
        train = tables[TRAIN_SPLIT]
        distinct = {}
        if train is not None:
            distinct = {t: np.unique(train.column(t).drop_null().to_numpy()) for t in job.count_distinct}
        yield EncodedBlock(tables, bad, nbytes, distinct)
