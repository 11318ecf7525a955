"""The local JSONL spill file that holds tracking records the store has not received yet.

While the tracking server is away, :class:`~rayemb.tracking.run_logger.RunLogger`
appends its records here, one JSON object a line; on reconnect it replays the
file in order, in chunks, and removes it once everything is delivered (the
next outage starts a new file). A chunk that fails to send is retried from the
same place, so a replay never skips or reorders records.

Example::

    >>> spill = SpillFile("/tmp/rayemb-mlflow-spill-1.jsonl")
    >>> spill.append([{"k": "m", "key": "loss", "v": 0.5, "ts": 0, "step": 0}])
    >>> spill.replay(send=lambda batch: True, chunk=1000)    # delivered: the file is gone
    True
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Callable, Iterable, List

from rayemb.tracking.records import Record

logger = logging.getLogger(__name__)


class SpillFile:
    """An append-only JSONL file of records, replayed in order; safe to use from several threads.

    Args:
        path: the file; its folder is created on the first append.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._offset = 0  # bytes of the file already replayed
        self._pending = False

    @property
    def pending(self) -> bool:
        """True while the file holds records not yet replayed."""
        return self._pending

    def append(self, records: Iterable[Record]) -> None:
        """Appends ``records``; never raises (an unwritable disk loses them, with an error logged)."""
        try:
            with self._lock:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as f:
                    for r in records:
                        f.write(json.dumps(r) + "\n")
                self._pending = True
        except Exception as e:  # disk full or unwritable folder: the records are lost, the job goes on
            logger.error("rayemb tracking: cannot write spill file %s (%s: %s); records lost", self.path,
                         type(e).__name__, e)

    def replay(self, send: Callable[[List[Record]], bool], chunk: int) -> bool:
        """Sends the unreplayed records in order, at most ``chunk`` per ``send`` call.

        Returns True once the file is fully replayed (it is then removed), False
        as soon as ``send`` returns False (the next replay resends that chunk).
        """
        while True:
            with self._lock:
                if not self._pending:
                    return True
                batch: List[Record] = []
                new_offset = self._offset
                with open(self.path, "rb") as f:
                    f.seek(self._offset)
                    for line in f:
                        new_offset += len(line)
                        if line.strip():
                            batch.append(json.loads(line))
                        if len(batch) >= chunk:
                            break
                if not batch:
                    os.remove(self.path)  # fully replayed; the next outage starts a new file
                    self._offset, self._pending = 0, False
                    return True
            if not send(batch):
                return False
            with self._lock:
                self._offset = new_offset
