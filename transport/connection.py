"""A server-side trio-websocket connection that hands each message straight to its session.

Why: trio-websocket's reader task puts every complete message into a memory channel and the
session takes it out again; each `send` into the channel is a scheduler checkpoint, so the
reader hands over one message per scheduler round, however many a single socket read brought
(issue 6: per-message overhead, not the codec, bounds small-message throughput). Here the reader
calls the session's synchronous `on_message` for each message instead, so a burst of pipelined
requests is applied in one go and the reader checkpoints only once per socket read.

Everything else stays trio-websocket's: the handshake, close handshake, pings and pongs all go
through `WebSocketConnection` unchanged. The hook into its reader, and every other private name
of trio-websocket, goes through `transport/ws_private.py`.

What the override must keep, and how:
- A message split over several frames or reads is joined before it is delivered.
- The size limit is counted in bytes (PROTOCOL.md 1), also for text messages (trio-websocket
  counts characters), and checked as the parts arrive, so a too-big message is never held whole.
  From it on, nothing more is delivered: the sink's `on_too_big` decides when to close (1009).
- The reader never dies silently: a sink that raises gets the connection closed with 1011 and
  the failure logged (trio-websocket's reader would swallow a KeyError as an "unknown event").
- Agent-wide bytes: the parts of a message that arrives in several pieces are charged to the
  server's `MessageBytes` as they arrive (the reader waits while they would go past
  `max_message_bytes_in_flight`), and released once the message is applied or dropped.
- Backpressure: after each message the reader asks the sink whether it is backlogged, and if so
  waits for room before it reads on. The sink counts queued replies, not bytes: its output
  waits in per-call buffers and never counts, so a sender blocked on bulk output (the deadlock
  hazard of `transport/buffered.py`) never stops this reader, while a client that floods
  requests without reading replies cannot grow the queue without bound.

The channel trio-websocket would fill stays empty; it still closes when the connection does,
so `get_message()` remains the way to wait for the end of the connection.
"""

from __future__ import annotations

import logging
from typing import Protocol, cast

import trio
from trio_websocket import WebSocketRequest
from wsproto import ConnectionType, WSConnection
from wsproto.events import BytesMessage, TextMessage

from toolwire.transport import ws_private
from toolwire.transport.big_messages import BIG_MESSAGE_BYTES, PreparedMessage, join_parts
from toolwire.transport.message_bytes import MessageBytes

log = logging.getLogger("toolwire.server")

CLOSE_INTERNAL_ERROR = 1011

# A reader hands at most this many messages to its sink between two turns of the scheduler.
# One socket read can hold hundreds of small requests, each of which makes work for a chat
# task: applied in one go, a flood of 5,000 one-call chats put every chat of every other
# connection behind hundreds of those tasks at each of its steps (issue 27: another chat's
# trivial call waited 2.1 s). Yielding after a few keeps each connection to its share, at one
# checkpoint (microseconds) per this many messages.
FAIR_SHARE_MESSAGES = 16


class MessageSink(Protocol):
    """Where a connection's messages go (the server's `Session`)."""

    def on_message(self, message: str | bytes, prepared: PreparedMessage | None = None) -> None:
        """Apply one complete message (`prepared`: made ready by `prepare_big_message`); must
        not block and should not raise."""

    async def prepare_big_message(self, message: str | bytes) -> PreparedMessage:
        """Make a message of BIG_MESSAGE_BYTES or more ready off the event loop, or in small
        steps (`transport/big_messages.py`); the reader reads on only after it."""

    def on_too_big(self) -> None:
        """A message went over the size limit; nothing after it will be delivered."""

    def backlogged(self) -> bool:
        """True while the reader should stop reading (too many replies wait to be sent)."""

    async def wait_for_room(self) -> None:
        """Return once the sink is no longer backlogged (or is gone)."""


