"""The value bounds of PROTOCOL.md 9.9, checked once, at decode: integers that MessagePack can
carry and a nesting depth that no recursive code of ours (or of the journal's encoder) can trip
over. Pure: no I/O.

A value past these bounds must be refused before anything acts on it: an integer of 2**64 in a
call's args reached the journal's MessagePack encoder after the call was accepted and killed the
agent, and a frame nested 1,000 deep raised RecursionError inside the decoder.

Checking every decoded value in Python would cost several times msgspec's own typed decode, so
`may_exceed_bounds` first asks a question that C answers at memory speed: could this frame hold
a value out of bounds at all? A frame with at most `MAX_NESTING_DEPTH` container openers cannot
nest deeper than that, and a JSON frame with no run of `LONG_DIGIT_RUN` digits cannot spell an
integer out of range. Only a frame that fails that test is decoded generically and walked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

# What MessagePack can carry: int64 at the bottom, uint64 at the top. The journal stores values
# as MessagePack, and a JSON client could otherwise send a value no msgpack client could.
MIN_WIRE_INT: Final = -(2**63)
MAX_WIRE_INT: Final = 2**64 - 1

# Objects and arrays nest at most this deep, the message object itself counting as level 1.
# Tool arguments are shallow (the deepest, `edit_files`, is 5 levels); 64 leaves room for any
# real use and stays far below Python's recursion limit (1,000), which msgspec and every
# recursive walk of ours would hit first. JSON libraries pick similar bounds: Rust's serde_json
# stops at 128, Go's encoding/json at 10,000, Python's json module at the recursion limit.
MAX_NESTING_DEPTH: Final = 64
TOO_DEEP: Final = f"objects and arrays nest deeper than {MAX_NESTING_DEPTH} levels"

# An integer of at most 18 digits is below 10**18 < 2**63, so it is in range whatever its sign;
# only a frame with a run of 19 or more digits can hold one that is not.
LONG_DIGIT_RUN: Final = 19
_LONG_DIGITS: Final = re.compile(f"[0-9]{{{LONG_DIGIT_RUN}}}")

# Every MessagePack byte that can open a container (fixmap, fixarray, array16/32, map16/32).
# Counting these overestimates the containers (string and integer bytes may match), which only
# sends a few more frames down the exact path.
_MSGPACK_OPENERS: Final = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_NOT_MSGPACK_OPENERS: Final = bytes(b for b in range(256) if b not in _MSGPACK_OPENERS)


class BoundsError(ValueError):
    """A value out of the bounds of PROTOCOL.md 9.9; `path` is where (`$.args.z`)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(f"{message} - at `{path}`")
        self.path = path


def may_exceed_bounds(frame: str | bytes) -> bool:
    """False when `frame` certainly holds no value out of bounds; True when it may."""
    if isinstance(frame, str):
        openers = frame.count("{") + frame.count("[")
        return openers > MAX_NESTING_DEPTH or _has_long_digit_run(frame)
    openers = len(frame.translate(None, _NOT_MSGPACK_OPENERS))
    return openers > MAX_NESTING_DEPTH


# `may_exceed_bounds_in_pieces` scans this many bytes (or characters) at a time: some 0.5 ms of
# C here for MessagePack, where one scan of a 16 MiB frame holds the event loop 15-20 ms.
SCAN_PIECE: Final = 256 * 1024


def may_exceed_bounds_in_pieces(
    frame: str | bytes, piece: int = SCAN_PIECE
) -> Iterator[bool | None]:
    """`may_exceed_bounds(frame)`, the same answer, scanned `piece` at a time: yields None after
    each piece but the last, then the answer. The caller (the server, for a big frame) lets
    its event loop run between pieces, so no other chat waits for the whole scan."""
    if isinstance(frame, str):
        openers = 0
        # A run of digits may cross a cut: each piece is searched with the LONG_DIGIT_RUN - 1
        # characters before it, so every run of LONG_DIGIT_RUN lies whole in one window.
        for start in range(0, len(frame), piece):
            part = frame[start : start + piece]
            openers += part.count("{") + part.count("[")
            window = frame[max(0, start - LONG_DIGIT_RUN + 1) : start + piece]
            if openers > MAX_NESTING_DEPTH or _has_long_digit_run(window):
                yield True
                return
            if start + piece < len(frame):
                yield None
        yield False
        return
    openers = 0
    for start in range(0, len(frame), piece):
        openers += len(frame[start : start + piece].translate(None, _NOT_MSGPACK_OPENERS))
        if openers > MAX_NESTING_DEPTH:
            yield True
            return
        if start + piece < len(frame):
            yield None
    yield False


# Every ASCII digit byte to "1", every other byte to "0": a run of digits of a text is then a
# run of "1" in its UTF-8 bytes (no byte of a multi-byte character is an ASCII digit).
_DIGIT_BYTES: Final = bytes(0x31 if 0x30 <= b <= 0x39 else 0x30 for b in range(256))
_LONG_RUN_OF_ONES: Final = b"1" * LONG_DIGIT_RUN


def _has_long_digit_run(text: str) -> bool:
    """`_LONG_DIGITS.search(text) is not None`, at memory speed: the regular expression takes
    some 70 ns a character (0.4 s for a 16 MiB frame), this some 2."""
    data = text.encode("utf-8", "surrogatepass")
    return data.translate(_DIGIT_BYTES).find(_LONG_RUN_OF_ONES) != -1


def check_bounds(value: Any, path: str = "$", depth: int = 1) -> None:
    """Raise BoundsError for the first integer out of range or container nested too deep in a
    generically decoded value (dicts, lists, scalars); `depth` is the level of `value`."""
    if isinstance(value, dict | list):
        if depth > MAX_NESTING_DEPTH:
            raise BoundsError(TOO_DEEP, path)
        if isinstance(value, dict):
            for key, item in value.items():
                check_bounds(item, f"{path}.{key}", depth + 1)
        else:
            for index, item in enumerate(value):
                check_bounds(item, f"{path}[{index}]", depth + 1)
    elif (
        isinstance(value, int)
        and not isinstance(value, bool)
        and not MIN_WIRE_INT <= value <= MAX_WIRE_INT
    ):
        raise BoundsError(
            "integer out of range [-2**63, 2**64 - 1] (what MessagePack can carry)", path
        )
