"""Edits of whole files that never hold the GIL for long (issue 26).

The file tools run on worker threads, but a worker shares the GIL with the event loop, and a
single C call on 16 MiB keeps it for its whole run: ``str.count`` 9 ms, a non-ASCII
``bytes.decode`` 20 ms, and any new 16 MiB value (a decoded ``str``, the replaced text, its
encoding) about 9 ms more, as the fresh allocation page-faults its 4,096 pages with the GIL
held. Every chat's loop waits that long. So an edit here never makes a whole-file value:

- the file stays the bytes it was read as, checked for UTF-8 a window at a time;
- `old` and `new` are matched as UTF-8 bytes: UTF-8 is self-synchronising, so in valid UTF-8
  the byte matches of a valid UTF-8 `old` are exactly its character matches, leftmost and
  non-overlapping alike;
- the edited content is `Pieces`: views into the original and the new texts, hashed and
  written piece by piece (hashing and writing release the GIL).

Each step looks at one window of `WINDOW` bytes per C call, so between two calls the
interpreter can hand the GIL to the loop. The file's bytes may be the start of a bigger buffer
(a pooled read buffer, actors/tools/whole_files.py): each step takes `end`, where they stop,
and never looks past it. Pure functions on values: no I/O, no threads.
"""

from __future__ import annotations

import codecs
import hashlib
import mmap
from collections.abc import Sequence

# 256 KiB: a window's find or decode takes some 0.03 ms (a 16 MiB file: 1.2-2.3 ms in all for
# the UTF-8 check, 1-4 ms for the find), so no single call keeps the GIL from the loop for
# long; a 16 MiB file is 64 windows, so the per-window cost is noise.
WINDOW = 1 << 18

Piece = bytes | memoryview
Pieces = Sequence[Piece]
# What the steps search: a file's bytes, or a buffer that begins with them (both `find` with
# start and end bounds in place, and slice to `bytes`).
Text = bytes | mmap.mmap


def _end(data: Text, end: int | None) -> int:
    if end is None:
        return len(data)
    if not 0 <= end <= len(data):
        raise ValueError(f"end: must be within 0..{len(data)}, not {end}")
    return end


def check_utf8(raw: Text, *, end: int | None = None, window: int = WINDOW) -> None:
    """Raise UnicodeDecodeError, with its offset in the whole of `raw[:end]`, unless
    `raw[:end]` is UTF-8. Nothing decoded is kept: only a window's text exists at a time."""
    stop = _end(raw, end)
    decoder = codecs.getincrementaldecoder("utf-8")()
    with memoryview(raw) as whole:
        view = whole[:stop]
        try:
            for start in range(0, stop, window):
                # ASCII is UTF-8, and `isascii` makes no text where a decode makes the window's
                # `str`: most of a source file is checked at memory speed. (A window's copy,
                # as memoryview has no `isascii`: a few microseconds.) Only where the window
                # before left no multi-byte sequence open.
                window_end = min(stop, start + window)
                if not decoder.getstate()[0] and raw[start:window_end].isascii():
                    continue
                decoder.decode(view[start:window_end])
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            # The window's offsets are not the file's (a sequence may begin in the window
            # before): decode it all once, on this rare path, for the exact offset, and raise
            # that error.
            str(view, "utf-8")
            raise  # not reached: the same bytes failed above
        finally:
            view.release()


def find_all(
    data: Text, old: bytes, limit: int = -1, *, end: int | None = None, window: int = WINDOW
) -> list[int]:
    """Where the leftmost non-overlapping occurrences of a non-empty `old` in `data[:end]`
    start, at most `limit` of them (a negative `limit`: all); each ``find`` looks at one window
    plus what an occurrence starting in it can reach. ``len(find_all(d, o))`` is
    ``d.count(o)``."""
    if not old:
        raise ValueError("old must not be empty")
    stop = _end(data, end)
    starts: list[int] = []
    at = 0
    while at < stop and (limit < 0 or len(starts) < limit):
        window_end = min(stop, at + window + len(old) - 1)
        found = data.find(old, at, window_end)
        if found < 0:
            at = window_end - len(old) + 1 if window_end < stop else stop
            continue
        starts.append(found)
        at = found + len(old)
    return starts


def contains(data: Text, part: bytes, *, end: int | None = None) -> bool:
    """Whether `part` occurs in `data[:end]` (one ``find``: for the rare hint of a failed
    edit)."""
    return data.find(part, 0, _end(data, end)) >= 0


def replaced(
    data: Text, starts: Sequence[int], old_len: int, new: bytes, *, end: int | None = None
) -> list[Piece]:
    """`data[:end]` with the `old_len` bytes at each of `starts` (ascending, not overlapping)
    replaced by `new`, as views into `data` and `new`: nothing is copied."""
    view = memoryview(data)[: _end(data, end)]
    pieces: list[Piece] = []
    at = 0
    for start in starts:
        if start > at:
            pieces.append(view[at:start])
        if new:
            pieces.append(new)
        at = start + old_len
    if at < len(view):
        pieces.append(view[at:])
    return pieces


def joined(pieces: Pieces) -> bytes:
    """The content of `pieces` as one value (for a further edit of the same file, which
    searches it whole: one copy, the only whole-file value an edit makes)."""
    if len(pieces) == 1 and isinstance(pieces[0], bytes):
        return pieces[0]
    return b"".join(pieces)


def size(pieces: Pieces) -> int:
    return sum(len(piece) for piece in pieces)


def sha256_hex(pieces: Pieces) -> str:
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)  # releases the GIL for pieces above 2 KiB
    return digest.hexdigest()
