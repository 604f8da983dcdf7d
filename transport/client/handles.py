"""What a caller holds: a `CallHandle` per followed call, a `TurnHandle` per turn.

Both shells use these same classes. They wait on a `Flag`, which is what trio.Event and
asyncio.Event have in common (`set`, `is_set`, `await wait()`); each shell hands in its own
event class, so nothing here imports an event loop.

Each handle has two sides. The caller's: properties, `async for`, `await result()` (or
`plan()`/`results()`). The client core's: the `feed_*` methods, through which `ClientState`
(state.py and replies.py) hands a handle what the agent sent or why it failed. They are
synchronous and never block (events queue without bound until consumed), each ignores what
arrives after the handle ended, and a caller never calls them: they are public only so that the
core drives the handles through a documented surface rather than their private state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from toolwire.transport import protocol
from toolwire.transport.client.cursor import OutputCursor
from toolwire.transport.client.errors import ConnectionLost

__all__ = ["CallEvent", "CallHandle", "Flag", "FlagFactory", "Mailbox", "TurnHandle"]

CallEvent = protocol.Started | protocol.Output | protocol.Approval | protocol.ApprovalResolved
_T = TypeVar("_T")


class Flag(Protocol):
    """A one-shot event: trio.Event and asyncio.Event both are one."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self) -> Awaitable[object]: ...


FlagFactory = Callable[[], Flag]


class Mailbox(Generic[_T]):
    """An unbounded FIFO that never blocks its producer, ended by `close` (optionally with an
    error). Single consumer is the intended use; several consumers share the items."""

    def __init__(self, make_flag: FlagFactory) -> None:
        self._make_flag = make_flag
        self._items: deque[_T] = deque()
        self._wakeup = make_flag()
        self._closed = False
        self._error: BaseException | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: _T) -> None:
        if not self._closed:
            self._items.append(item)
            self._wakeup.set()

    def close(self, error: BaseException | None = None) -> None:
        if not self._closed:
            self._closed = True
            self._error = error
            self._wakeup.set()

    def __aiter__(self) -> Mailbox[_T]:
        return self

    async def __anext__(self) -> _T:
        while not self._items:
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            if self._wakeup.is_set():
                self._wakeup = self._make_flag()
            await self._wakeup.wait()
        return self._items.popleft()


def _result_of(message: protocol.ResultMessage) -> protocol.Result:
    return protocol.Result(
        **{name: getattr(message, name) for name in protocol.Result.__struct_fields__}
    )


