"""Text operations on whole files that never hold the GIL for long (issue 26).

The file tools run on worker threads, but a worker shares the GIL with the event loop, and a
single C call such as ``str.count`` or ``bytes.decode`` on 16 MiB keeps it for its whole run
(10-20 ms, more for text that is not ASCII): every chat's loop waits that long. Here each such
step is done a window of `WINDOW` at a time, so that between two windows the interpreter can
hand the GIL to the loop (after ``sys.getswitchinterval()``). The results are those of the one
call each replaces: ``count``, ``replace``, ``decode`` and ``encode`` of the standard library.

Pure functions on values: no I/O, no threads of their own.
"""

from __future__ import annotations

import codecs

# 1 Mi characters or bytes: a window's find, decode or encode then takes well under a
# millisecond (about 0.5 ms for the slowest, non-ASCII decoding), small beside the loop's
# 5 ms p99 goal, and a 16 MiB file is 16 windows, so the per-window cost is noise.
WINDOW = 1 << 20


def count(text: str, old: str, *, window: int = WINDOW) -> int:
    """``text.count(old)`` for a non-empty `old`: the leftmost non-overlapping occurrences."""
    return len(_starts(text, old, limit=None, window=window))


def replace(text: str, old: str, new: str, limit: int = -1, *, window: int = WINDOW) -> str:
    """``text.replace(old, new, limit)`` for a non-empty `old` (a negative `limit`: all)."""
    starts = _starts(text, old, limit=None if limit < 0 else limit, window=window)
    if not starts:
        return text
    pieces: list[str] = []
    at = 0
    for start in starts:
        pieces.extend(_windows(text, at, start, window))
        pieces.append(new)
        at = start + len(old)
    pieces.extend(_windows(text, at, len(text), window))
    return "".join(pieces)  # a copy at memory speed, about 1 ms for 16 MiB


def decode_utf8(raw: bytes, *, window: int = WINDOW) -> str:
    """``raw.decode("utf-8")``. A UnicodeDecodeError gives the offset in the whole of `raw`."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(raw)
    parts: list[str] = []
    try:
        for start in range(0, len(raw), window):
            parts.append(decoder.decode(view[start : start + window]))
        parts.append(decoder.decode(b"", final=True))
    except UnicodeDecodeError:
        # The window's offsets are not the file's (a sequence may begin in the window
        # before): decode it all once, on this rare path, for the exact offset.
        raw.decode("utf-8")
        raise  # unreachable: the same bytes failed above
    return "".join(parts)


def encode_utf8(text: str, *, window: int = WINDOW) -> bytes:
    """``text.encode("utf-8")``."""
    return b"".join(
        text[start : start + window].encode("utf-8") for start in range(0, len(text), window)
    )


def _starts(text: str, old: str, *, limit: int | None, window: int) -> list[int]:
    """Where the leftmost non-overlapping occurrences of `old` start, at most `limit` of them;
    each ``find`` looks at one window (plus what an occurrence starting in it can reach)."""
    if not old:
        raise ValueError("old must not be empty")
    starts: list[int] = []
    at = 0
    while at < len(text) and (limit is None or len(starts) < limit):
        window_end = min(len(text), at + window + len(old) - 1)
        found = text.find(old, at, window_end)
        if found < 0:
            at = window_end - len(old) + 1 if window_end < len(text) else len(text)
            continue
        starts.append(found)
        at = found + len(old)
    return starts


def _windows(text: str, start: int, end: int, window: int) -> list[str]:
    """``text[start:end]`` as slices of at most `window` characters."""
    return [text[at : min(end, at + window)] for at in range(start, end, window)]
