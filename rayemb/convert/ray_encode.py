"""The Ray engine's tasks: chunks' lines counted, chunks encoded in input order, part files written by tasks.

One task per chunk encodes it block by block
(:func:`~rayemb.convert.chunk_tasks.encode_chunk`, a Ray generator task); each
block's tables stay in Ray's object store. The driver takes the chunks' blocks
in input order (a window of tasks runs ahead of it) and adds up the summary from
them (:class:`~rayemb.convert.stream.WriteState`: bad lines, positives, per-table
tallies, read in the object store of the driver's node without a copy), while
:class:`~rayemb.convert.output.PartPlan` cuts each split's rows into the part
files the single-process engine writes. Once every row of a part is encoded, a
task writes that part (the parquet encoding, the costly part of writing) into
the staging folder, from the blocks' objects: these tasks run on the driver's
node, where the staging folder is (a local folder, or the local copy of a
bucket's dataset, :class:`~rayemb.convert.output.StagedOutput`). Finished parts
are handed to tasks a node's CPUs' worth at a time, the rest after the last
chunk: the last parts can only be written once the last chunk is encoded, and
earlier parts written alongside them keep the node's CPUs busy to the end.

A chunk's first line number is the sum of the line counts of the chunks before
it in its file: small counting tasks, which the encoding task of a chunk waits
for (Ray passes their results as its arguments), so encoding starts while later
chunks are still being counted.

A failure stops every task of the pass (:meth:`EncodePass.stop`) before the error
goes up, so that the staging folder is removed with nothing left writing into it.

Example::

    >>> counts = line_counts(chunks, opts.block_size)
    >>> with EncodePass(state, cpus=8) as encoding:
    ...     encoding.run(chunks, ray.put(job), counts, progress, "writing")
    ...     rows = state.close()
    ...     encoding.wait()
"""

from __future__ import annotations

import functools
import os
from collections import deque
from dataclasses import replace
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa

from rayemb.convert.chunk_tasks import ChunkJob, EncodedBlock, encode_chunk
from rayemb.convert.chunks import Chunk, chunk_lines
from rayemb.convert.common import Progress
from rayemb.convert.output import PartPlan, part_name, write_part
from rayemb.convert.stream import WriteState

#: encoding tasks running or queued beyond one per CPU: enough to keep every CPU busy while the driver takes the
#: chunk in turn, few enough that the blocks of later chunks waiting for their turn stay a small part of the object
#: store
AHEAD = 2
#: how long a failed pass waits for its part-writing tasks to stop before the staging folder is removed
STOP_TIMEOUT_S = 60.0


def _count_task(chunk: Chunk, block_size: int) -> int:
    return chunk_lines(chunk, block_size)


def _encode_task(chunk: Chunk, job: ChunkJob, *line_counts: int) -> Iterator[EncodedBlock]:
    yield from encode_chunk(replace(chunk, first_line=chunk.first_line + sum(line_counts)), job)


def _write_task(path: str, schema: pa.Schema, slices: Sequence[Tuple[str, int, int]], *blocks: EncodedBlock) -> int:
    return write_part(path, schema, [b.tables[split].slice(start, stop - start)
                                     for b, (split, start, stop) in zip(blocks, slices)])


@functools.lru_cache(maxsize=None)
def _remote() -> Tuple[Any, Any, Any]:
    import ray

    return ray.remote(_count_task), ray.remote(num_returns="streaming")(_encode_task), ray.remote(_write_task)


def line_counts(chunks: Sequence[Chunk], block_size: int) -> Dict[int, Any]:
    """A counting task per chunk that has a later chunk in its file: its line count (an ObjectRef) by chunk
    index."""
    count = _remote()[0]
    last = {c.file_index: c.index for c in chunks}
    return {c.index: count.remote(c, block_size) for c in chunks if last[c.file_index] != c.index}


def _counts_before(chunks: Sequence[Chunk], counts: Dict[int, Any]) -> Dict[int, List[Any]]:
    before: Dict[int, List[Any]] = {}
    seen: Dict[int, List[Any]] = {}
    for c in chunks:
        earlier = seen.setdefault(c.file_index, [])
        before[c.index] = list(earlier)
        if c.index in counts:
            earlier.append(counts[c.index])
    return before


def numbered(chunks: Sequence[Chunk], counts: Dict[int, Any]) -> List[Chunk]:
    """The chunks with their first line numbers (waits for the counting tasks)."""
    import ray

    lines = dict(zip(counts, ray.get(list(counts.values()))))
    out, first = [], {}
    for c in chunks:
        line = first.get(c.file_index, 1)
        out.append(replace(c, first_line=line))
        first[c.file_index] = line + lines.get(c.index, 0)
    return out


def _this_node(ray: Any) -> Tuple[str, int]:
    """The driver's node: its id and its CPUs (none on a head kept for drivers)."""
    node = ray.get_runtime_context().get_node_id()
    cpus = next((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["NodeID"] == node and n["Alive"]), 0)
    return node, int(cpus)


class _PartTasks:
    """One split's part files, each written by a task once its rows are all encoded: what
    :class:`~rayemb.convert.stream.WriteState` writes through in place of its
    :class:`~rayemb.convert.output.PartWriter`; ``source`` is the object of the block whose rows come next."""

    def __init__(self, directory: str, split: str, rows_per_file: int,
                 submit: Callable[[str, List[Tuple[str, int, int]], List[Any]], None]) -> None:
        self.directory, self.split, self.submit = directory, split, submit
        self.plan: PartPlan[Any] = PartPlan(rows_per_file)
        self.source: Any = None

    def write(self, table: pa.Table) -> None:
        self._submit(self.plan.add(self.source, table.num_rows))

    def close(self) -> int:
        self._submit(self.plan.close())
        return self.plan.rows

    def _submit(self, parts: List[Tuple[int, List[Tuple[Any, int, int]]]]) -> None:
        for index, pieces in parts:
            self.submit(os.path.join(self.directory, part_name(index)),
                        [(self.split, start, stop) for _, start, stop in pieces], [src for src, _, _ in pieces])


