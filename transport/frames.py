"""WebSocket data frames as a server sends them (RFC 6455 section 5.2), for the session's sender.

Why not wsproto's `send`: per message it builds an event object, copies the payload several
times (into a bytearray, then header + payload) and, for a text message, needs a str that it
encodes again, while msgspec already produced the UTF-8 bytes. Here a payload is never copied:
its header and it go to the socket side by side in one `writev` (`WriteBufferedStream.send_parts`),
which matters for 256 KiB output messages. A server's data frame is simple: FIN set,
no RSV bits (this server negotiates no extension), unmasked, the length in 7, 16 or 64 bits.
Pure: no trio, no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

# The first byte: FIN plus the opcode.
TEXT = 0x80 | 0x1
BINARY = 0x80 | 0x2

# Lengths up to 125 fit in the second byte; 126 and 127 announce a 16- or 64-bit length.
_MAX_SHORT = 125
_MAX_16 = 0xFFFF
_HEAD_16 = struct.Struct("!BBH")
_HEAD_64 = struct.Struct("!BBQ")


def frame_header(first: int, length: int) -> bytes:
    """The header of one unmasked, final frame of `length` payload bytes."""
    if length <= _MAX_SHORT:
        return bytes((first, length))
    if length <= _MAX_16:
        return _HEAD_16.pack(first, 126, length)
    return _HEAD_64.pack(first, 127, length)


def frame_parts(first: int, payloads: Iterable[bytes]) -> list[bytes]:
    """One frame per payload (each a whole message), all of one opcode: header, payload, header,
    payload... as separate buffers, for one `writev`. A text payload must be valid UTF-8
    (msgspec's JSON always is)."""
    parts: list[bytes] = []
    for payload in payloads:
        parts.append(frame_header(first, len(payload)))
        parts.append(payload)
    return parts
