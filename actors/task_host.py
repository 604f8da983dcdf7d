"""A nursery that is open only while it has tasks.

Why: ten thousand idle chats must cost no tasks. A chat's tasks (a tool on a thread, a
process's pump and reaper, a stop, a timer, a read-back) run in a nursery of its own, opened
in the agent's nursery when the first task starts and closed once the last one ended; a task
started while it closes waits for the next opening, so none is lost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

TaskFn = Callable[..., Awaitable[None]]


class TaskHost:
    # Per idle chat this is all it costs: no name string of its own (the owner's is named when
    # needed) and no empty list (tasks waiting for the next opening are rare).
    __slots__ = ("_nursery", "_owner", "_pending", "_running", "_start_host")

    def __init__(self, chat_id: str, start_host: Callable[[TaskFn], None] | None) -> None:
        self._owner = chat_id  # whose tasks these are, named in an error
        # How the host itself is started (the agent's nursery's start_soon), on demand.
        self._start_host = start_host
        self._nursery: trio.Nursery | None = None
        self._running = False  # run() is started or running
        self._pending: list[tuple[TaskFn, tuple[Any, ...]]] | None = None

    @property
    def busy(self) -> bool:
        """A task runs, waits to start, or the nursery is still open."""
        return self._running or bool(self._pending)

    def start_soon(self, fn: TaskFn, *args: Any) -> None:
        """Start a task, opening the nursery if it was closed."""
        if self._nursery is not None:
            try:
                self._nursery.start_soon(fn, *args)
                return
            except RuntimeError:
                pass  # closing: its last task just ended; queued for the next opening
        if self._pending is None:
            self._pending = []
        self._pending.append((fn, args))
        self._ensure_running()

    async def run(self) -> None:
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                pending, self._pending = self._pending or (), None
                for fn, args in pending:
                    nursery.start_soon(fn, *args)
        finally:
            self._nursery = None
            self._running = False
            if self._pending:
                self._ensure_running()

    def _ensure_running(self) -> None:
        if self._running:
            return
        if self._start_host is None:
            raise RuntimeError(f"chat {self._owner!r} has no nursery to run its tasks in")
        self._running = True
        self._start_host(self.run)
