"""A bounded pool of big buffers lent out and given back, so that memory which is already
faulted in is used again instead of fresh pages (issue 26).

Why: `edit_files` reads each file whole. A fresh 16 MiB buffer per read costs 4,096 page faults
as the read fills it, and its release unmaps them again; on two cores the event loop's thread
waited meanwhile (7-8 ms of loop lag per file read, 1.9 ms reading into a buffer allocated once).
The pool keeps a few such buffers between calls.

The rules, each what a caller relies on:

- `take(size)` hands out a buffer of at least `size` bytes that is neither lent (taken and not
  given back) nor still `in_use` (a view of it outlives its last holder: an exception's
  traceback can keep one alive for a while); the smallest such idle buffer, else a new one of
  `size` rounded up to a multiple of `granule`.
- `give_back(buffer)` makes it idle again. At most `max_idle` buffers of at most
  `max_idle_bytes` in all stay idle: the ones given back longest ago are dropped first, and a
  buffer larger than `max_idle_bytes` is dropped at once. Lent buffers are not counted: they
  are memory their holders need anyway.

Generic over the buffer type: the file tools pool anonymous maps (actors/tools/whole_files.py),
the tests plain objects. Thread-safe, as the file tools run on several worker threads. No trio,
no I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

B = TypeVar("B")


class BufferPool(Generic[B]):
    def __init__(
        self,
        make: Callable[[int], B],
        capacity: Callable[[B], int],
        in_use: Callable[[B], bool],
        *,
        granule: int,
        max_idle: int,
        max_idle_bytes: int,
    ) -> None:
        if granule < 1:
            raise ValueError(f"granule: must be >= 1, not {granule}")
        if max_idle < 0:
            raise ValueError(f"max_idle: must be >= 0, not {max_idle}")
        if max_idle_bytes < 0:
            raise ValueError(f"max_idle_bytes: must be >= 0, not {max_idle_bytes}")
        self._make = make
        self._capacity = capacity
        self._in_use = in_use
        self.granule = granule
        self.max_idle = max_idle
        self.max_idle_bytes = max_idle_bytes
        self._lock = threading.Lock()
        self._idle: list[B] = []  # given back longest ago first
        # By id, holding the buffer so that no other object can take its id while it is lent.
        self._lent: dict[int, B] = {}

    def take(self, size: int) -> B:
        """A buffer of at least `size` bytes, for the caller alone until it gives it back."""
        if size < 0:
            raise ValueError(f"size: must be >= 0, not {size}")
        with self._lock:
            buffer = self._best_idle(size)
            if buffer is not None:
                self._lent[id(buffer)] = buffer
                return buffer
        # Outside the lock: making a buffer may take a while (a map's system call).
        buffer = self._make(max(self.granule, -(-size // self.granule) * self.granule))
        with self._lock:
            self._lent[id(buffer)] = buffer
        return buffer

    def _best_idle(self, size: int) -> B | None:
        fitting = [i for i, b in enumerate(self._idle) if self._capacity(b) >= size]
        # Smallest first; among equals the one given back last (its pages are the warmest).
        fitting.sort(key=lambda i: (self._capacity(self._idle[i]), -i))
        for i in fitting:
            if not self._in_use(self._idle[i]):
                return self._idle.pop(i)
        return None

    def give_back(self, buffer: B) -> None:
        """Make `buffer`, lent by `take`, idle again (or drop it, to keep the bounds)."""
        with self._lock:
            if self._lent.get(id(buffer)) is not buffer:
                raise ValueError("give_back: the buffer is not lent by this pool")
            del self._lent[id(buffer)]
            if self._capacity(buffer) > self.max_idle_bytes:
                return
            self._idle.append(buffer)
            while len(self._idle) > self.max_idle or self._idle_bytes() > self.max_idle_bytes:
                del self._idle[0]

    def _idle_bytes(self) -> int:
        return sum(self._capacity(b) for b in self._idle)

    def idle(self) -> int:
        """How many buffers are idle (kept for the next `take`)."""
        with self._lock:
            return len(self._idle)

    def idle_buffers(self) -> list[B]:
        """The idle buffers, given back longest ago first (a new list)."""
        with self._lock:
            return list(self._idle)

    def idle_bytes(self) -> int:
        """The capacity of the idle buffers, in all."""
        with self._lock:
            return self._idle_bytes()

    def lent(self) -> int:
        """How many buffers are lent now."""
        with self._lock:
            return len(self._lent)
