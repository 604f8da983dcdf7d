"""The trio shell of the client, on trio-websocket: `connect` and `Client`.

It owns the socket and nothing else: open TCP (and TLS), the WebSocket handshake and the
`welcome`, a reader that feeds each frame to `ClientState.receive`, a keepalive, the
resubscribe pass after each connect, and the reconnect loop, which waits the delay
`ClientState.after_loss` gives. Every decision is `ClientState`'s (state.py).

Handshake rejections (HTTP 400/401/403/404) raise `ConnectError` and are never retried. The
client closes its TCP stream itself after every connection: trio-websocket leaves it open after
a close by the peer, a rejected handshake or a 1009.
"""

from __future__ import annotations

import contextlib
import logging
import math
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final, Literal

import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    wrap_client_stream,
)

from toolwire.transport import protocol
from toolwire.transport.client.api import ClientAPI
from toolwire.transport.client.errors import BadWelcome, ConnectError, ConnectionLost
from toolwire.transport.client.trio_runtime import TrioRuntime
from toolwire.transport.codec import Encoding, MessageError

__all__ = ["CLOSE_TIMEOUT_S", "CONNECT_TIMEOUT_S", "PING_INTERVAL_S", "Client", "connect"]

log = logging.getLogger("toolwire.client")

# The largest message we accept from the agent, in characters or bytes as trio-websocket counts.
# The agent's own output chunks are at most 256 KiB (128 KiB on JSON), but a `turn_result`
# carries up to 64 KiB of output per call, so a big turn is a few MiB; 256 MiB only guards
# against a broken peer. It must stay far above anything a sane agent sends: a 1009 here would
# make the client reconnect, re-attach, and receive the same message again.
MAX_INCOMING_MESSAGE_BYTES: Final = 256 * 1024 * 1024
# Messages trio-websocket queues between its reader and ours. Our reader never blocks (it only
# hands frames to ClientState), so this only absorbs scheduling jitter; it must be > 1 so a
# busy reader does not stop trio-websocket from answering the agent's pings.
MESSAGE_QUEUE_SIZE: Final = 256
# Bytes per socket read: 64 KiB, as the server, roughly doubles bulk-output throughput.
RECEIVE_BUFFER_BYTES: Final = 64 * 1024
# TCP connect + HTTP upgrade + `welcome` must finish within this; a peer that accepts TCP and
# then says nothing would otherwise hang a reconnect forever (trio-websocket has no timeout here).
CONNECT_TIMEOUT_S: Final = 10.0
# We ping the agent too (it pings every 20 s): without it, a silently vanished agent (a cut
# network, a frozen VM) is noticed only when TCP gives up, which takes minutes to hours. Two
# missed intervals, as the server, then the connection counts as lost and we reconnect.
PING_INTERVAL_S: Final = 20.0
# A graceful close (close frame and its answer) gets this long; then the stream is just closed.
CLOSE_TIMEOUT_S: Final = 1.0

# Failures of one connection attempt or of an established connection: reconnecting may help.
_CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    HandshakeError,
    ConnectionClosed,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
    BadWelcome,
)


