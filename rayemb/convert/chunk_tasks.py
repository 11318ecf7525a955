"""What one task of the Ray engine does with one chunk: count its lines, count its values, or encode it.

Plain functions of a :class:`~rayemb.convert.chunks.Chunk` and a
:class:`ChunkJob` (no Ray here: :mod:`rayemb.convert.ray_engine` runs them as
Ray Data tasks, and tests run them in order in one process). Each reads its
chunk block by block (:func:`~rayemb.convert.chunks.text_blocks`), parses with
:func:`~rayemb.convert.criteo_columns.parse_block`, picks validation rows with
the single-process engine's :func:`~rayemb.convert.stream.valid_mask`, and
encodes with the same encoders, so the rows, ids and split are those of the
single-process engine whatever the chunking. Tables travel as Arrow IPC bytes
and the rest as pickles, so a task's output is a row of bytes columns that Ray
Data carries to the driver in order.

Example::

    >>> job = ChunkJob(opts, encoders, pa_schema)
    >>> for out in encode_chunk(chunk, job):
    ...     train = read_table(out["train"])
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np
import pyarrow as pa

from rayemb.constants import TRAIN_SPLIT, VALID_SPLIT
from rayemb.convert.chunks import Chunk, count_lines, text_blocks
from rayemb.convert.common import BadLines, ConvertOptions
from rayemb.convert.criteo import CATEGORICAL
from rayemb.convert.criteo_columns import parse_block
from rayemb.convert.stream import Encoder, Records, output_table, valid_mask
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


def ipc_bytes(table: Optional[pa.Table]) -> bytes:
    if table is None or table.num_rows == 0:
        return b""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_table(buf: Any) -> Optional[pa.Table]:
    """The table of :func:`ipc_bytes` (None for no rows); ``buf``: bytes or a pyarrow buffer, read without a copy."""
    if not len(buf):
        return None
    return pa.ipc.open_stream(pa.py_buffer(buf) if isinstance(buf, bytes) else buf).read_all()


def _records(chunk: Chunk, opts: ConvertOptions) -> Iterator[Tuple[Records, BadLines, int]]:
    """``(records, the block's bad lines, its text bytes)`` per block of ``chunk``, lines numbered on from the
    chunk's first line."""
    first_line = chunk.first_line
    for buf in text_blocks(chunk, opts.block_size):
        bad = BadLines()
        rec = parse_block(buf, first_line, chunk.path, bad)
        first_line += bad.lines_read
        yield rec, bad, len(buf)


def chunk_lines(chunk: Chunk, job: ChunkJob) -> Iterator[Dict[str, Any]]:
    """The chunk's physical ``lines`` (to number the lines of the chunks after it in its file)."""
    yield {"chunk": chunk.index, "lines": sum(count_lines(buf) for buf in text_blocks(chunk, job.opts.block_size))}


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


def encode_chunk(chunk: Chunk, job: ChunkJob) -> Iterator[Dict[str, Any]]:
    """Per block of the chunk, in order: its ``train`` and ``valid`` rows as IPC bytes and a pickled ``meta``
    (the block's bad lines, its text bytes, the distinct train ids of ``job.count_distinct`` tables)."""
    opts, encoders = job.opts, job.encoders
    block = -1
    for block, (rec, bad, nbytes) in enumerate(_records(chunk, opts)):
        ids = {t: encoders[t].encode(rec.keys[t][0]) for t in CATEGORICAL}
        valid = valid_mask(rec, chunk.role, chunk.file_index, opts)
        tables = {split: output_table(rec, ids, m, job.pa_schema) if m.any() else None
                  for split, m in ((TRAIN_SPLIT, ~valid), (VALID_SPLIT, valid))}
        distinct = {}
        if tables[TRAIN_SPLIT] is not None:
            distinct = {t: np.unique(tables[TRAIN_SPLIT].column(t).drop_null().to_numpy()) for t in job.count_distinct}
        meta = {"bad": bad, "nbytes": nbytes, "distinct": distinct}
        yield {"chunk": chunk.index, "block": block, "train": ipc_bytes(tables[TRAIN_SPLIT]),
               "valid": ipc_bytes(tables[VALID_SPLIT]), "meta": pickle.dumps(meta)}
    if block < 0:  # every chunk answers, so the driver can tell a chunk with no lines from a lost one
        yield {"chunk": chunk.index, "block": 0, "train": b"", "valid": b"",
               "meta": pickle.dumps({"bad": BadLines(), "nbytes": 0, "distinct": {}})}
