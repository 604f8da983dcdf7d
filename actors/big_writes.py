"""Whether this process is writing a large file to disk right now (issue 26).

Why the journal asks: a SQLite commit waits for an fsync of its WAL, and on a file system that
orders data before metadata (ext4's default `data=ordered`) that fsync also waits for whatever
other file's dirty pages the same journal transaction carries. While a tool writes and fsyncs
16 MiB, a commit of one row took 8 ms at the median instead of 0.25 ms on the benchmark
machine, and 300 ms now and then. A commit on the event loop's own thread (actors/journal.py,
INLINE_MAX_ROWS) holds every chat for as long: so while a big write is under way, commits go to
the journal's writer thread, where the wait holds nothing but the calls it makes durable.
An `edit_files` of big files counts as busy from its first big read to its end: it writes and
fsyncs its files one after the other, and commits between two of them, on the loop's thread,
still waited for the disk: beside edits of four 16 MiB files, 113-296 commits ran on the loop
in 3 s, the slowest 3.0-15.4 ms; with the whole call counted, 3-37, the slowest 1.2-6.2 ms.

Process-wide on purpose: the disk and the page cache are the process's, not a chat's, so a
write in one chat slows the commits of every other. Counted from worker threads (the file tools
write there) and read on the loop, hence the lock. No trio and no I/O: a counter.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

# A write at least this large makes the disk busy while it runs. Below it a write and its fsync
# take about as long as a commit's own, and marking every small write would send every commit
# of an agent that writes small files to the writer thread (two thread hand-overs each).
BIG_WRITE_BYTES = 1 << 20


class BigWrites:
    """How many writes of at least BIG_WRITE_BYTES are running in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0

    @contextmanager
    def writing(self, size: int) -> Iterator[None]:
        """Around the write of `size` bytes, its fsyncs and its rename (and, for edit_files,
        from the read of a file of `size` bytes to the call's last write): the disk counts as
        busy for as long when `size` is at least BIG_WRITE_BYTES."""
        if size < BIG_WRITE_BYTES:
            yield
            return
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1

    def busy(self) -> bool:
        """Whether a big write is running now. Read without the lock: a stale answer costs one
        commit's choice of thread, never correctness."""
        return self._running > 0


# The process's one count, shared by the file tools that write and the journal that commits.
BIG_WRITES = BigWrites()
