"""The retention buffer of one call's process output (PROTOCOL.md sections 4 and 5.2).

A pure core in the sans-IO style of h11: no trio, no I/O, no clock. The process reader appends
the bytes it reads; streaming, `attach` and `process_output` read decoded text from absolute
byte offsets; the result builder asks for the head-and-tail `output` of a Result. Keeping it pure
makes every promise below checkable against a plain `bytes` model (tests/test_output.py).

Why head + tail instead of only the newest bytes: the first error lines of a long build (the
cause) and its last lines (the verdict) must both survive. A buffer that kept only the tail
would lose the cause; one that kept only the head would make a failed build read as a success
because its final error was dropped. The middle is what goes, and it is always counted: nothing
is dropped silently (a Result's `truncated_bytes`, and the jump in a chunk's offset).

Offsets count raw bytes, from 0 at the first byte the process wrote. Text is UTF-8 decoded with
replacement, incrementally: a multi-byte character split across appends or reads is never
mangled, because a read never ends inside a character while more bytes may still complete it.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "DEFAULT_READ_BYTES",
    "DEFAULT_RESULT_BYTES",
    "DEFAULT_RETENTION_BYTES",
    "OMITTED_MARKER",
    "RESULT_HEAD_BYTES",
    "RUNNING_HEAD_BYTES",
    "Chunk",
    "OutputBuffer",
]

# `output_retention_bytes`: what a running process keeps for streaming, `attach` and
# `process_output`. Enough for a follower that fell behind to catch up; small enough that a few
# chatty builds per chat cannot exhaust the agent's memory.
DEFAULT_RETENTION_BYTES = 1024 * 1024

# The first bytes of a running process are always kept (inside the retention above): they hold
# the first error lines of a build, usually the cause of everything that follows.
RUNNING_HEAD_BYTES = 64 * 1024

# `result_output_bytes`: the most raw output bytes a Result's `output` carries. It goes to the
# model, whose context is precious, and an exited process shrinks to it, so an idle agent holds
# at most this much per exited process.
DEFAULT_RESULT_BYTES = 64 * 1024

# The head of a Result's `output`; the tail gets the rest (48 KiB by default). The tail is the
# larger part because the end of a run (the final error, the test summary) is what the model
# needs most; the head still shows where things first went wrong.
RESULT_HEAD_BYTES = 16 * 1024

# The line put where a Result's `output` was cut, with N = truncated_bytes (PROTOCOL.md 5.2).
# Clients and models match on this text: never reword it.
OMITTED_MARKER = "[... {n} bytes omitted ...]"

# Default most bytes per `read`: one `output` event stays far below any sane
# `max_message_bytes`, and a follower catching up on 1 MiB needs only 16 messages.
DEFAULT_READ_BYTES = 64 * 1024

# A UTF-8 character has at most 3 continuation bytes after its lead byte; so a read that starts
# mid-character skips at most 3 bytes, and at most 3 trailing bytes are ever held back.
_MAX_CONTINUATION = 3


class Chunk(NamedTuple):
    """Decoded text read from an `OutputBuffer`.

    `offset` can be larger than the offset asked for: the bytes in between were dropped (or were
    the orphaned rest of a character whose start was dropped). That jump is how a reader learns
    that output is missing, so it is reported, never hidden.
    """

    offset: int  # byte offset of the first byte this text came from
    data: str  # decoded text (UTF-8, errors="replace")
    next_offset: int  # byte offset just past the bytes consumed (the cursor's new position)


def _is_continuation(byte: int) -> bool:
    return 0x80 <= byte <= 0xBF


def _leading_continuations(data: bytes) -> int:
    """How many of the first (at most 3) bytes of `data` are UTF-8 continuation bytes.

    Used where the bytes before `data` are gone: such bytes are the orphaned rest of a character
    whose lead byte was dropped, and decoding them would only print replacement characters.
    """
    count = 0
    limit = min(len(data), _MAX_CONTINUATION)
    while count < limit and _is_continuation(data[count]):
        count += 1
    return count


def _unit_length(data: bytes, pos: int) -> tuple[int, bool]:
    """Length of the decoding unit at `data[pos]`, and whether the end of `data` cut it short.

    A unit is what CPython's UTF-8 decoder turns into one character: a complete sequence, the
    maximal valid prefix of a sequence (one U+FFFD), or a single invalid byte (one U+FFFD).
    Following the decoder exactly is what lets reads that split the bytes at unit boundaries
    reproduce a one-shot `decode("utf-8", "replace")` character for character.
    """
    lead = data[pos]
    # (continuation bytes needed, allowed range of the first continuation byte), per RFC 3629
    # and Unicode's "maximal subpart" rule: E0/F0 exclude overlongs, ED excludes surrogates,
    # F4 excludes code points above U+10FFFF.
    if lead < 0x80:
        return 1, False
    if 0xC2 <= lead <= 0xDF:
        need, low, high = 1, 0x80, 0xBF
    elif lead == 0xE0:
        need, low, high = 2, 0xA0, 0xBF
    elif lead == 0xED:
        need, low, high = 2, 0x80, 0x9F
    elif 0xE1 <= lead <= 0xEF:
        need, low, high = 2, 0x80, 0xBF
    elif lead == 0xF0:
        need, low, high = 3, 0x90, 0xBF
    elif 0xF1 <= lead <= 0xF3:
        need, low, high = 3, 0x80, 0xBF
    elif lead == 0xF4:
        need, low, high = 3, 0x80, 0x8F
    else:  # a stray continuation byte, C0/C1 (always overlong) or F5..FF (never valid)
        return 1, False
    for index in range(1, need + 1):
        if pos + index >= len(data):
            return index, True
        if not low <= data[pos + index] <= high:
            return index, False
        low, high = 0x80, 0xBF
    return need + 1, False


def _incomplete_tail(data: bytes) -> int:
    """Length (0..3) of an incomplete character at the end of `data`: one that more bytes could
    still complete, so it must be held back rather than shown as U+FFFD.

    Decided by the table of `_unit_length`, not by CPython's incremental decoder, which also
    holds back ED A0..BF (a surrogate's prefix, for the `surrogatepass` handler) although with
    `replace` it can never complete.
    """
    for back in range(1, min(len(data), _MAX_CONTINUATION) + 1):
        pos = len(data) - back
        if not _is_continuation(data[pos]):
            _, cut_short = _unit_length(data, pos)
            return back if cut_short else 0
    return 0  # ends in a run of stray continuation bytes: each is complete (one U+FFFD)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _first_bytes(data: bytes | bytearray, n: int) -> bytearray:
    """The first `n` bytes of `data` as a bytearray: `data` itself when it is one."""
    if isinstance(data, bytearray):
        del data[n:]
        return data
    return bytearray(memoryview(data)[:n])


def _last_bytes(data: bytes | bytearray, n: int) -> bytearray:
    """The last `n` bytes of `data` as a bytearray: `data` itself when it is one (a bytearray
    drops its first bytes in O(1))."""
    if isinstance(data, bytearray):
        del data[: len(data) - n]
        return data
    return bytearray(memoryview(data)[len(data) - n :])


def _check_size(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


class OutputBuffer:
    """The output of one process: append-only bytes, retained as a head and a tail.

    While open (the process runs), the first `head_bytes` bytes and the newest bytes are kept, at
    most `retention_bytes` in all; the middle is dropped, and a reader learns of it from the jump
    in a chunk's offset and a Result's `truncated_bytes`. At `close()` (the process exited)
    retention shrinks to what a Result's `output` needs: the first `result_head_bytes` and the
    last `result_bytes - result_head_bytes` bytes. Storage stays below about
    `head_bytes + 2 * (retention_bytes - head_bytes)` while open, `result_bytes` once closed.

    So at any time at most two contiguous byte ranges are retained: a head range starting at 0
    and a tail range ending at `total`; when nothing was dropped they touch and form one range.
    """

    __slots__ = (
        "_closed",
        "_head",
        "_head_limit",
        "_result_head",
        "_result_tail",
        "_tail",
        "_tail_base",
        "_tail_limit",
        "_tail_start",
        "_total",
    )

    def __init__(
        self,
        retention_bytes: int = DEFAULT_RETENTION_BYTES,
        head_bytes: int = RUNNING_HEAD_BYTES,
        result_bytes: int = DEFAULT_RESULT_BYTES,
        result_head_bytes: int = RESULT_HEAD_BYTES,
    ) -> None:
        _check_size("retention_bytes", retention_bytes)
        _check_size("head_bytes", head_bytes)
        _check_size("result_bytes", result_bytes)
        _check_size("result_head_bytes", result_head_bytes)
        if head_bytes > retention_bytes:
            raise ValueError(
                f"head_bytes ({head_bytes}) must not exceed retention_bytes ({retention_bytes}):"
                " the head is part of the retained bytes"
            )
        if result_head_bytes > result_bytes:
            raise ValueError(
                f"result_head_bytes ({result_head_bytes}) must not exceed result_bytes"
                f" ({result_bytes}): the head is part of the result output"
            )
        # Result sizes larger than the running retention are accepted: the result then holds
        # what was retained, and still counts every byte it lacks in `truncated_bytes`.
        self._head_limit = head_bytes
        self._tail_limit = retention_bytes - head_bytes
        self._result_head = result_head_bytes
        self._result_tail = result_bytes - result_head_bytes
        self._head = bytearray()  # bytes [0, len(_head)): never moves, only truncated at close
        # Physical tail storage: bytes [_tail_base, _total). Bytes before _tail_start are already
        # dropped and only wait for the next compaction (amortised O(1) per appended byte).
        self._tail = bytearray()
        self._tail_base = 0
        self._tail_start = 0  # first retained offset of the tail range; == len(_head) if no gap
        self._total = 0
        self._closed = False

    @classmethod
    def restored(
        cls,
        head: bytes | bytearray,
        tail: bytes | bytearray,
        total: int,
        *,
        retention_bytes: int = DEFAULT_RETENTION_BYTES,
        head_bytes: int = RUNNING_HEAD_BYTES,
        result_bytes: int = DEFAULT_RESULT_BYTES,
    ) -> OutputBuffer:
        """A buffer holding what a recording kept of `total` bytes (PROTOCOL.md 10.1): its
        first bytes `head` and its newest `tail` (ending at `total`), as `append` would have
        kept them. Bytes of either beyond what this buffer retains are dropped."""
        buffer = cls(
            retention_bytes=retention_bytes, head_bytes=head_bytes, result_bytes=result_bytes
        )
        buffer.load_recorded(head, tail, total)
        return buffer

    def load_recorded(self, head: bytes | bytearray, tail: bytes | bytearray, total: int) -> None:
        """Hold what a recording kept (see `restored`), in place of anything held. A bytearray
        is taken over as this buffer's own storage, not copied (its caller gives it up): a
        restarting agent loads up to `retention_bytes` per process it re-adopts, and each copy
        of that is paid for once per process before the agent answers anything."""
        head_len = min(self._head_limit, total, len(head))
        tail_len = min(len(tail), self._tail_limit)
        tail_start = total - tail_len
        if tail_start < head_len:  # the ranges overlap: the head holds the start of the tail
            tail_len = total - head_len
            tail_start = head_len
        self._head = _first_bytes(head, head_len)
        self._tail = _last_bytes(tail, tail_len)
        self._tail_base = tail_start
        self._tail_start = max(tail_start, head_len)
        self._total = total

    # -- state ---------------------------------------------------------------------------------

    @property
    def total(self) -> int:
        """Bytes ever appended, which is also the offset of the next byte (`output_bytes`)."""
        return self._total

    @property
    def closed(self) -> bool:
        return self._closed

    def first_retained(self, offset: int) -> int:
        """The smallest retained offset >= `offset`, or `total` if there is none.

        This is where a reader asking for a dropped range resumes (PROTOCOL.md 5.2).
        """
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        if offset < len(self._head):
            return offset
        if offset < self._tail_start:
            return self._tail_start
        return min(offset, self._total)

    # -- writing -------------------------------------------------------------------------------

    def append(self, data: bytes) -> None:
        """Append output bytes. Costs amortised O(1) per byte and never holds more than about
        twice the retention, however much a process prints."""
        if self._closed:
            raise ValueError("cannot append to a closed OutputBuffer: its process has exited")
        view = memoryview(data)
        size = view.nbytes
        if size == 0:
            return
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += view[:room]
            view = view[room:]
        self._total += size
        rest = view.nbytes
        limit = self._tail_limit
        if rest:
            if rest >= limit:
                # These bytes alone fill the tail: copy only their end, whatever their size.
                self._tail = bytearray(view[rest - limit :])
            else:
                self._tail += view
                # Compact only once the dead prefix is as large as the live tail, so each byte
                # is moved O(1) times on average instead of on every append.
                dead = len(self._tail) - limit
                if dead > limit:
                    del self._tail[:dead]
            self._tail_base = self._total - len(self._tail)
        self._tail_start = max(len(self._head), self._total - limit)

    def close(self) -> None:
        """The process exited: shrink retention to the Result's head and tail. Idempotent.

        Keeps exactly the bytes `result_output()` uses, so the Result reads the same before and
        after, and an idle agent holds at most `result_bytes` per exited process.
        """
        if self._closed:
            return
        self._closed = True
        total = self._total
        head_end = min(self._result_head, self._first_range_end())
        tail_start = max(total - self._result_tail, self._last_range_start())
        # They meet only when nothing was dropped and the whole output fits the result.
        tail_start = max(tail_start, head_end)
        head = self._slice(0, head_end)
        tail = self._slice(tail_start, total)
        self._head = bytearray(head)
        self._tail = bytearray(tail)
        self._tail_base = tail_start
        self._tail_start = tail_start

    # -- reading -------------------------------------------------------------------------------

    def read(
        self, offset: int, max_bytes: int = DEFAULT_READ_BYTES, *, final_at: int | None = None
    ) -> Chunk | None:
        """Decoded text from `offset` (or the first retained byte after it), for a cursor.

        Returns at most `max_bytes` bytes' worth of text from one contiguous retained range (a
        reader crossing a gap calls again and sees the jump in `offset`), or None when there is
        nothing to return now. While the buffer is open, a trailing incomplete character is held
        back until its remaining bytes arrive, so a cursor that always continues at
        `next_offset` reproduces `decode("utf-8", "replace")` of the whole output exactly, however
        the appends split it. When `max_bytes` is smaller than the character at the cursor (it
        may be < 4), that one character is returned anyway, so the reader always progresses.

        `final_at`: the offset where the call ended (its Result's `output_bytes`) although the
        buffer may stay open (a timed-out command runs on; followers may still lag): a read
        never holds back bytes before it, so a character cut there and not completed by what
        the command appended since is U+FFFD at its offset, and output stitched by offset
        reaches `output_bytes` (PROTOCOL.md 9.9). One completed since reads whole.
        """
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        start = self.first_retained(offset)
        while True:
            if start >= self._total:
                return None
            range_start, range_end = self._range_of(start)
            start = self._character_start(start, range_start, range_end)
            if start < range_end:
                break
            # Skipped the rest of a character up to the end of its range: go on after the gap.
            start = self.first_retained(range_end)
        # No byte can ever follow the end of this range where it is: the process exited, or a
        # gap follows. Then an incomplete character there is final and decodes as U+FFFD.
        range_final = (
            self._closed
            or range_end < self._total
            or (final_at is not None and range_end <= final_at)
        )
        end = min(range_end, start + max_bytes)
        used = end - start
        if not (range_final and end == range_end):
            # Only the last few bytes can hold an incomplete character: look at those alone.
            used -= _incomplete_tail(self._slice(max(start, end - _MAX_CONTINUATION), end))
            if final_at is not None and start + used < final_at <= end:
                # The call ended inside the character held back, and the command ran on and
                # appended part (not all) of the rest: the call's output still ends at
                # `final_at`, so that character is final there (U+FFFD, as in the Result's
                # `output`). Holding it back would leave the follower short of `output_bytes`.
                used = final_at - start
        if used == 0:
            if end == range_end:
                return None  # only an incomplete character, held back until it completes
            # max_bytes is smaller than the character at `start`: return that character alone.
            window = self._slice(start, min(range_end, start + _MAX_CONTINUATION + 1))
            used, cut_short = _unit_length(window, 0)
            if cut_short and not range_final:
                return None
        # `used` ends at a character boundary, so decoding the slice alone gives exactly the
        # characters a one-shot decode of the whole output gives for these bytes.
        return Chunk(start, self._decode_range(start, start + used), start + used)

    def result_output(self, start: int = 0) -> tuple[str, int]:
        """A Result's `output` and `truncated_bytes` (PROTOCOL.md sections 4 and 5.2), of the
        bytes from offset `start` on (0: the whole output; a `process_input` result starts where
        its write began, PROTOCOL.md 9.1).

        Those bytes whole when they fit and none was dropped. Otherwise the first
        `result_head_bytes` and the last `result_bytes - result_head_bytes` bytes with the line
        `[... N bytes omitted ...]` between them, N = truncated_bytes: the first error lines and
        the final verdict both reach the model, and it is told exactly how much it did not see.
        The head is cut back and the tail moved forward to character boundaries (those bytes
        count in N); the answer is the same before and after `close()`.
        """
        total = self._total
        if not 0 <= start <= total:
            raise ValueError(f"start must be in 0..{total}, got {start}")
        size = total - start
        retained = self.first_retained(start) == start
        if (
            retained
            and (not self._has_gap() or start >= self._tail_start)
            and size <= self._result_head + self._result_tail
        ):
            return _decode(self._slice(start, total)), 0
        # The head comes from the retained range `start` is in (none if it was dropped).
        head_end = start
        if retained and start < total:
            head_end = min(start + self._result_head, self._range_of(start)[1])
        head = self._slice(start, head_end) if head_end > start else b""
        # A character cut by the end of the head is left out, not shown as U+FFFD.
        head = head[: len(head) - _incomplete_tail(head)]
        tail_start = max(total - self._result_tail, self._last_range_start(), head_end)
        tail = self._slice(tail_start, total)
        # The bytes before the tail are not in the output: skip a character's orphaned rest.
        tail = tail[_leading_continuations(tail) :]
        omitted = size - len(head) - len(tail)
        marker = OMITTED_MARKER.format(n=omitted)
        return f"{_decode(head)}\n{marker}\n{_decode(tail)}", omitted

    # -- internals -----------------------------------------------------------------------------

    def _has_gap(self) -> bool:
        return self._tail_start > len(self._head)

    def _first_range_end(self) -> int:
        return len(self._head) if self._has_gap() else self._total

    def _last_range_start(self) -> int:
        return self._tail_start if self._has_gap() else 0

    def _range_of(self, offset: int) -> tuple[int, int]:
        """The contiguous retained range holding the retained `offset`."""
        if not self._has_gap():
            return 0, self._total
        if offset < len(self._head):
            return 0, len(self._head)
        return self._tail_start, self._total

    def _decode_range(self, start: int, end: int) -> str:
        """`_decode(self._slice(start, end))`, decoded straight from storage: a streamed chunk
        is copied once (into the str), not three times (slice, bytes, decode)."""
        head_end = len(self._head)
        if end <= head_end:
            storage, base = self._head, 0
        elif start >= head_end:
            storage, base = self._tail, self._tail_base
        else:
            return _decode(self._slice(start, end))
        # The view is released before returning: a live export would forbid the next append
        # from resizing the storage.
        with memoryview(storage) as view:
            return str(view[start - base : end - base], "utf-8", "replace")

    def _slice(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of one contiguous retained range."""
        head_end = len(self._head)
        if end <= head_end:
            return bytes(self._head[start:end])
        base = self._tail_base
        if start >= head_end:
            return bytes(self._tail[start - base : end - base])
        # Spans head and tail storage: only possible without a gap, where _tail_base == head_end.
        return bytes(self._head[start:]) + bytes(self._tail[: end - base])

    def _character_start(self, offset: int, range_start: int, range_end: int) -> int:
        """`offset`, or the end of the character it points into (at most 3 bytes on).

        Reading from inside a character would print the rest of it as replacement characters.
        Only continuation bytes can be inside a character, and a character starts at most 3 bytes
        before one, so a tiny window around `offset` decides.
        """
        if range_start > 0:
            # The range begins after a gap: its leading continuation bytes belong to a character
            # whose start was dropped. No reader starts among them.
            orphans = _leading_continuations(
                self._slice(range_start, min(range_end, range_start + _MAX_CONTINUATION))
            )
            if offset < range_start + orphans:
                return range_start + orphans
        if offset == range_start:
            return offset
        low = max(range_start, offset - _MAX_CONTINUATION)
        window = self._slice(low, min(range_end, offset + _MAX_CONTINUATION + 1))
        index = offset - low
        if not _is_continuation(window[index]):
            return offset  # a lead byte or a single-byte unit always starts a character
        for lead in range(index - 1, -1, -1):
            if not _is_continuation(window[lead]):
                length, _ = _unit_length(window, lead)
                if lead + length > index:
                    return low + lead + length
                break
        return offset  # a stray continuation byte: a unit (one U+FFFD) of its own
