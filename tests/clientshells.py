"""The two client shells behind one test interface, so one behaviour suite runs against both.

A test body is an `async def` that awaits only the client's API (loop-agnostic: handles,
results and errors are the same classes in both shells) and the few helpers here. The trio
shell runs it in the test's own trio task. The asyncio shell runs it with `asyncio.run` in a
worker thread (an asyncio loop and a trio loop cannot share a thread), while the server stays in
the test's nursery on the trio thread; `on_trio` calls back into the trio thread for what lives
there (the proxy, the server).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final, Protocol

import trio

from toolwire.transport.client import aio, session
from toolwire.transport.client.api import ClientAPI

# Only a hung test ends here: everything a test waits for is an event that normally arrives in
# well under a second. It keeps a hung asyncio body from hanging the whole run (a worker thread
# cannot be cancelled from trio).
BODY_TIMEOUT_S: Final = 60.0

Body = Callable[[], Coroutine[Any, Any, None]]


class Shell(Protocol):
    name: str

    def connect(self, url: str, token: str | None, *args: Any, **kwargs: Any) -> Any: ...

    async def run(self, body: Body) -> None: ...

    async def on_trio(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any: ...

    def fail_after(self, seconds: float) -> AbstractAsyncContextManager[None]: ...

    async def send_raw(self, client: ClientAPI, frame: str | bytes) -> None: ...

    async def close_websocket(self, client: ClientAPI) -> None: ...


class TrioShell:
    name = "trio"
    connect = staticmethod(session.connect)

    async def run(self, body: Body) -> None:
        with trio.fail_after(BODY_TIMEOUT_S):
            await body()

    async def on_trio(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        return await fn(*args)

    @asynccontextmanager
    async def fail_after(self, seconds: float) -> AsyncIterator[None]:
        with trio.fail_after(seconds):
            yield

    async def send_raw(self, client: ClientAPI, frame: str | bytes) -> None:
        """A frame the client would never send, straight onto its current WebSocket."""
        assert isinstance(client, session.Client) and client._ws is not None
        await client._ws.send_message(frame)

    async def close_websocket(self, client: ClientAPI) -> None:
        """A clean close from the client's side that the client did not ask for."""
        assert isinstance(client, session.Client) and client._ws is not None
        await client._ws.aclose()


class AsyncioShell:
    name = "asyncio"
    connect = staticmethod(aio.connect)

    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None

    async def run(self, body: Body) -> None:
        self._token = trio.lowlevel.current_trio_token()

        def in_thread() -> None:
            asyncio.run(asyncio.wait_for(body(), BODY_TIMEOUT_S))

        await trio.to_thread.run_sync(in_thread)

    async def on_trio(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        # From a thread of asyncio's own, so that the asyncio loop runs on meanwhile.
        def call() -> Any:
            return trio.from_thread.run(fn, *args, trio_token=self._token)

        return await asyncio.to_thread(call)

    @asynccontextmanager
    async def fail_after(self, seconds: float) -> AsyncIterator[None]:
        async with asyncio.timeout(seconds):
            yield

    async def send_raw(self, client: ClientAPI, frame: str | bytes) -> None:
        assert isinstance(client, aio.Client) and client._ws is not None
        await client._ws.send(frame)

    async def close_websocket(self, client: ClientAPI) -> None:
        assert isinstance(client, aio.Client) and client._ws is not None
        await client._ws.close()


SHELLS: dict[str, Callable[[], Shell]] = {"trio": TrioShell, "asyncio": AsyncioShell}