class CallHandle:
    """One tool call this client follows, identified by `(chat_id, call_id)`.

    `async for event in handle` yields Started, Output, Approval and ApprovalResolved events in
    order (each byte of output once, each of the others at most once), and ends after the
    result arrived; `await handle.result()` gives the result, once, however often the agent
    sent it. A client keeps one handle per call: a repeated `call` or `attach` of a call it
    still follows returns the same handle (with the newest `accepted`).

    Events are queued without bound until consumed; pass `stream=False` to `Client.call` when
    only the result matters, and no output is kept at all (`output_text()` stays "").
    """

    def __init__(
        self, chat_id: str, call_id: str, *, stream: bool, offset: int, make_flag: FlagFactory
    ) -> None:
        self.chat_id = chat_id
        self.call_id = call_id
        self.stream = stream  # buffer output for the caller
        self._cursor = OutputCursor(offset)
        self._accepted: protocol.Accepted | None = None
        self._settled = make_flag()  # accepted, or ended
        self._events: Mailbox[CallEvent] = Mailbox(make_flag)
        self._texts: list[str] = []
        self._result: protocol.Result | None = None
        self._error: BaseException | None = None
        self._done = make_flag()
        self._live_gen: int | None = None  # the connection on which we were last accepted
        self._started_seen = False
        self._approval_seen = False
        self._resolved_seen = False

    def __repr__(self) -> str:
        state = "done" if self.done else "accepted" if self._accepted else "pending"
        return f"<CallHandle {self.chat_id!r}/{self.call_id!r} {state} offset={self.offset}>"

    @property
    def accepted(self) -> protocol.Accepted:
        """The newest `accepted` for this call (set before `call`/`attach` return)."""
        if self._accepted is None:
            raise RuntimeError("no accepted yet; await handle.wait_accepted() (turn calls)")
        return self._accepted

    @property
    def offset(self) -> int:
        """The next byte offset of output this handle expects (what a re-attach resumes from)."""
        return self._cursor.offset

    @property
    def resume_offset(self) -> int:
        """Where a re-attach starts so that no byte is skipped (see `OutputCursor`)."""
        return self._cursor.resume_offset if self.stream else 0

    @property
    def gaps(self) -> list[tuple[int, int]]:
        """Byte ranges (from, to) the agent no longer retained when we (re)read them."""
        return self._cursor.gaps

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def live_gen(self) -> int | None:
        """The connection (by generation) on which this handle was last accepted."""
        return self._live_gen

    @property
    def was_accepted(self) -> bool:
        return self._accepted is not None

    def output_text(self) -> str:
        """All streamed output delivered so far, joined (each byte once, gaps left out)."""
        if len(self._texts) > 1:
            self._texts = ["".join(self._texts)]
        return self._texts[0] if self._texts else ""

    async def wait_accepted(self) -> protocol.Accepted:
        """Wait for the call's `accepted` (a turn's calls get theirs just after `turn_plan`)."""
        await self._settled.wait()
        if self._accepted is None:
            raise self._error or ConnectionLost("the call ended without an accepted")
        return self._accepted

    async def result(self) -> protocol.Result:
        """The call's final result. Raises if the handle failed (see the error classes)."""
        await self._done.wait()
        if self._result is None:
            assert self._error is not None
            raise self._error
        return self._result

    def __aiter__(self) -> CallHandle:
        return self

    async def __anext__(self) -> CallEvent:
        return await self._events.__anext__()

    # -- the client core's side: fed by ClientState (synchronous, never blocks) ----------------

    def feed_accepted(self, message: protocol.Accepted, gen: int) -> None:
        """The agent accepted a request for this call on connection `gen`: its events on that
        connection count from now on (`live_gen`), and its output may start again from an
        earlier offset."""
        if self.done:
            return
        self._accepted = message
        self._live_gen = gen
        self._cursor.rewound = True  # a call/attach may move the agent's cursor back
        self._settled.set()

    def feed_event(self, message: Any) -> None:
        """One of the call's events (Started, Output, Approval, ApprovalResolved, or the
        ResultMessage that ends the handle), de-duplicated here: each byte and each event once."""
        if self.done:
            return
        if isinstance(message, protocol.Output):
            if not self.stream:
                return
            taken = self._cursor.take(message.offset, message.data)
            if taken is None:
                return
            offset, text = taken
            self._texts.append(text)
            if text is not message.data or offset != message.offset:
                message = protocol.Output(
                    chat_id=self.chat_id, call_id=self.call_id, offset=offset, data=text
                )
            self._events.put(message)
        elif isinstance(message, protocol.Started):
            if not self._started_seen:
                self._started_seen = True
                self._events.put(message)
        elif isinstance(message, protocol.Approval):
            if not self._approval_seen:
                self._approval_seen = True
                self._events.put(message)
        elif isinstance(message, protocol.ApprovalResolved):
            if not self._resolved_seen:
                self._resolved_seen = True
                self._events.put(message)
        elif isinstance(message, protocol.ResultMessage):
            self._result = _result_of(message)
            self._events.close()
            self._done.set()
            self._settled.set()

    def feed_failure(self, error: BaseException) -> None:
        """End the handle without a result: its iteration and `result()` raise `error`."""
        if self.done:
            return
        self._error = error
        self._events.close(error)
        self._done.set()
        self._settled.set()


class TurnHandle:
    """One `turn` (PROTOCOL.md 5.6): its plan, its calls' handles, and its results."""

    def __init__(
        self, chat_id: str, turn_id: str, message: protocol.Turn, make_flag: FlagFactory
    ) -> None:
        self.chat_id = chat_id
        self.turn_id = turn_id
        self.call_ids = [spec.call_id for spec in message.calls]
        self.stream = message.stream
        self.calls: dict[str, CallHandle] = {}  # per call, when stream=True
        self.segments: list[list[str]] | None = None
        self.message = message  # what a reconnect re-sends (with a new rid)
        self._results: list[protocol.Result] | None = None
        self._error: BaseException | None = None
        self._planned = make_flag()
        self._done = make_flag()

    def __repr__(self) -> str:
        return f"<TurnHandle {self.chat_id!r}/{self.turn_id!r} done={self.done}>"

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def plan(self) -> list[list[str]]:
        """The planner's segments (call ids, in request order once flattened)."""
        await self._planned.wait()
        if self.segments is None:
            assert self._error is not None
            raise self._error
        return self.segments

    async def results(self) -> list[protocol.Result]:
        """One Result per call, in request order (from `turn_result`)."""
        await self._done.wait()
        if self._results is None:
            assert self._error is not None
            raise self._error
        return self._results

    # -- the client core's side: fed by ClientState (synchronous, never blocks) ----------------

    def feed_plan(self, segments: list[list[str]]) -> None:
        """The turn's `turn_plan` (a repeat keeps the first)."""
        if self.segments is None:
            self.segments = segments
        self._planned.set()

    def feed_results(self, results: list[protocol.Result]) -> None:
        """The turn's `turn_result`: it ends the turn."""
        if not self.done:
            self._results = results
            self._planned.set()
            self._done.set()

    def feed_failure(self, error: BaseException) -> None:
        """End the turn without results: `plan()` (if not planned yet) and `results()` raise
        `error`."""
        if not self.done:
            self._error = error
            self._planned.set()
            self._done.set()
