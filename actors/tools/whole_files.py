"""A file read whole for an edit: into a pooled buffer when it is big (issue 26).

`f.read()` of a 16 MiB file makes a new 16 MiB `bytes` each time: the kernel faults in its
4,096 fresh pages while it copies the file in, and freeing it unmaps them again. With the
agent's event loop on the other of two cores, every such read delayed the loop by 7-8 ms
(a read into a buffer allocated once: 1.9 ms). So a file of at least `POOLED_MIN_BYTES` is read
into a buffer lent by `READ_BUFFERS`, which keeps its faulted pages between calls.

The buffers are private anonymous maps: made without touching a page (a `bytearray(n)` zeroes
all of them, 13 ms for 16 MiB with the GIL held), searched in place with `mmap.find` (start
and end bounds, no copy), and viewed with `memoryview` for hashing and writing. A buffer is
larger than the file in it, and past the file's end holds what an earlier read left there: the
file's bytes are `data[:length]`, and every use bounds itself by `length`.
"""

from __future__ import annotations

import io
import mmap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from toolwire.actors.buffer_pool import BufferPool

MIB = 1 << 20
# Below this a file is read as a `bytes` of its own: a small allocation reuses memory the
# allocator already has, and a pooled buffer would mostly be unused room.
POOLED_MIN_BYTES = MIB
# Buffers are made in whole MiB: a file that grows or shrinks a little fits the same buffer.
GRANULE = MIB
# Kept idle: four buffers of up to 18 MiB, so one edit of four 16 MiB files (issue 26's load; a
# 16 MiB file needs 17 MiB with the byte that finds its end) reads into warm memory every time,
# and the agent keeps at most 72 MiB it does not use.
IDLE_BUFFERS = 4
IDLE_BYTES = IDLE_BUFFERS * 18 * MIB
# A big file is read into its buffer in read(2) calls of at most this many bytes: the kernel
# keeps a CPU for the whole copy of one call (actors/tools/files.py, WRITE_SLICE_BYTES, says
# why), and the event loop's thread must not wait for 16 MiB of it.
READ_SLICE_BYTES = MIB


def new_map(size: int) -> mmap.mmap:
    """`size` bytes of anonymous memory, private to this process, not faulted in yet."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def has_live_views(buffer: mmap.mmap) -> bool:
    """Whether a `memoryview` (or anything else holding its buffer) of `buffer` still exists.

    The only public sign: `mmap.resize` refuses with BufferError while the map's memory is
    exported, before it would change anything; resizing to its own size changes nothing
    otherwise. (tests/test_whole_files.py checks that this still tells.)"""
    try:
        buffer.resize(len(buffer))
    except BufferError:
        return True
    except (OSError, SystemError):
        # A platform that cannot resize a map (no mremap) cannot tell either: count it as
        # viewed, so that it is never lent again (the pool makes new buffers instead).
        return True
    return False


READ_BUFFERS: BufferPool[mmap.mmap] = BufferPool(
    new_map,
    len,
    has_live_views,
    granule=GRANULE,
    max_idle=IDLE_BUFFERS,
    max_idle_bytes=IDLE_BYTES,
)


@dataclass(frozen=True)
class WholeFile:
    """A file's bytes as read: the first `length` bytes of `data`."""

    data: bytes | mmap.mmap
    length: int

    def content(self) -> bytes | memoryview:
        """The file's bytes as one value, without a copy."""
        if isinstance(self.data, bytes):
            return self.data
        return memoryview(self.data)[: self.length]


@contextmanager
def read_whole(
    f: io.FileIO, size: int, pool: BufferPool[mmap.mmap] | None = None
) -> Iterator[WholeFile]:
    """The whole of the file `f` (read from its current position to its end), whose stat said
    `size` bytes. A buffer of `pool` (READ_BUFFERS unless named) is lent for as long as the
    context lasts: no view of it should outlive the context (one that does keeps the buffer
    from being lent again until it is gone, see `has_live_views`)."""
    if pool is None:
        pool = READ_BUFFERS
    if size < POOLED_MIN_BYTES:
        data = f.read()
        yield WholeFile(data, len(data))
        return
    start = f.tell()
    # One byte more than the stat said: a read that stops short of the buffer's end has met
    # the file's end; one that fills it has met a file that grew since the stat.
    buffer = pool.take(size + 1)
    try:
        length = _read_into(f, buffer)
    except BaseException:
        pool.give_back(buffer)
        raise
    if length == len(buffer):
        pool.give_back(buffer)
        f.seek(start)
        data = f.read()
        yield WholeFile(data, len(data))
        return
    try:
        yield WholeFile(buffer, length)
    finally:
        pool.give_back(buffer)


def _read_into(f: io.FileIO, buffer: mmap.mmap) -> int:
    """Fill `buffer` from `f` until the file's end or the buffer's; how many bytes were read.
    Each `readinto` releases the GIL while the kernel copies, a slice of READ_SLICE_BYTES at
    most."""
    with memoryview(buffer) as view:
        at = 0
        while at < len(view):
            got = f.readinto(view[at : at + READ_SLICE_BYTES])
            if not got:
                break
            at += got
        return at