class EncodePass:
    """The encoding pass of one conversion into ``state`` (its writers replaced by part-writing tasks); as a
    context manager it stops every task it started when the block raises."""

    def __init__(self, state: WriteState, cpus: int) -> None:
        import ray
        from ray.util.client import ray as client

        self.ray, self.state = ray, state
        self.ahead = cpus + AHEAD
        self.max_writes = max(2, cpus)
        self.queue: Deque[Tuple[Chunk, Any]] = deque()  # the chunks submitted, their tasks' generators
        self.writes: List[Any] = []  # the part-writing tasks not yet checked
        self.held: List[Tuple[str, List[Tuple[str, int, int]], List[Any]]] = []  # parts not yet handed to a task
        self.hold = 0
        self.written = 0
        if client.is_connected():
            # Ray Client: the driver's node is the head, not this machine, where the staging folder is; the
            # state's own part writers write here what ray.get brings over
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node, node_cpus = _this_node(ray)
        # the staging folder is on the driver's node: the parts are written there, on one of its CPUs each (on
        # none where it lends tasks none)
        self._write = _remote()[2].options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                                           num_cpus=1 if node_cpus else 0)
        self.hold = max(1, node_cpus)
        state.writers = {s: _PartTasks(w.directory, s, state.opts.rows_per_file, self._submit)
                         for s, w in state.writers.items()}

    def __enter__(self) -> "EncodePass":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None:
            self.stop()

    def _submit(self, path: str, slices: List[Tuple[str, int, int]], sources: List[Any]) -> None:
        # parts wait until the driver's node has one for each CPU, or the last chunk is encoded: written while
        # chunks are still being encoded they would leave CPUs idle at the end, where the last parts, which
        # need the last chunk, are written alone
        self.held.append((path, slices, sources))
        if len(self.held) >= self.hold:
            self._release()

    def _release(self) -> None:
        for path, slices, sources in self.held:
            self.writes.append(self._write.remote(path, self.state.pa_schema, slices, *sources))
        self.held = []

    def run(self, chunks: Sequence[Chunk], job_ref: Any, counts: Dict[int, Any], progress: Progress,
            stage: str) -> None:
        """Every chunk's blocks, in input order, added up into the state and handed to part-writing tasks."""
        encode = _remote()[1]
        before = _counts_before(chunks, counts)
        queue, submitted = self.queue, 0

        def top_up() -> None:
            nonlocal submitted
            # parts not yet written hold their blocks in the object store: no new chunk while too many wait
            while submitted < len(chunks) and len(queue) < self.ahead and \
                    len(self.writes) + len(self.held) < self.max_writes:
                c = chunks[submitted]
                queue.append((c, encode.remote(c, job_ref, *before[c.index])))
                submitted += 1

        while True:
            top_up()
            if not queue:
                if submitted == len(chunks):
                    return
                self._release()
                self._check_writes(timeout=None, at_least=1)
                continue
            chunk, blocks = queue[0]
            done_bytes = 0
            for ref in blocks:
                block = self.ray.get(ref)
                self._add(block, ref)
                done_bytes += block.nbytes
                progress.update(stage, chunk.path, block.bad.lines_read, chunk.start + done_bytes)
            queue.popleft()
            self._check_writes(timeout=0)

    def _add(self, block: EncodedBlock, ref: Any) -> None:
        state = self.state
        state.bad.merge(block.bad)
        for t, ids in block.distinct.items():
            state.add_distinct(t, ids)
        for split, table in block.tables.items():
            if table is not None:
                writer = state.writers[split]
                if isinstance(writer, _PartTasks):
                    writer.source = ref
                state.write(split, table)

    def _check_writes(self, timeout: Optional[float], at_least: Optional[int] = None) -> None:
        """Raises a finished part-writing task's error; counts the rows of those that succeeded (waiting up to
        ``timeout`` for all, or for ``at_least`` of them)."""
        if not self.writes:
            return
        ready, self.writes = self.ray.wait(self.writes, num_returns=min(at_least or len(self.writes),
                                                                          len(self.writes)),
                                           timeout=timeout, fetch_local=True)
        self.written += sum(self.ray.get(ready))

    def wait(self) -> None:
        """Waits for every part to be written (after the state's close cut the last ones)."""
        self._release()
        self._check_writes(timeout=None)
        due = sum(w.plan.rows for w in self.state.writers.values() if isinstance(w, _PartTasks))
        if self.written != due:
            raise RuntimeError(f"ray engine: {self.written} rows written into part files, {due} due")

    def stop(self) -> None:
        """Cancels every task of the pass and waits (a while) for the part-writing ones to end."""
        for ref in (*(blocks for _, blocks in self.queue), *self.writes):
            try:
                self.ray.cancel(ref)
            except Exception:  # noqa: BLE001 - a task that already ended cannot be cancelled; nothing to stop
                pass
        if self.writes:
            self.ray.wait(self.writes, num_returns=len(self.writes), timeout=STOP_TIMEOUT_S, fetch_local=False)
