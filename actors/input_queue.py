"""The order in which `process_input` calls write to one process (PROTOCOL.md 9.1). Pure.

Inputs to one process are written in the order their calls arrived and never interleaved: a
line typed by one call must never land in the middle of another call's line. Each input joins
the queue the moment its call is started (synchronously, in arrival order: the chat starts its
calls one after another, and a trio task's first step comes in no fixed order, so joining
inside the task would not do); only the input at the head may write; it leaves when it is done,
failed or canceled, and the next one gets its turn. An input canceled while it waits leaves from
the middle and never writes.

No trio here: the trio side (actors/stdin.py) wakes the waiters when the head changes.
"""

from __future__ import annotations

import contextlib
from collections import deque

__all__ = ["InputQueue"]


class InputQueue:
    """Tickets in arrival order; the oldest one still queued may write."""

    __slots__ = ("_next", "_queued")

    def __init__(self) -> None:
        self._queued: deque[int] = deque()
        self._next = 0

    def __len__(self) -> int:
        return len(self._queued)

    def join(self) -> int:
        """A new input arrived: its ticket, behind every input already queued."""
        ticket = self._next
        self._next += 1
        self._queued.append(ticket)
        return ticket

    def may_write(self, ticket: int) -> bool:
        """True when `ticket` is the oldest input still queued: its turn to write."""
        return bool(self._queued) and self._queued[0] == ticket

    def leave(self, ticket: int) -> bool:
        """The input is done (written, failed or canceled): it gives up its place. True when
        the head changed (the next input now may write). Leaving twice is harmless."""
        if not self._queued:
            return False
        if self._queued[0] == ticket:
            self._queued.popleft()
            return True
        # Canceled while waiting (O(queued): a few at most), or not queued at all.
        with contextlib.suppress(ValueError):
            self._queued.remove(ticket)
        return False
