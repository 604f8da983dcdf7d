"""Every use of trio-websocket's private surface, in one place.

The server keeps trio-websocket for its handshake, close handshake, pings and pongs, but takes
two shortcuts through its internals on the hot path (issue 6: per-message overhead bounds
small-message throughput): messages go straight from the reader task to the session instead of
through a memory channel (`transport/connection.py`), and a batch of replies is written as one
write under the connection's send lock (`transport/server.py`, `BatchWriter`). No other module
touches a private name of trio-websocket; they call the functions below.

The private names used, and why (`PRIVATE_SURFACE` below lists the same names with the shape
each must have; tests/test_ws_private.py checks the installed trio-websocket against it, so a
release that drops or changes one fails that test, naming the name, instead of a connection):

- `WebSocketConnection._handle_message_event(self, event)`: overridden (`MessageHookConnection`)
  so that the reader hands each complete message to the session synchronously.
- `WebSocketConnection._reader_task(self)`: started in the caller's nursery, as
  `wrap_server_stream` does, for a connection class of our own (`start_reader`).
- `WebSocketConnection._get_request(self)`: waits for the client's handshake request, as
  `wrap_server_stream` does (`wait_for_request`).
- `WebSocketConnection._close_reason`: set once the connection is closing or closed; read to
  refuse sends and to raise `ConnectionClosed` with the reason, set when we close with 1011
  from inside the reader task (`close_reason`, `close_from_reader`).
- `WebSocketConnection._send(self, event)`: sends one wsproto event (our 1011 close frame) under
  the send lock (`close_from_reader`).
- `WebSocketConnection._recv_channel`: the message channel, closed after our 1011 so that
  `get_message()` ends, as trio-websocket does after its own 1009 (`close_from_reader`).
- `WebSocketConnection._wsproto`: the wsproto connection, whose state says whether a data frame
  may still go out (`is_open`).
- `WebSocketConnection._stream_lock`: the lock every frame of the connection is written under,
  so that our batched frames never interleave with a pong or a close (`send_lock`).

pyproject.toml allows the trio-websocket releases whose private surface was checked to match
(0.12.0 to 0.12.2 have identical code for all of the above); a new minor release needs the test
run and the range widened on purpose.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import trio
from trio_websocket import CloseReason, WebSocketConnection, WebSocketRequest
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import BytesMessage, CloseConnection, TextMessage

__all__ = [
    "PRIVATE_SURFACE",
    "MessageHookConnection",
    "PrivateName",
    "check_private_surface",
    "close_from_reader",
    "close_reason",
    "is_open",
    "send_lock",
    "start_reader",
    "wait_for_request",
]


@dataclass(frozen=True)
class PrivateName:
    """One private name of `WebSocketConnection` and the shape we rely on."""

    name: str
    # For a method: its parameters after self, and that it is a coroutine function.
    parameters: tuple[str, ...] | None = None
    # For an attribute set in __init__: the type its value must have on a new connection
    # (None: the attribute must exist and be None until the connection closes).
    attribute_type: type | None = None
    is_attribute: bool = False


PRIVATE_SURFACE: tuple[PrivateName, ...] = (
    PrivateName("_handle_message_event", parameters=("event",)),
    PrivateName("_reader_task", parameters=()),
    PrivateName("_get_request", parameters=()),
    PrivateName("_send", parameters=("event",)),
    PrivateName("_close_reason", is_attribute=True),
    PrivateName("_recv_channel", attribute_type=trio.MemoryReceiveChannel, is_attribute=True),
    PrivateName("_wsproto", attribute_type=WSConnection, is_attribute=True),
    PrivateName("_stream_lock", attribute_type=trio.StrictFIFOLock, is_attribute=True),
)


def check_private_surface(
    stream: trio.abc.Stream,
    connection_class: type[WebSocketConnection] = WebSocketConnection,
) -> list[str]:
    """What of `PRIVATE_SURFACE` the installed trio-websocket lacks or has changed, one line
    per problem naming the name (empty when everything matches). `stream` is what a new
    connection is made on to look at its attributes (nothing is sent on it): a parameter, so
    that `toolwire serve` never imports `trio.testing` for a check only the tests run."""
    problems: list[str] = []
    connection = connection_class(stream, WSConnection(ConnectionType.SERVER))
    for private in PRIVATE_SURFACE:
        where = f"trio_websocket.WebSocketConnection.{private.name}"
        if private.is_attribute:
            if not hasattr(connection, private.name):
                problems.append(f"{where}: no such attribute on a new connection")
                continue
            value = getattr(connection, private.name)
            expected = private.attribute_type
            if expected is None and value is not None:
                problems.append(f"{where}: expected None on an open connection, got {value!r}")
            elif expected is not None and not isinstance(value, expected):
                problems.append(
                    f"{where}: expected a {expected.__name__}, got {type(value).__name__}"
                )
            continue
        method = getattr(connection_class, private.name, None)
        if method is None:
            problems.append(f"{where}: no such method")
            continue
        if not inspect.iscoroutinefunction(method):
            problems.append(f"{where}: no longer a coroutine function")
        names = tuple(inspect.signature(method).parameters)[1:]
        if names != private.parameters:
            problems.append(f"{where}: parameters {names}, expected {private.parameters}")
    # The override only works while the reader task is what calls the hook.
    reader = getattr(connection_class, "_reader_task", None)
    reader_source = inspect.getsource(reader) if reader is not None else ""
    if reader is not None and "_handle_message_event" not in reader_source:
        problems.append(
            "trio_websocket.WebSocketConnection._reader_task: no longer calls "
            "_handle_message_event, so MessageHookConnection's override would never run"
        )
    return problems


class MessageHookConnection(WebSocketConnection):
    """A `WebSocketConnection` whose reader hands each message event to `on_message_event`
    instead of queueing the message in its channel."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The subclass's method becomes the reader's hook itself: no extra coroutine per message.
        cls._handle_message_event = cls.on_message_event  # type: ignore[method-assign,assignment]

    async def on_message_event(self, event: BytesMessage | TextMessage) -> None:
        raise NotImplementedError


def start_reader(nursery: trio.Nursery, connection: WebSocketConnection) -> None:
    """Start the connection's reader task in `nursery` (as `wrap_server_stream` does)."""
    nursery.start_soon(connection._reader_task)


async def wait_for_request(connection: WebSocketConnection) -> WebSocketRequest:
    """The client's handshake request, once the reader has received it."""
    return await connection._get_request()


def close_reason(connection: WebSocketConnection) -> CloseReason | None:
    """Why the connection is closing or closed; None while it is open."""
    reason: CloseReason | None = connection._close_reason
    return reason


def is_open(connection: WebSocketConnection) -> bool:
    """Whether a data frame may still be sent (no close frame has gone out or come in)."""
    state: Any = connection._wsproto.state
    return bool(state is ConnectionState.OPEN)


def send_lock(connection: WebSocketConnection) -> trio.StrictFIFOLock:
    """The lock each frame of the connection is written under (pongs and close included)."""
    lock: trio.StrictFIFOLock = connection._stream_lock
    return lock


async def close_from_reader(connection: WebSocketConnection, code: int, reason: str) -> None:
    """Close from inside the reader task, as trio-websocket's own 1009 path does: send the close
    frame and end `get_message()`, without waiting for the close handshake (only the reader
    task, which is calling this, could complete it)."""
    if connection._close_reason is None:
        connection._close_reason = CloseReason(code, reason)
        await connection._send(CloseConnection(code=code, reason=reason))
    await connection._recv_channel.aclose()
