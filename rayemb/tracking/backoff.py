"""When to try the tracking store again after it failed to answer: exponential backoff.

Example::

    >>> b = Backoff()
    >>> [b.next_delay_s(finishing=False) for _ in range(4)]
    [0.5, 1.0, 2.0, 4.0]
    >>> b.next_delay_s(finishing=True)     # a finishing run looks again within a second
    1.0
"""

from __future__ import annotations

BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
#: while finishing, retry at least this often so a returning server is seen quickly
BACKOFF_MAX_FINISHING_S = 1.0


class Backoff:
    """Delays between attempts to reach the store: ``initial_s`` doubling to ``max_s``.

    While the run is finishing the delay is capped at ``max_finishing_s``, so a
    server that comes back is seen within a second.
    """

    def __init__(self, initial_s: float = BACKOFF_INITIAL_S, max_s: float = BACKOFF_MAX_S,
                 max_finishing_s: float = BACKOFF_MAX_FINISHING_S) -> None:
        self.initial_s, self.max_s, self.max_finishing_s = initial_s, max_s, max_finishing_s
        self._next_s = initial_s

    def next_delay_s(self, finishing: bool) -> float:
        """The delay before the next attempt; each call doubles the following one (up to ``max_s``)."""
        delay = min(self._next_s, self.max_finishing_s if finishing else self.max_s)
        self._next_s = min(self._next_s * 2.0, self.max_s)
        return delay

    def reset(self) -> None:
        """The store answered: the next outage starts again at ``initial_s``."""
        self._next_s = self.initial_s