class DirectConnection(ws_private.MessageHookConnection):
    """A server connection whose messages go to a `MessageSink` instead of a channel."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        max_message_bytes: int,
        receive_buffer_size: int | None,
        message_bytes: MessageBytes | None = None,
    ) -> None:
        super().__init__(
            stream,
            WSConnection(ConnectionType.SERVER),
            message_queue_size=0,
            max_message_size=max_message_bytes,
            receive_buffer_size=receive_buffer_size,
        )
        self._max_message_bytes = max_message_bytes
        self._sink: MessageSink | None = None
        # Set once a sink attached; a message that arrives before waits for it (a client may
        # send requests right behind its handshake, before the session exists).
        self._sink_attached = trio.Event()
        # After a too-big message, a failure, or the session's end: drop every message.
        self._refusing = False
        self._parts: list[str | bytes] = []
        self._parts_bytes = 0
        self._message_bytes = message_bytes
        self._applied_since_yield = 0

    @property
    def refusing(self) -> bool:
        """Messages are dropped from now on (too big, a failure, or the session ended)."""
        return self._refusing

    def drop_partial(self) -> None:
        """Forget the message being assembled, and free its bytes (agent-wide)."""
        self._parts = []
        self._parts_bytes = 0
        if self._message_bytes is not None:
            self._message_bytes.release(self)

    def attach(self, sink: MessageSink) -> None:
        self._sink = sink
        self._sink_attached.set()

    def detach(self) -> None:
        """The session ended: messages still arriving are dropped, not applied."""
        self._refusing = True
        self._sink = None
        self._sink_attached.set()
        self.drop_partial()

    async def on_message_event(self, event: BytesMessage | TextMessage) -> None:
        if self._refusing or ws_private.close_reason(self) is not None:
            # Once this side started closing, trio-websocket discards what still arrives.
            return
        data: str | bytes | bytearray = event.data
        if isinstance(data, bytearray):  # wsproto's type allows it; wsproto 1.3 gives bytes
            data = bytes(data)
        # Bytes, exactly: an ASCII str (the common case, checked in O(1)) is one byte a char.
        size = self._parts_bytes + (
            len(data) if isinstance(data, bytes) or data.isascii() else len(data.encode())
        )
        if size > self._max_message_bytes:
            self._refusing = True
            self.drop_partial()
            sink = await self._wait_for_sink()
            if sink is not None:
                sink.on_too_big()
            return
        gate = self._message_bytes
        if gate is not None and (self._parts or not event.message_finished):
            # A message in pieces: this piece waits for room before the reader reads on.
            await gate.take(self, size - self._parts_bytes)
            if self.refusing:
                self.drop_partial()  # the session ended while it waited
                return
        else:
            gate = None  # a message whole in one piece charged nothing: nothing to release
        if not event.message_finished:
            self._parts.append(data)
            self._parts_bytes = size
            return
        message: str | bytes
        big = size >= BIG_MESSAGE_BYTES
        if self._parts:
            self._parts.append(data)
            parts, self._parts = self._parts, []
            self._parts_bytes = 0
            # wsproto never mixes text and binary parts within one message.
            if isinstance(data, bytes):
                binary = cast("list[bytes]", parts)
                message = await join_parts(binary) if big else b"".join(binary)
            else:
                message = "".join(cast("list[str]", parts))  # str.join keeps the GIL
        else:
            message = data
        sink = self._sink
        if sink is None:
            sink = await self._wait_for_sink()
            if sink is None:
                self.drop_partial()
                return
        try:
            prepared = await sink.prepare_big_message(message) if big else None
            if self._refusing or self._sink is not sink:
                return  # the session ended while the message was made ready
            sink.on_message(message, prepared)
            backlogged = sink.backlogged()
        except Exception:
            log.exception("connection %s: applying a message failed; closing it", self)
            await self._fail()
            return
        finally:
            if gate is not None:
                gate.release(self)
        if backlogged:
            await sink.wait_for_room()
        self._applied_since_yield += 1
        if self._applied_since_yield >= FAIR_SHARE_MESSAGES:
            self._applied_since_yield = 0
            await trio.lowlevel.checkpoint()

    async def _wait_for_sink(self) -> MessageSink | None:
        if not self._sink_attached.is_set():
            await self._sink_attached.wait()
        return self._sink

    async def _fail(self) -> None:
        # Like trio-websocket's own 1009 path: this runs in the reader task, so it must not
        # wait for the close handshake (only this task could complete it).
        self._refusing = True
        await ws_private.close_from_reader(self, CLOSE_INTERNAL_ERROR, "internal error")


async def open_server_connection(
    nursery: trio.Nursery,
    stream: trio.abc.Stream,
    *,
    max_message_bytes: int,
    receive_buffer_size: int | None,
    message_bytes: MessageBytes | None = None,
) -> tuple[DirectConnection, WebSocketRequest]:
    """trio-websocket's `wrap_server_stream`, building a `DirectConnection`: start its reader in
    `nursery` and wait for the client's handshake request."""
    connection = DirectConnection(
        stream,
        max_message_bytes=max_message_bytes,
        receive_buffer_size=receive_buffer_size,
        message_bytes=message_bytes,
    )
    ws_private.start_reader(nursery, connection)
    request = await ws_private.wait_for_request(connection)
    return connection, request
