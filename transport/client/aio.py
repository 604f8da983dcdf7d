"""The asyncio shell of the client, on the `websockets` library: `connect` and `Client`.

The same API as the trio shell (api.py), for chat servers on asyncio (FastAPI, Starlette,
aiohttp): `pip install 'toolwire[asyncio]'`, then

    from toolwire.aio import connect

    async with connect("ws://127.0.0.1:7411/v1", token) as client:
        handle = await client.call(chat_id, call_id, "execute", {"command": "make test"})
        result = await handle.result()

Like session.py it owns only the socket: `websockets` does the handshake, the close handshake
and the keepalive (a ping every `ping_interval_s`; a pong missing for two intervals drops the
connection); a reader task feeds each frame to `ClientState.receive`; the reconnect loop waits
the delay `ClientState.after_loss` gives. Every decision is `ClientState`'s (state.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final, Literal

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as open_websocket
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from toolwire.transport import protocol
from toolwire.transport.client.aio_runtime import AsyncioRuntime
from toolwire.transport.client.api import ClientAPI
from toolwire.transport.client.errors import BadWelcome, ConnectError, ConnectionLost
from toolwire.transport.client.session import (
    CLOSE_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    MAX_INCOMING_MESSAGE_BYTES,
    PING_INTERVAL_S,
)
from toolwire.transport.codec import Encoding, MessageError

__all__ = ["Client", "connect"]

log = logging.getLogger("toolwire.client")

# Frames `websockets` buffers before it stops reading the socket. Our reader never blocks (it
# only hands frames to ClientState), so this only absorbs scheduling jitter, as the trio shell's
# message queue does.
MAX_QUEUED_FRAMES: Final = 256

# Failures of one connection attempt or of an established connection: reconnecting may help.
_CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    InvalidHandshake,
    ConnectionClosed,
    TimeoutError,
    BadWelcome,
)


class Client(ClientAPI):
    """A connection to one agent, on asyncio. Make it with `connect(...)` (which is
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
            asyncio.Event,
            reconnect=reconnect,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            ssl_context=ssl_context,
            runtime=AsyncioRuntime(),
        )
        self._connect_timeout_s = connect_timeout_s
        self._ping_interval_s = ping_interval_s
        self._ws: ClientConnection | None = None
        self._runner: asyncio.Task[None] | None = None

    async def aclose(self) -> None:
        """Close the connection and stop. Calls on the agent go on; every waiting request and
        unfinished handle of this client fails with ConnectionLost."""
        if not self._state.begin_close():
            return
        ws = self._ws
        if ws is not None:
            await _close(ws)
        self._state.fail_all(ConnectionLost("the client was closed"))
        runner = self._runner
        if runner is not None and runner is not asyncio.current_task():
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner

    async def _send_frame(self, frame: str | bytes) -> None:
        ws = self._ws
        if ws is None:
            return
        # On failure the reader sees the loss; the request is re-sent or failed after it.
        with contextlib.suppress(ConnectionClosed):
            await ws.send(frame)

    # -- connections --------------------------------------------------------------------------

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Client]:
        """Connect, and run the connection (reader, reconnects) in a task until the block ends,
        then close: what `connect` does with a new Client, with the same errors. A Client opens
        once (RuntimeError on a second `open`): for a new connection make a new one."""
        if self._runner is not None:
            raise RuntimeError("this Client was opened already; make a new one to connect again")
        self._runner = asyncio.create_task(self._run(), name=f"toolwire client {self.url}")
        self._runner.add_done_callback(self._runner_ended)
        try:
            await self._state.first_settled.wait()
            if self.connections == 0:
                assert self._state.fatal is not None
                raise self._state.fatal
            yield self
        finally:
            await self.aclose()

    def _runner_ended(self, runner: asyncio.Task[None]) -> None:
        # A bug in the loop below must not leave the caller waiting forever: fail everything.
        if not runner.cancelled() and runner.exception() is not None:
            error = runner.exception()
            assert error is not None
            log.error("the client's connection task failed", exc_info=error)
            self._state.first_settled.set()
            self._state.fail_all(error)

    async def _run(self) -> None:
        """Connect, read until the connection is lost, reconnect after the state's delay."""
        attempt = 0
        while True:
            before = self._state.connections
            failure: BaseException | None = None
            try:
                await self._session()
            except InvalidStatus as rejected:
                response = rejected.response
                failure = ConnectError(response.status_code, bytes(response.body or b""))
            except _CONNECTION_ERRORS as exc:
                failure = exc
            plan = self._state.after_loss(failure, before, attempt)
            if plan is None:
                return
            delay, attempt = plan
            await asyncio.sleep(delay)

    async def _session(self) -> None:
        """One connection, from TCP connect to close."""
        options: dict[str, Any] = {}
        if self._ssl is not None:
            options["ssl"] = self._ssl
        async with asyncio.timeout(self._connect_timeout_s):
            ws = await open_websocket(
                self.url,
                subprotocols=[Subprotocol(self._subprotocol)],
                additional_headers=(
                    {"Authorization": self._authorization} if self._authorization else None
                ),
                compression=None,  # the agent offers none; output is mostly small chunks
                proxy=None,  # a proxy from the environment would sit between us and localhost
                open_timeout=self._connect_timeout_s,
                ping_interval=self._ping_interval_s,
                ping_timeout=2 * self._ping_interval_s if self._ping_interval_s else None,
                close_timeout=CLOSE_TIMEOUT_S,
                max_size=MAX_INCOMING_MESSAGE_BYTES,
                max_queue=MAX_QUEUED_FRAMES,
                **options,
            )
            try:
                welcome = await self._receive_welcome(ws)
            except BaseException:
                await _close(ws)
                raise
        self._ws = ws
        gen = self._state.on_connected(welcome)
        resubscribe = asyncio.create_task(self._resubscribe(gen))
        try:
            await self._read(ws)
        finally:
            self._disconnected(ws)
            resubscribe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await resubscribe
            await _close(ws)

    def _disconnected(self, ws: ClientConnection) -> None:
        if self._ws is not ws:
            return  # not connected on this one, or already handled
        self._ws = None
        self._state.on_disconnected()

    async def _receive_welcome(self, ws: ClientConnection) -> protocol.Welcome:
        frame = await ws.recv()
        try:
            message = self._state.codec.decode(frame)
        except MessageError as exc:
            raise BadWelcome(f"undecodable first message: {exc}") from None
        if not isinstance(message, protocol.Welcome):
            raise BadWelcome(f"expected welcome, got {type(message).__name__}")
        return message

    async def _read(self, ws: ClientConnection) -> None:
        receive = self._state.receive
        try:
            while True:
                receive(await ws.recv())
        except ConnectionClosed as exc:
            log.debug("connection closed: %s", exc)


async def _close(ws: ClientConnection) -> None:
    """Close with a close handshake if the agent answers within CLOSE_TIMEOUT_S (websockets
    aborts the TCP connection after its close_timeout)."""
    with contextlib.suppress(ConnectionClosed, OSError):
        await ws.close()


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
    """Connect to an agent at `ws://HOST:PORT/v1` and yield a `Client`; the trio shell's
    `connect` with the same arguments and the same errors (see session.py)."""
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
