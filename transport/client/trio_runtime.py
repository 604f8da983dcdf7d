"""The executor's `TaskRuntime` (runtime.py) on trio: helpers in a nursery, each in a cancel
scope of its own; shielding by a shielded cancel scope with a deadline."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import trio

from toolwire.transport.client.handles import Flag
from toolwire.transport.client.runtime import block_exception

__all__ = ["TrioRuntime"]

_T = TypeVar("_T")


class _Helper:
    __slots__ = ("scope",)

    def __init__(self) -> None:
        # A scope cancelled before it is entered is cancelled from its start: a helper
        # cancelled before it ran never runs its callback past the first checkpoint.
        self.scope = trio.CancelScope()

    def cancel(self) -> None:
        self.scope.cancel()


class _Helpers:
    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._started: list[_Helper] = []

    def start(self, fn: Callable[[], Awaitable[None]]) -> _Helper:
        helper = _Helper()
        self._started.append(helper)

        async def run() -> None:
            with helper.scope:
                await fn()

        self._nursery.start_soon(run)
        return helper

    def cancel_all(self) -> None:
        for helper in self._started:
            helper.cancel()


class TrioRuntime:
    """`TaskRuntime` on trio."""

    @asynccontextmanager
    async def helpers(self) -> AsyncIterator[_Helpers]:
        try:
            async with trio.open_nursery() as nursery:
                helpers = _Helpers(nursery)
                try:
                    yield helpers
                finally:
                    helpers.cancel_all()
        except BaseExceptionGroup as group:
            # The nursery wraps what the block raised; hand back the block's own exception
            # when it is the only one, as a plain `async with` would.
            single = block_exception(group, trio.Cancelled)
            if single is None:
                raise
            raise single from single.__cause__

    def is_cancellation(self, exc: BaseException) -> bool:
        if isinstance(exc, BaseExceptionGroup):
            rest = exc.split(trio.Cancelled)[1]
            return rest is None
        return isinstance(exc, trio.Cancelled)

    async def shielded(self, fn: Callable[[], Awaitable[_T]], timeout_s: float) -> _T | None:
        with trio.move_on_after(timeout_s, shield=True):
            return await fn()
        return None

    def flag(self) -> Flag:
        return trio.Event()
