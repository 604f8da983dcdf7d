"""The executor's `TaskRuntime` (runtime.py) on asyncio: helpers in a TaskGroup; shielding by
awaiting a task of its own through `asyncio.shield` until it ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from toolwire.transport.client.handles import Flag
from toolwire.transport.client.runtime import block_exception

__all__ = ["AsyncioRuntime"]

_T = TypeVar("_T")


class _Helpers:
    def __init__(self, group: asyncio.TaskGroup) -> None:
        self._group = group
        self._started: list[asyncio.Task[None]] = []

    def start(self, fn: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        async def run() -> None:
            await fn()

        task = self._group.create_task(run())
        self._started.append(task)
        return task

    def cancel_all(self) -> None:
        for task in self._started:
            task.cancel()


class AsyncioRuntime:
    """`TaskRuntime` on asyncio."""

    @asynccontextmanager
    async def helpers(self) -> AsyncIterator[_Helpers]:
        try:
            async with asyncio.TaskGroup() as group:
                helpers = _Helpers(group)
                try:
                    yield helpers
                finally:
                    helpers.cancel_all()
        except BaseExceptionGroup as group:
            single = block_exception(group, asyncio.CancelledError)
            if single is None:
                raise
            raise single from single.__cause__

    def is_cancellation(self, exc: BaseException) -> bool:
        if isinstance(exc, BaseExceptionGroup):
            return exc.split(asyncio.CancelledError)[1] is None
        return isinstance(exc, asyncio.CancelledError)

    async def shielded(self, fn: Callable[[], Awaitable[_T]], timeout_s: float) -> _T | None:
        async def bounded() -> _T | None:
            try:
                return await asyncio.wait_for(_coroutine(fn), timeout_s)
            except TimeoutError:
                return None

        task = asyncio.ensure_future(bounded())
        while True:
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                # The caller is being cancelled: the task goes on; wait for it again. The
                # caller's own CancelledError is re-raised by the caller after this returns.
                if task.done():
                    return task.result()

    def flag(self) -> Flag:
        return asyncio.Event()


async def _coroutine(fn: Callable[[], Awaitable[_T]]) -> _T:
    return await fn()
