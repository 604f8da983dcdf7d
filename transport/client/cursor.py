"""Byte-offset bookkeeping of one call's streamed output: each byte once, in order, also across
re-attaches and invalid UTF-8 (pure: no I/O, no trio; shared by both client shells)."""

from __future__ import annotations

__all__ = ["OutputCursor"]


class OutputCursor:
    """Byte-offset bookkeeping of one call's streamed output (pure: no I/O, no trio).

    `offset` is the next byte offset we expect. A chunk whose bytes were all delivered already
    is dropped; one that overlaps is trimmed to its new bytes (offsets count raw bytes, so the
    cut is made in the UTF-8 encoding, never inside a character); one that starts beyond
    `offset` is a retention jump (PROTOCOL.md 5.2), recorded in `gaps` as (from, to).

    One wrinkle: the agent decodes output with replacement, so one U+FFFD in `data` stands for
    1 to 3 raw bytes, and `offset + len(data.encode())` can overshoot the real end of a chunk.
    So the cursor also keeps an `anchor`: the last byte offset it knows exactly, and the text
    delivered since (`since_anchor`). While no request of ours moved the agent's cursor back
    (`rewound` False), chunks on one connection are contiguous, so a chunk that starts inside
    the uncertainty (between `low` and `offset`) tells where the previous one really ended, and
    the anchor moves there. A re-attach resumes from `resume_offset` (the anchor): the agent
    decodes the same bytes from the same character boundary again, so what it sends starts
    with `since_anchor`, which is trimmed off: nothing lost, nothing doubled.
    """

    __slots__ = (
        "anchor",
        "gaps",
        "low",
        "matched",
        "offset",
        "replaying",
        "rewound",
        "since_anchor",
    )

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        self.low = offset  # the least the true next offset can be (< offset only after U+FFFD)
        self.anchor = offset  # the newest offset known exactly (a chunk start)
        self.since_anchor = ""  # text delivered from `anchor` on (non-empty only after U+FFFD)
        self.replaying = False  # re-reading `since_anchor` after a re-attach from the anchor
        self.matched = 0  # characters of `since_anchor` the replay has repeated so far
        self.gaps: list[tuple[int, int]] = []
        self.rewound = True  # the next chunk may repeat bytes we have

    @property
    def resume_offset(self) -> int:
        """Where a re-attach must start so that no byte is skipped."""
        return self.anchor

    def take(self, offset: int, data: str) -> tuple[int, str] | None:
        """The new part of a chunk as (offset, text), or None if it brings nothing new."""
        if self.replaying or (self.rewound and self.since_anchor and offset == self.anchor):
            return self._take_replay(offset, data)
        if not self.rewound and self.low <= offset < self.offset:
            self._settle(offset)  # the last chunk ended here: its U+FFFD were single bytes
        if offset > self.offset:
            self.gaps.append((self.offset, offset))
            self._settle(offset)
        raw = data.encode()
        skip = self.offset - offset
        while skip < len(raw) and 0x80 <= raw[skip] <= 0xBF:
            skip += 1  # never start inside a character
        if skip >= len(raw):
            return None  # all of it was delivered before (or it is empty)
        self.rewound = False
        text = raw[skip:].decode() if skip else data
        start = offset + skip
        if self.since_anchor or skip:
            self.since_anchor += text
        else:
            self.anchor, self.since_anchor = offset, data
        self._advance(offset + len(raw))
        return start, text

    def _take_replay(self, offset: int, data: str) -> tuple[int, str] | None:
        """The agent re-reads from our anchor: the same bytes from the same character boundary
        decode to the same text, so it repeats `since_anchor` first. Matching is by text, and
        every chunk start (an exact offset) becomes the new anchor."""
        self.rewound = False
        if self.replaying and offset != self.anchor:
            # Chunks on one connection are contiguous: this one starts exactly where the text
            # matched so far ends.
            self.since_anchor = self.since_anchor[self.matched :]
            self.anchor, self.matched = offset, 0
        self.replaying = True
        rest = self.since_anchor[self.matched :]
        if rest.startswith(data):
            self.matched += len(data)
            return None
        if not data.startswith(rest):
            # Not what we had: the agent no longer retains those bytes. Take it as new.
            self.replaying = False
            self.gaps.append((self.anchor, offset))
            self.anchor, self.since_anchor = offset, data
            self._advance(offset + len(data.encode()))
            return offset, data
        text = data[len(rest) :]
        self.replaying, self.matched = False, 0
        self.since_anchor = data
        self._advance(offset + len(data.encode()))
        return self.offset - len(text.encode()), text

    def _settle(self, exact: int) -> None:
        self.offset = self.low = self.anchor = exact
        self.since_anchor = ""
        self.replaying, self.matched = False, 0

    def _advance(self, end: int) -> None:
        """`since_anchor` now runs from `anchor` to `end` (an upper bound when it holds
        U+FFFD, each of which may stand for 1 raw byte instead of 3)."""
        self.offset = end
        self.low = end - 2 * self.since_anchor.count("\ufffd")
        if self.low == end:
            self._settle(end)
