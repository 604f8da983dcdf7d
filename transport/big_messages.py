"""A big message (a `write_file` of 16 MiB) made ready off the event loop, or in small steps.

What a message costs before a chat sees it grows with its size, and on the event loop every
other chat and connection of the agent waits for it (issue 26: other chats' trivial calls at a
p99 of 46 ms during 16 MiB edits). Measured for a message of 16 MiB here:

- joining the frame's parts: one copy; `bytes.join` releases the GIL for big buffers, so it
  runs on a worker thread (`join_parts`);
- the bounds pre-scan (`transport/bounds.py`): 15-20 ms of C for MessagePack in one go, scanned
  here in pieces with a checkpoint between them (C that holds the GIL gains nothing on a
  thread: the loop would wait for the GIL instead);
- the decode itself: 2-9 ms, the one step left whole (msgspec holds the GIL and cannot resume a
  decode; it copies the content into one `str`, which must exist);
- the args fingerprint (`actors/records.py`): 20-30 ms, of which 4-5 ms encoding and the rest
  BLAKE2b, which releases the GIL. It runs on a worker thread, in pieces
  (`args_fingerprint_in_pieces`), so the GIL is held for one piece's encoding at a time, and
  goes to the chat with the call (`CallSpec.args_fingerprint`), which then does not compute it.

These steps, and the join before them, run for one big message at a time, agent-wide
(`ONE_BIG_MESSAGE`): more at once would not go faster, and each holds the loop or the GIL in
turns with every other chat.

A connection's messages stay in order: its reader awaits these steps before it reads on, while
every other connection's reader and every chat go on. Below `BIG_MESSAGE_BYTES` a message is
decoded and applied in one synchronous step, as before: a thread hop costs some 50 µs here,
more than a small message costs in all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio

from toolwire.actors.records import args_fingerprint_in_pieces
from toolwire.transport import protocol
from toolwire.transport.bounds import may_exceed_bounds_in_pieces
from toolwire.transport.codec import Codec, MessageError

# 1 MiB: the fingerprint of a message this big takes about 1.5 ms on the loop, its pre-scan
# 1 ms, the thread hop 0.05 ms; below it the whole message costs the loop about a millisecond,
# which stays inside the 5 ms a p99 of the loop's lag is allowed (issue 26).
BIG_MESSAGE_BYTES = 1024 * 1024

# One big message is made ready at a time, whatever the connections, on the loop as on a worker
# thread. On the loop: every reader whose message is being pre-scanned runs one piece per round
# of the scheduler, and the decodes of those that got there run back to back, so that twenty of
# them (20 concurrent 16 MiB messages) held it for twenty pieces or decodes in a row before any
# other task ran. On a worker thread: the steps there (the join's copy, the fingerprint's
# encoding of each piece) hold the GIL in turns with the loop, and the loop waited behind each
# thread that wanted it. Measured with a 1 ms ticker in the agent's loop during that attack,
# alternated: with the threads one at a time the loop's worst lag went from 14-34 ms (once 205
# ms) to 11-19 ms (7 runs each, one core busy); with the whole of it one message at a time, on
# a machine loaded to 4-6 by other work, 19-129 ms against 41-222 ms for the tree before and
# 41-324 ms with the threads alone gated (4 runs each), and never above 20 ms in the quietest
# round. More at once would not go faster: one loop, one GIL.
ONE_BIG_MESSAGE = trio.Lock()


@dataclass(frozen=True)
class PreparedMessage:
    """A big message decoded (or the error it gets), with each call's args fingerprint: one
    for a `call`, one per call of a `turn` (None where it could not be computed: the chat
    then computes it itself and fails the same way)."""

    message: Any | None
    error: MessageError | None
    fingerprints: tuple[bytes | None, ...] | None = None


async def join_parts(parts: list[bytes]) -> bytes:
    """`b"".join(parts)` on a worker thread, after the big messages that came first
    (`ONE_BIG_MESSAGE`): the copy runs without the GIL."""
    async with ONE_BIG_MESSAGE:
        return await trio.to_thread.run_sync(b"".join, parts)


async def prepare(codec: Codec, frame: str | bytes) -> PreparedMessage:
    """`frame` decoded, its bounds checked and its calls' fingerprints taken, after the big
    messages of other connections that came first (`ONE_BIG_MESSAGE`)."""
    async with ONE_BIG_MESSAGE:
        return await _prepare(codec, frame)


async def _prepare(codec: Codec, frame: str | bytes) -> PreparedMessage:
    answer: bool | None = None
    for answer in may_exceed_bounds_in_pieces(frame):
        if answer is None:
            await trio.lowlevel.checkpoint()
    try:
        message = codec.decode(frame, may_exceed=answer)
    except MessageError as exc:
        return PreparedMessage(None, exc)
    if isinstance(message, protocol.Call | protocol.Turn):
        await trio.lowlevel.checkpoint()  # the decode was one step: let the loop run
        fingerprints = await trio.to_thread.run_sync(_fingerprints, message)
        return PreparedMessage(message, None, fingerprints)
    return PreparedMessage(message, None)


def _fingerprints(message: protocol.Call | protocol.Turn) -> tuple[bytes | None, ...]:
    calls = [message] if isinstance(message, protocol.Call) else message.calls
    return tuple(_fingerprint(call.tool, call.args) for call in calls)


def _fingerprint(tool: str, args: Any) -> bytes | None:
    try:
        return args_fingerprint_in_pieces(tool, args)
    except Exception:  # the chat computes it again and refuses the call with its own error
        return None