class Client(ClientAPI):
    """A connection to one agent, on trio. Make it with `connect(...)` (which is
    `Client(...).open()`); see api.py."""

    def __init__(
        self,
        url: str,
        token: str | None,
        encoding: Encoding = "json",
        *,
        reconnect: bool = True,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        ping_interval_s: float | None = PING_INTERVAL_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(
            url,
            token,
            encoding,
            trio.Event,
            reconnect=reconnect,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            ssl_context=ssl_context,
            runtime=TrioRuntime(),
        )
        auth = self._authorization
        self._headers = [(b"authorization", auth.encode())] if auth is not None else []
        self._connect_timeout_s = connect_timeout_s
        self._ping_interval_s = ping_interval_s
        self._ws: WebSocketConnection | None = None
        self._stream: trio.abc.Stream | None = None
        self._nursery: trio.Nursery | None = None
        self._opened = False

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Client]:
        """Connect, and run the connection (reader, keepalive, reconnects) until the block
        ends, then close: what `connect` does with a new Client, with the same errors. A Client
        opens once (RuntimeError on a second `open`): for a new connection make a new one."""
        if self._opened:
            raise RuntimeError("this Client was opened already; make a new one to connect again")
        self._opened = True
        failed: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._run)
                await self._state.first_settled.wait()
                if self.connections == 0:
                    failed = self._state.fatal
                    nursery.cancel_scope.cancel()
                else:
                    try:
                        yield self
                    finally:
                        await self.aclose()
        except BaseExceptionGroup as group:
            # The nursery wraps whatever the caller's block raised; hand back the caller's own
            # exception when it is the only one, as a plain `async with` would.
            single = _single_leaf(group)
            if single is None:
                raise
            raise single from single.__cause__
        if failed is not None:
            raise failed

    async def aclose(self) -> None:
        """Close the connection and stop. Calls on the agent go on; every waiting request and
        unfinished handle of this client fails with ConnectionLost."""
        if not self._state.begin_close():
            return
        ws, stream = self._ws, self._stream
        if ws is not None and stream is not None:
            if trio.current_effective_deadline() == -math.inf:
                # We are being cancelled, and so is trio-websocket's reader, which would have
                # to receive the agent's answer to a close frame: just drop the connection.
                await trio.aclose_forcefully(stream)
            else:
                with trio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                    await ws.aclose()
        self._state.fail_all(ConnectionLost("the client was closed"))
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _send_frame(self, frame: str | bytes) -> None:
        ws = self._ws
        if ws is None:
            return
        # On failure the reader sees the loss; the request is re-sent or failed after it.
        with contextlib.suppress(
            ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError
        ):
            await ws.send_message(frame)

    # -- connections --------------------------------------------------------------------------

    async def _run(self) -> None:
        """Connect, read until the connection is lost, reconnect after the state's delay."""
        attempt = 0
        while True:
            before = self._state.connections
            failure: BaseException | None = None
            try:
                await self._session()
            except* ConnectionRejected as group:
                rejected = _leaf(group)
                assert isinstance(rejected, ConnectionRejected)
                failure = ConnectError(rejected.status_code, rejected.body or b"")
            except* _CONNECTION_ERRORS as group:
                failure = _leaf(group)
            plan = self._state.after_loss(failure, before, attempt)
            if plan is None:
                return
            delay, attempt = plan
            await trio.sleep(delay)

    async def _session(self) -> None:
        """One connection, from TCP connect to close. The stream is always closed here."""
        with trio.fail_after(self._connect_timeout_s):
            stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]
            if self._ssl is None:
                stream = await trio.open_tcp_stream(self._host, self._port)
            else:
                stream = await trio.open_ssl_over_tcp_stream(
                    self._host, self._port, ssl_context=self._ssl, https_compatible=True
                )
        try:
            async with trio.open_nursery() as nursery:  # trio-websocket's reader lives here
                with trio.fail_after(self._connect_timeout_s):
                    ws = await wrap_client_stream(
                        nursery,
                        stream,
                        self._host_header,
                        self._resource,
                        subprotocols=[self._subprotocol],
                        extra_headers=self._headers,
                        message_queue_size=MESSAGE_QUEUE_SIZE,
                        max_message_size=MAX_INCOMING_MESSAGE_BYTES,
                        receive_buffer_size=RECEIVE_BUFFER_BYTES,
                    )
                    welcome = await self._receive_welcome(ws)
                self._ws, self._stream = ws, stream
                gen = self._state.on_connected(welcome)
                async with trio.open_nursery() as helpers:
                    helpers.start_soon(self._resubscribe, gen)
                    if self._ping_interval_s:
                        helpers.start_soon(self._keepalive, ws, stream, self._ping_interval_s)
                    await self._read(ws)
                    self._disconnected(stream)
                    helpers.cancel_scope.cancel()
                # Let trio-websocket's reader finish a close handshake in progress (ours, from
                # aclose, or the peer's), but not wait on a peer that went silent.
                nursery.cancel_scope.deadline = trio.current_time() + CLOSE_TIMEOUT_S
        finally:
            self._disconnected(stream)
            # trio-websocket does not close its stream after a close by the peer, a rejected
            # handshake or a 1009: without this, every reconnect would leak a socket.
            await trio.aclose_forcefully(stream)

    def _disconnected(self, stream: trio.abc.Stream) -> None:
        if self._stream is not stream:
            return  # not connected on this stream, or already handled
        self._ws = self._stream = None
        self._state.on_disconnected()

    async def _receive_welcome(self, ws: WebSocketConnection) -> protocol.Welcome:
        frame = await ws.get_message()
        try:
            message = self._state.codec.decode(frame)
        except MessageError as exc:
            raise BadWelcome(f"undecodable first message: {exc}") from None
        if not isinstance(message, protocol.Welcome):
            raise BadWelcome(f"expected welcome, got {type(message).__name__}")
        return message

    async def _read(self, ws: WebSocketConnection) -> None:
        receive = self._state.receive
        while True:
            try:
                frame = await ws.get_message()
            except ConnectionClosed as exc:
                log.debug("connection closed: %s", exc.reason)
                return
            receive(frame)

    async def _keepalive(
        self, ws: WebSocketConnection, stream: trio.abc.Stream, interval: float
    ) -> None:
        while True:
            await trio.sleep(interval)
            try:
                with trio.move_on_after(2 * interval) as scope:
                    await ws.ping()
            except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if scope.cancelled_caught:
                log.warning("the agent missed two pongs; dropping the connection")
                await trio.aclose_forcefully(stream)
                return


def _leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first non-group exception of a (nested) exception group."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _single_leaf(group: BaseExceptionGroup[Any]) -> BaseException | None:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc


@asynccontextmanager
async def connect(
    url: str,
    token: str | None,
    encoding: Literal["json", "msgpack"] = "json",
    *,
    reconnect: bool = True,
    backoff_initial_s: float = 0.1,
    backoff_max_s: float = 5.0,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ping_interval_s: float | None = PING_INTERVAL_S,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[Client]:
    """Connect to an agent at `ws://HOST:PORT/v1` and yield a `Client`.

    Sends `Authorization: Bearer <token>` (no header when token is None, for
    `--insecure-no-auth` agents) and offers exactly one subprotocol, the one of `encoding`.
    The first connect raises ConnectError at once, never retried: with the HTTP status when the
    handshake was rejected, with status None when the agent could not be reached. Later losses
    reconnect (`reconnect=True`) after `backoff_initial_s`, doubling up to `backoff_max_s`,
    each delay scaled by a random factor in [0.5, 1] (jitter).
    """
    client = Client(
        url,
        token,
        encoding,
        reconnect=reconnect,
        backoff_initial_s=backoff_initial_s,
        backoff_max_s=backoff_max_s,
        connect_timeout_s=connect_timeout_s,
        ping_interval_s=ping_interval_s,
        ssl_context=ssl_context,
    )
    async with client.open():
        yield client
