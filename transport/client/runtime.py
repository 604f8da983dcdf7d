"""What the executor needs of an event loop, named without importing one (pure: no I/O).

The executor (executor.py) runs on both shells. The little it needs beyond awaiting a handle
is here as protocols, and each shell hands in its own implementation as `Client.runtime`:
trio_runtime.py (nurseries, cancel scopes) and aio_runtime.py (TaskGroup, shield).

- `helpers()`: an async block in which helper tasks run beside the block's own code (an
  approval callback while the call's events go on). When the block ends, however it ends, the
  helpers still running are cancelled first, then awaited, so none outlives it; an exception
  of the block itself comes out as it is, not wrapped in an exception group.
- `is_cancellation(exc)`: whether `exc` is the loop's cancellation of the awaiting task (trio's
  Cancelled, asyncio's CancelledError, or a group of only those), as opposed to a failure.
- `shielded(fn, timeout_s)`: run `fn` to its end even while the caller is being cancelled
  (what a cancellation must still tell the agent), for at most `timeout_s`; None on timeout.
- `flag()`: a new one-shot event of the loop (handles.py's `Flag`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from toolwire.transport.client.handles import Flag

__all__ = ["Helper", "Helpers", "TaskRuntime", "block_exception"]

_T = TypeVar("_T")


class Helper(Protocol):
    """One helper task: `cancel` it (also before it started; a second time does nothing)."""

    def cancel(self) -> object: ...


class Helpers(Protocol):
    """Where helper tasks are started (see `TaskRuntime.helpers`)."""

    def start(self, fn: Callable[[], Awaitable[None]]) -> Helper: ...


class TaskRuntime(Protocol):
    """An event loop's tasks, cancellation and shielding, as the executor uses them."""

    def helpers(self) -> AbstractAsyncContextManager[Helpers]: ...

    def is_cancellation(self, exc: BaseException) -> bool: ...

    async def shielded(self, fn: Callable[[], Awaitable[_T]], timeout_s: float) -> _T | None: ...

    def flag(self) -> Flag: ...


def block_exception(
    group: BaseExceptionGroup[Any], cancelled: type[BaseException]
) -> BaseException | None:
    """What a `helpers()` block raised, out of the group its nursery or TaskGroup wrapped it
    in: the one exception when there is one; one cancellation when all are (the block's and
    its helpers': one stands for all, so a caller's `except Cancelled` sees what it would
    without helpers); else None (re-raise the group)."""
    if group.split(cancelled)[1] is not None and _count(group) != 1:
        return None
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _count(exc: BaseException) -> int:
    if isinstance(exc, BaseExceptionGroup):
        return sum(_count(inner) for inner in exc.exceptions)
    return 1
