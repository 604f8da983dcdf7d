"""What the executor's tests share: a relay that can hold the agent's replies back, running
an awaitable in a task of the shell's own loop that the test cancels (trio or asyncio), and
collecting what an executor shows of a call's output until some text came."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from tests.clientshells import Shell
from toolwire import OutputChunk


class HoldingRelay:
    """A TCP relay between client and agent. While `holding`, what the agent sends is not
    passed on (the client waits for its `accepted`), what the client sends still is, and
    `upstream` is set once some of it went through: the agent has the request, the client
    has no reply yet. `release()` passes on what was held."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.holding = False
        self.upstream = trio.Event()
        self._released = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._relay, listeners)

    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1"

    async def hold(self) -> None:
        self.holding = True
        self.upstream = trio.Event()
        self._released = trio.Event()

    async def wait_upstream(self) -> None:
        await self.upstream.wait()

    async def release(self) -> None:
        self.holding = False
        self._released.set()

    async def _relay(self, down: trio.SocketStream) -> None:
        up = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._to_agent, down, up, nursery.cancel_scope)
                nursery.start_soon(self._to_client, up, down, nursery.cancel_scope)
        finally:
            await trio.aclose_forcefully(down)
            await trio.aclose_forcefully(up)

    async def _to_agent(
        self, src: trio.SocketStream, dst: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
                if self.holding:
                    self.upstream.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()

    async def _to_client(
        self, src: trio.SocketStream, dst: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        try:
            while data := await src.receive_some(65536):
                if self.holding:
                    await self._released.wait()
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()


@dataclass
class Outcome:
    value: Any = None
    cancelled: bool = False
    error: BaseException | None = None
    done: list[bool] = field(default_factory=list)


async def cancel_when(
    shell: Shell,
    work: Callable[[], Awaitable[Any]],
    when: Callable[[], Awaitable[None]],
    after_cancel: Callable[[], Awaitable[None]] | None = None,
) -> Outcome:
    """Run `work()` in a task of the shell's loop, await `when()`, then cancel the task, await
    `after_cancel()`, and wait for the task to end. Says whether the cancellation came out of
    `work` as a cancellation."""
    outcome = Outcome()
    if shell.name == "trio":
        scope = trio.CancelScope()

        async def run() -> None:
            with scope:
                try:
                    outcome.value = await work()
                except trio.Cancelled:
                    outcome.cancelled = True
                    raise
                except Exception as exc:
                    outcome.error = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await when()
            scope.cancel()
            if after_cancel is not None:
                await after_cancel()
        return outcome
    task = asyncio.create_task(work())
    await when()
    task.cancel()
    if after_cancel is not None:
        await after_cancel()
    try:
        outcome.value = await task
    except asyncio.CancelledError:
        outcome.cancelled = True
    except Exception as exc:
        outcome.error = exc
    return outcome


def new_flag(shell: Shell) -> Any:
    """A one-shot event of the shell's loop."""
    return trio.Event() if shell.name == "trio" else asyncio.Event()


class ShownOutput:
    """An executor's `on_output`: keeps every chunk shown (`chunks`), and sets `seen`, a flag of
    the shell's loop, once a chunk with `until` in it was shown ("" on the first chunk)."""

    def __init__(self, shell: Shell, until: str = "") -> None:
        self.chunks: list[OutputChunk] = []
        self.seen = new_flag(shell)
        self.until = until

    def __call__(self, chunk: OutputChunk) -> None:
        self.chunks.append(chunk)
        if self.until in chunk.data:
            self.seen.set()
