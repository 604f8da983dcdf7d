"""The orchestrator's client: tool calls over one WebSocket, with resume after reconnects.

    async with connect("ws://127.0.0.1:7411/v1", token) as client:
        call_id = tool_call_id(chat_id, message_id, provider_call_id)   # transport/ids.py
        handle = await client.call(chat_id, call_id, "execute", {"command": "make test"})
        async for event in handle:              # Started, Output, Approval, ApprovalResolved
            if isinstance(event, protocol.Output):
                print(event.data, end="")
        result = await handle.result()          # exactly once, whatever was retried
        print(result.outcome, result.data)
        outcomes = await client.cancel_and_collect(chat_id, [call_id])   # id -> final Result
        await client.interrupt(chat_id)          # end the chat's unresolved calls

One `Client` is one logical connection to an agent (PROTOCOL.md). A reader task decodes every
message and dispatches it by `rid` (replies to our requests) or by `(chat_id, call_id)` (call
events) into per-handle queues. The reader never waits for a consumer: the queues are
unbounded, so memory holds what the caller asked for and has not consumed yet. A caller that
only wants the result passes `stream=False`, and no output is buffered at all.

Resume (`reconnect=True`, the default): when the connection is lost (not on `aclose`), the
client reconnects with exponential backoff and jitter, re-`attach`es every unfinished call from
the last byte offset it knows exactly (see `OutputCursor`), and re-sends unanswered requests
that are idempotent by design: `call` (at most once per call id), `attach`, `cancel` (a repeat
returns the saved result), `turn` (a repeated turn_id attaches) and `interrupt`. Output is
de-duplicated by byte offset, so every handle sees each byte once, in order, and its one result
(also after invalid UTF-8 right before a connection loss, see `OutputCursor`). `approve` is
not idempotent (a second one is `not_parked`), so an `approve` in flight when the connection
drops raises `ConnectionLost`: it may or may not have been applied, and the call's events tell.
If the agent restarted meanwhile (`welcome.boot_id` changed), the client goes on: the agent's
journal answers the re-attaches, and a call it has no record of fails its handle with
`RequestError("unknown_call")`.

Handshake rejections (HTTP 400/401/403/404) raise `ConnectError` and are never retried. The
client closes its TCP stream itself after every connection: trio-websocket leaves it open after
a close by the peer, a rejected handshake or a 1009.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import random
import ssl
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar

import msgspec
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    wrap_client_stream,
)

from toolwire.transport import protocol
from toolwire.transport.codec import SUBPROTOCOLS, Codec, Encoding, MessageError

__all__ = [
    "CallEvent",
    "CallHandle",
    "Client",
    "ConnectError",
    "ConnectionLost",
    "Detached",
    "MessageTooBig",
    "OutputCursor",
    "RequestError",
    "ToolwireClientError",
    "TurnHandle",
    "connect",
]

log = logging.getLogger("toolwire.client")

# The largest message we accept from the agent, in characters or bytes as trio-websocket counts.
# The agent's own output chunks are at most 256 KiB (128 KiB on JSON), but a `turn_result`
# carries up to 64 KiB of output per call, so a big turn is a few MiB; 256 MiB only guards
# against a broken peer. It must stay far above anything a sane agent sends: a 1009 here would
# make the client reconnect, re-attach, and receive the same message again.
MAX_INCOMING_MESSAGE_BYTES: Final = 256 * 1024 * 1024
# Messages trio-websocket queues between its reader and ours. Our reader never blocks (it only
# appends to queues), so this only absorbs scheduling jitter; it must be > 1 so a busy reader
# does not stop trio-websocket from answering the agent's pings.
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
# Unmatched `error` messages kept in `Client.errors`; the oldest go first. Each is also logged.
MAX_KEPT_ERRORS: Final = 1000

CallEvent = protocol.Started | protocol.Output | protocol.Approval | protocol.ApprovalResolved
CallSpecLike = protocol.CallSpec | dict[str, Any]
_Key = tuple[str, str]
_T = TypeVar("_T")


# ---------------------------------------------------------------------------------------------
# Errors


class ToolwireClientError(Exception):
    """Base class of every error this client raises."""


class ConnectError(ToolwireClientError):
    """The client could not connect. `status_code` is the HTTP status of a rejected handshake
    (401 wrong token, 404 wrong path, 400 unsupported subprotocol), or None when the agent was
    not reachable at all (then the cause is chained)."""

    def __init__(self, status_code: int | None, body: bytes = b"", detail: str = "") -> None:
        self.status_code = status_code
        self.body = body
        self.detail = detail
        if status_code is not None:
            text = body.decode("utf-8", "replace").strip()
            message = f"handshake rejected with HTTP {status_code}" + (f": {text}" if text else "")
        else:
            message = f"could not connect: {detail}"
        super().__init__(message)


class RequestError(ToolwireClientError):
    """The agent answered a request with `error` (PROTOCOL.md 6). Nothing was changed."""

    def __init__(self, code: str, message: str, error: protocol.Error | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.error = error


class ConnectionLost(ToolwireClientError):
    """The connection is gone and this request or handle cannot be resumed: the client was
    closed, `reconnect=False`, reconnecting was refused, or an `approve` was in flight."""


class Detached(ToolwireClientError):
    """The handle was detached (`Client.detach`): its call goes on, this client stopped
    following it."""


class MessageTooBig(ToolwireClientError, ValueError):
    """The request is larger than the agent's `limits.max_message_bytes`. It was not sent: the
    agent would close the connection with 1009, and re-sending after the reconnect would loop."""


class _BadWelcome(Exception):
    """The agent's first message was not a `welcome`."""


# Failures of one connection attempt or of an established connection: reconnecting may help.
_CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    HandshakeError,
    ConnectionClosed,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
    _BadWelcome,
)


def _retryable_status(status_code: int) -> bool:
    # 4xx says our request is wrong (token, path, subprotocol) and will stay wrong; retrying
    # would hammer the agent for nothing. 408/429 and 5xx (503 while it shuts down) pass.
    return not (400 <= status_code < 500) or status_code in (408, 429)


# ---------------------------------------------------------------------------------------------
# Small building blocks


class _Mailbox(Generic[_T]):
    """An unbounded FIFO that never blocks its producer, ended by `close` (optionally with an
    error). Single consumer is the intended use; several consumers share the items."""

    def __init__(self) -> None:
        self._items: deque[_T] = deque()
        self._wakeup = trio.Event()
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

    def __aiter__(self) -> _Mailbox[_T]:
        return self

    async def __anext__(self) -> _T:
        while not self._items:
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            if self._wakeup.is_set():
                self._wakeup = trio.Event()
            await self._wakeup.wait()
        return self._items.popleft()


class OutputCursor:
    """Byte-offset bookkeeping of one call's streamed output (pure: no I/O, no trio).

    `offset` is the next byte offset we expect. A chunk whose bytes were all delivered already
    is dropped; one that overlaps is trimmed to its new bytes (offsets count raw bytes, so the
    cut is made in the UTF-8 encoding, never inside a character); one that starts beyond
    `offset` is a retention jump (PROTOCOL.md 5.2), recorded in `gaps` as (from, to).

    One wrinkle: the agent decodes output with replacement, so one U+FFFD in `data` stands for
    1 to 3 raw bytes, and `offset + len(data.encode())` can overshoot the real end of a chunk.
    So the cursor also keeps an `anchor`: the last byte offset it knows exactly, and the text
    delivered since (`since_anchor`). While no request of ours moved the agent's cursor back
    (`rewound` False), chunks on one connection are contiguous, so a chunk that starts inside
    the uncertainty (between `low` and `offset`) tells where the previous one really ended, and
    the anchor moves there. A re-attach resumes from `resume_offset` (the anchor): the agent
    decodes the same bytes from the same character boundary again, so what it sends starts
    with `since_anchor`, which is trimmed off: nothing lost, nothing doubled.
    """

    __slots__ = (
        "anchor",
        "gaps",
        "low",
        "matched",
        "offset",
        "replaying",
        "rewound",
        "since_anchor",
    )

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        self.low = offset  # the least the true next offset can be (< offset only after U+FFFD)
        self.anchor = offset  # the newest offset known exactly (a chunk start)
        self.since_anchor = ""  # text delivered from `anchor` on (non-empty only after U+FFFD)
        self.replaying = False  # re-reading `since_anchor` after a re-attach from the anchor
        self.matched = 0  # characters of `since_anchor` the replay has repeated so far
        self.gaps: list[tuple[int, int]] = []
        self.rewound = True  # the next chunk may repeat bytes we have

    @property
    def resume_offset(self) -> int:
        """Where a re-attach must start so that no byte is skipped."""
        return self.anchor

    def take(self, offset: int, data: str) -> tuple[int, str] | None:
        """The new part of a chunk as (offset, text), or None if it brings nothing new."""
        if self.replaying or (self.rewound and self.since_anchor and offset == self.anchor):
            return self._take_replay(offset, data)
        if not self.rewound and self.low <= offset < self.offset:
            self._settle(offset)  # the last chunk ended here: its U+FFFD were single bytes
        if offset > self.offset:
            self.gaps.append((self.offset, offset))
            self._settle(offset)
        raw = data.encode()
        skip = self.offset - offset
        while skip < len(raw) and 0x80 <= raw[skip] <= 0xBF:
            skip += 1  # never start inside a character
        if skip >= len(raw):
            return None  # all of it was delivered before (or it is empty)
        self.rewound = False
        text = raw[skip:].decode() if skip else data
        start = offset + skip
        if self.since_anchor or skip:
            self.since_anchor += text
        else:
            self.anchor, self.since_anchor = offset, data
        self._advance(offset + len(raw))
        return start, text

    def _take_replay(self, offset: int, data: str) -> tuple[int, str] | None:
        """The agent re-reads from our anchor: the same bytes from the same character boundary
        decode to the same text, so it repeats `since_anchor` first. Matching is by text, and
        every chunk start (an exact offset) becomes the new anchor."""
        self.rewound = False
        if self.replaying and offset != self.anchor:
            # Chunks on one connection are contiguous: this one starts exactly where the text
            # matched so far ends.
            self.since_anchor = self.since_anchor[self.matched :]
            self.anchor, self.matched = offset, 0
        self.replaying = True
        rest = self.since_anchor[self.matched :]
        if rest.startswith(data):
            self.matched += len(data)
            return None
        if not data.startswith(rest):
            # Not what we had: the agent no longer retains those bytes. Take it as new.
            self.replaying = False
            self.gaps.append((self.anchor, offset))
            self.anchor, self.since_anchor = offset, data
            self._advance(offset + len(data.encode()))
            return offset, data
        text = data[len(rest) :]
        self.replaying, self.matched = False, 0
        self.since_anchor = data
        self._advance(offset + len(data.encode()))
        return self.offset - len(text.encode()), text

    def _settle(self, exact: int) -> None:
        self.offset = self.low = self.anchor = exact
        self.since_anchor = ""
        self.replaying, self.matched = False, 0

    def _advance(self, end: int) -> None:
        """`since_anchor` now runs from `anchor` to `end` (an upper bound when it holds
        U+FFFD, each of which may stand for 1 raw byte instead of 3)."""
        self.offset = end
        self.low = end - 2 * self.since_anchor.count("\ufffd")
        if self.low == end:
            self._settle(end)


def _result_of(message: protocol.ResultMessage) -> protocol.Result:
    return protocol.Result(
        **{name: getattr(message, name) for name in protocol.Result.__struct_fields__}
    )


# ---------------------------------------------------------------------------------------------
# Handles


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

    def __init__(self, chat_id: str, call_id: str, *, stream: bool, offset: int = 0) -> None:
        self.chat_id = chat_id
        self.call_id = call_id
        self.stream = stream  # buffer output for the caller
        self._cursor = OutputCursor(offset)
        self._accepted: protocol.Accepted | None = None
        self._settled = trio.Event()  # accepted, or ended
        self._events: _Mailbox[CallEvent] = _Mailbox()
        self._texts: list[str] = []
        self._result: protocol.Result | None = None
        self._error: BaseException | None = None
        self._done = trio.Event()
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
    def gaps(self) -> list[tuple[int, int]]:
        """Byte ranges (from, to) the agent no longer retained when we (re)read them."""
        return self._cursor.gaps

    @property
    def done(self) -> bool:
        return self._done.is_set()

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

    # -- fed by the client's reader (synchronous, never blocks) --------------------------------

    def _on_accepted(self, message: protocol.Accepted, gen: int) -> None:
        if self.done:
            return
        self._accepted = message
        self._live_gen = gen
        self._cursor.rewound = True  # a call/attach may move the agent's cursor back
        self._settled.set()

    def _on_event(self, message: Any) -> None:
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

    def _fail(self, error: BaseException) -> None:
        if self.done:
            return
        self._error = error
        self._events.close(error)
        self._done.set()
        self._settled.set()


class TurnHandle:
    """One `turn` (PROTOCOL.md 5.6): its plan, its calls' handles, and its results."""

    def __init__(self, chat_id: str, turn_id: str, message: protocol.Turn) -> None:
        self.chat_id = chat_id
        self.turn_id = turn_id
        self.call_ids = [spec.call_id for spec in message.calls]
        self.stream = message.stream
        self.calls: dict[str, CallHandle] = {}  # per call, when stream=True
        self.segments: list[list[str]] | None = None
        self._message = message
        self._results: list[protocol.Result] | None = None
        self._error: BaseException | None = None
        self._planned = trio.Event()
        self._done = trio.Event()

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

    def _on_plan(self, segments: list[list[str]]) -> None:
        if self.segments is None:
            self.segments = segments
        self._planned.set()

    def _on_results(self, results: list[protocol.Result]) -> None:
        if not self.done:
            self._results = results
            self._planned.set()
            self._done.set()

    def _fail(self, error: BaseException) -> None:
        if not self.done:
            self._error = error
            self._planned.set()
            self._done.set()


# ---------------------------------------------------------------------------------------------
# Requests in flight


_Kind = Literal["call", "attach", "cancel", "approve", "turn", "interrupt"]
# Requests that make a connection follow a call or a turn.
_SUBSCRIBING: Final = frozenset({"call", "attach", "turn"})


@dataclass(eq=False)
class _Request:
    rid: int
    kind: _Kind
    message: Any  # the protocol Struct to (re)send
    frame: str | bytes | None = None  # its encoding for the first send
    handle: CallHandle | None = None  # call / attach
    turn: TurnHandle | None = None  # turn
    created: list[CallHandle] = field(default_factory=list)  # handles made for this request
    internal: bool = False  # made by the client itself (re-attach): nobody awaits it
    sent_gen: int | None = None  # connection it was handed to, None if never sent
    done: trio.Event = field(default_factory=trio.Event)
    error: BaseException | None = None
    cancel_ids: list[str] = field(default_factory=list)
    cancel_results: dict[str, protocol.CancelResult] = field(default_factory=dict)
    interrupted: protocol.Interrupted | None = None
    resolved: protocol.ApprovalResolved | None = None

    def finish(self, error: BaseException | None = None) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()


# ---------------------------------------------------------------------------------------------
# The client


class Client:
    """A connection to one agent. Make it with `connect(...)`; see the module docstring."""

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
        if encoding not in ("json", "msgpack"):
            raise ValueError(f"encoding must be 'json' or 'msgpack', not {encoding!r}")
        if backoff_initial_s <= 0 or backoff_max_s < backoff_initial_s:
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ValueError(f"not a ws:// or wss:// URL: {url!r}")
        self.url = url
        self.encoding: Encoding = encoding
        self.reconnect = reconnect
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "wss" else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if parts.port is None else f"{host}:{self._port}"
        self._resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "wss":
            self._ssl = ssl_context or ssl.create_default_context()
        self._headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._subprotocol = next(name for name, enc in SUBPROTOCOLS.items() if enc == encoding)
        self._codec = Codec(encoding, side="client")
        self._connect_timeout_s = connect_timeout_s
        self._ping_interval_s = ping_interval_s

        self.connections = 0  # successful connects, the first included
        self.errors: list[protocol.Error] = []  # errors that answer no request of ours
        self._welcome: protocol.Welcome | None = None
        self._ws: WebSocketConnection | None = None
        self._stream: trio.abc.Stream | None = None
        self._ready = False  # connected and resubscribed: requests may go out directly
        self._connected_event = trio.Event()
        self._gen = 0  # bumps on every connect; events count only on the current one
        self._rids = itertools.count(1)
        self._pending: dict[int, _Request] = {}
        self._handles: dict[_Key, CallHandle] = {}
        self._turns: dict[_Key, TurnHandle] = {}
        self._open_gates: set[_Key] = set()
        self._approvals: _Mailbox[protocol.Approval] = _Mailbox()
        self._closing = False
        self._fatal: BaseException | None = None
        self._first_settled = trio.Event()
        self._nursery: trio.Nursery | None = None

    # -- state -------------------------------------------------------------------------------

    @property
    def welcome(self) -> protocol.Welcome:
        """The `welcome` of the current (or last) connection."""
        assert self._welcome is not None, "not connected yet"
        return self._welcome

    @property
    def boot_id(self) -> str:
        return self.welcome.boot_id

    @property
    def connected(self) -> bool:
        return self._ws is not None

    async def wait_connections(self, count: int) -> None:
        """Wait until the client has connected `count` times in all (`connections`): after a
        lost connection, `wait_connections(client.connections + 1)` waits for the reconnect.
        Raises ConnectionLost if the client stops first."""
        while self.connections < count:
            self._check_usable()
            await self._connected_event.wait()

    def handle(self, chat_id: str, call_id: str) -> CallHandle | None:
        """The unfinished handle this client holds for a call, if any."""
        return self._handles.get((chat_id, call_id))

    # -- requests ----------------------------------------------------------------------------

    async def call(
        self,
        chat_id: str,
        call_id: str,
        tool: str,
        args: dict[str, Any],
        *,
        timeout_ms: int | None = None,
        background: bool = False,
        approval: bool = False,
        stream: bool = True,
    ) -> CallHandle:
        """Send `call` and return once it is `accepted`; raise RequestError on `error`.

        At most once per (chat_id, call_id): a repeat gets the same call's events and its
        saved result. `stream=False` asks only for accepted/approval/result (no output kept).
        """
        rid = next(self._rids)
        message = protocol.Call(
            rid=rid,
            chat_id=chat_id,
            call_id=call_id,
            tool=tool,
            args=args,
            timeout_ms=timeout_ms,
            background=background,
            approval=approval,
            stream=stream,
        )
        handle, created = self._handle_for(chat_id, call_id, stream=stream, offset=0)
        request = _Request(rid, "call", message, handle=handle, created=[handle] if created else [])
        await self._roundtrip(request)
        return handle

    async def attach(self, chat_id: str, call_id: str, from_offset: int = 0) -> CallHandle:
        """Follow an existing call from `from_offset`: retained output, then live events, then
        its result. RequestError("unknown_call") if the agent has no record of it."""
        return await self._attach(chat_id, call_id, from_offset, stream=True)

    async def _attach(
        self, chat_id: str, call_id: str, from_offset: int, *, stream: bool
    ) -> CallHandle:
        rid = next(self._rids)
        message = protocol.Attach(
            rid=rid, chat_id=chat_id, call_id=call_id, from_offset=from_offset
        )
        handle, created = self._handle_for(chat_id, call_id, stream=stream, offset=from_offset)
        request = _Request(
            rid, "attach", message, handle=handle, created=[handle] if created else []
        )
        await self._roundtrip(request)
        return handle

    async def detach(self, chat_id: str, call_id: str) -> None:
        """Stop following a call (it goes on). Its handle fails with `Detached`. The agent does
        not answer a detach; an `unknown_call` error for it lands in `errors`."""
        self._check_usable()
        handle = self._handles.pop((chat_id, call_id), None)
        if handle is not None:
            handle._fail(Detached(f"detached from {chat_id!r}/{call_id!r}"))
        ws = self._ws
        if ws is not None and self._ready:  # else the new connection does not follow it
            message = protocol.Detach(rid=next(self._rids), chat_id=chat_id, call_id=call_id)
            await self._send_frame(ws, self._codec.encode(message))

    async def cancel(
        self, chat_id: str, call_ids: Sequence[str]
    ) -> dict[str, protocol.CancelResult]:
        """Cancel calls (PROTOCOL.md 5.3); waits for one `cancel_result` per distinct id.

        A cancel of a running call waits for it to end (SIGTERM, then SIGKILL after the
        agent's grace), so this can take `kill_grace_ms`. Safe to repeat.
        """
        ids = list(dict.fromkeys(call_ids))
        if not ids:
            return {}
        rid = next(self._rids)
        message = protocol.Cancel(rid=rid, chat_id=chat_id, call_ids=ids)
        request = _Request(rid, "cancel", message, cancel_ids=ids)
        await self._roundtrip(request)
        return {call_id: request.cancel_results[call_id] for call_id in ids}

    async def cancel_and_collect(
        self, chat_id: str, call_ids: Sequence[str]
    ) -> dict[str, protocol.Result]:
        """Cancel many calls at once and map each id to its truthful final result: `not_run`
        for one that never ran (also an id the agent never saw), `canceled` with the output
        so far for one that was running, and the real result for one that had finished."""
        return {
            call_id: reply.result
            for call_id, reply in (await self.cancel(chat_id, call_ids)).items()
        }

    async def approve(
        self,
        chat_id: str,
        call_id: str,
        approved: bool,
        reason: str | None = None,
        scope: Literal["call", "chat"] = "call",
    ) -> protocol.ApprovalResolved:
        """Answer a parked approval gate; returns the `approval_resolved` that closed it.

        `scope="chat"` with `approved=True` approves the call's tool for the whole chat
        (PROTOCOL.md 9.5): its other parked gates open too, and later calls of it run with no
        gate. `reason` goes with a denial into the call's `denied` text.

        The agent sends no direct reply to a successful `approve`: the approving connection,
        like every follower of the call, gets `approval_resolved` (docs/protocol.md), and a
        failed one gets an `error` with our rid. So this waits for whichever comes first: an
        `approval_resolved` for this call with our decision, or the error, raised as
        RequestError (`not_parked`, `unknown_call`).

        Caveat: if another client answers the same gate the same way at the same moment, its
        `approval_resolved` may be taken for ours (the effect is the one asked for; our late
        `not_parked` then lands in `errors`). A different decision is never mistaken for ours.
        `approve` is not idempotent, so it is not re-sent: one in flight when the connection
        drops raises ConnectionLost (the call's events and result tell what happened).
        """
        rid = next(self._rids)
        message = protocol.Approve(
            rid=rid, chat_id=chat_id, call_id=call_id, approved=approved, reason=reason, scope=scope
        )
        request = _Request(rid, "approve", message)
        await self._roundtrip(request)
        assert request.resolved is not None
        return request.resolved

    def approvals(self) -> AsyncIterator[protocol.Approval]:
        """Every `approval` this client receives, from any call it follows (also the calls of
        `stream=False` turns), once per gate, in arrival order; ends when the client closes.
        Approvals are kept from the start, so none is missed by iterating late; the iterator
        is shared: consume it from one task."""
        return self._approvals

    async def turn(
        self,
        chat_id: str,
        turn_id: str,
        calls: Sequence[CallSpecLike],
        stream: bool = True,
    ) -> TurnHandle:
        """Run a batch with the read/write planner (PROTOCOL.md 5.6). Returns once the plan
        (and, with stream=True, every call's `accepted`) arrived; RequestError on `error`.
        With stream=True, `handle.calls[call_id]` follows each call."""
        specs: list[protocol.CallSpec] = []
        for spec in calls:
            if isinstance(spec, protocol.CallSpec):
                specs.append(spec)
                continue
            try:
                specs.append(msgspec.convert(spec, protocol.CallSpec))
            except msgspec.ValidationError as exc:
                raise ValueError(f"bad call spec {spec!r}: {exc}") from None
        rid = next(self._rids)
        message = protocol.Turn(
            rid=rid, chat_id=chat_id, turn_id=turn_id, calls=specs, stream=stream
        )
        existing = self._turns.get((chat_id, turn_id))
        if existing is not None and not existing.done:
            # A repeat of a turn this client follows: the agent attaches it (plan again, the
            # same calls' events); our handles follow them already. An error (a `conflict`
            # for other calls) fails only this request, not the turn we have.
            await self._roundtrip(_Request(rid, "turn", message))
            return existing
        turn = TurnHandle(chat_id, turn_id, message)
        created: list[CallHandle] = []
        if stream:
            for spec in specs:
                handle, new = self._handle_for(chat_id, spec.call_id, stream=True, offset=0)
                turn.calls[spec.call_id] = handle
                if new:
                    created.append(handle)
        request = _Request(rid, "turn", message, turn=turn, created=created)
        await self._roundtrip(request)
        for handle in turn.calls.values():
            await handle.wait_accepted()
        return turn

    async def interrupt(self, chat_id: str, turn_id: str | None = None) -> list[str]:
        """Cancel every unresolved call of the chat (or of one turn); returns once the agent
        says the chat is quiet (`interrupted`), with the ids of the calls it ended."""
        rid = next(self._rids)
        message = protocol.Interrupt(rid=rid, chat_id=chat_id, turn_id=turn_id)
        request = _Request(rid, "interrupt", message)
        await self._roundtrip(request)
        assert request.interrupted is not None
        return request.interrupted.call_ids

    async def aclose(self) -> None:
        """Close the connection and stop. Calls on the agent go on; every waiting request and
        unfinished handle of this client fails with ConnectionLost."""
        if self._closing:
            return
        self._closing = True
        ws, stream = self._ws, self._stream
        if ws is not None and stream is not None:
            if trio.current_effective_deadline() == -math.inf:
                # We are being cancelled, and so is trio-websocket's reader, which would have
                # to receive the agent's answer to a close frame: just drop the connection.
                await trio.aclose_forcefully(stream)
            else:
                with trio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                    await ws.aclose()
        self._fail_all(ConnectionLost("the client was closed"))
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- request plumbing --------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._fatal is not None:
            raise ConnectionLost(f"the client cannot send: {self._fatal}") from self._fatal

    def _handle_for(
        self, chat_id: str, call_id: str, *, stream: bool, offset: int
    ) -> tuple[CallHandle, bool]:
        """The unfinished handle of a call, or a new one (registered on send)."""
        handle = self._handles.get((chat_id, call_id))
        if handle is not None and not handle.done:
            handle.stream = handle.stream or stream
            return handle, False
        return CallHandle(chat_id, call_id, stream=stream, offset=offset), True

    def _encode_checked(self, message: Any) -> str | bytes:
        frame = self._codec.encode(message)
        size = len(frame.encode()) if isinstance(frame, str) else len(frame)
        limit = self._welcome.limits.max_message_bytes if self._welcome else None
        if limit is not None and size > limit:
            raise MessageTooBig(
                f"{type(message).__name__.lower()} message of {size} bytes exceeds the agent's "
                f"max_message_bytes ({limit})"
            )
        return frame

    async def _roundtrip(self, request: _Request) -> None:
        """Register, send, and wait for the reply; raise the request's error if it failed."""
        self._check_usable()
        request.frame = self._encode_checked(request.message)
        self._pending[request.rid] = request
        for handle in request.created:
            self._handles[(handle.chat_id, handle.call_id)] = handle
        if request.turn is not None:
            self._turns[(request.turn.chat_id, request.turn.turn_id)] = request.turn
        completed = False
        try:
            await self._send_request(request)
            await request.done.wait()
            completed = True
        finally:
            if not completed:
                self._abandon(request)
        if request.error is not None:
            raise request.error

    def _abandon(self, request: _Request) -> None:
        """The caller stopped waiting (cancelled): forget what only this request wanted."""
        self._pending.pop(request.rid, None)
        for handle in request.created:
            key = (handle.chat_id, handle.call_id)
            if self._handles.get(key) is handle and handle._accepted is None:
                del self._handles[key]
        turn = request.turn
        if turn is not None and turn.segments is None:
            key = (turn.chat_id, turn.turn_id)
            if self._turns.get(key) is turn:
                del self._turns[key]

    async def _send_request(self, request: _Request, *, force: bool = False) -> None:
        ws = self._ws
        if ws is None or not (self._ready or force):
            return  # between connections, or while resubscribing: `_resubscribe` sends it
        request.sent_gen = self._gen
        frame = request.frame
        request.frame = None
        if frame is None:
            try:
                frame = self._encode_checked(request.message)
            except MessageTooBig as exc:  # the new agent has a smaller limit
                self._pending.pop(request.rid, None)
                request.finish(exc)
                return
        await self._send_frame(ws, frame)

    async def _send_frame(self, ws: WebSocketConnection, frame: str | bytes) -> None:
        # On failure the reader sees the loss; the request is re-sent or failed after it.
        with contextlib.suppress(
            ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError
        ):
            await ws.send_message(frame)

    # -- the reader ---------------------------------------------------------------------------

    def _dispatch(self, message: Any) -> None:
        """Route one agent message. Synchronous: the reader never waits for a consumer."""
        if isinstance(
            message,
            protocol.Output
            | protocol.Started
            | protocol.ResultMessage
            | protocol.Approval
            | protocol.ApprovalResolved,
        ):
            self._on_call_event(message)
        elif isinstance(message, protocol.Accepted):
            self._on_accepted(message)
        elif isinstance(message, protocol.CancelResult):
            request = self._pending.get(message.rid) if isinstance(message.rid, int) else None
            if request is not None and request.kind == "cancel":
                request.cancel_results[message.call_id] = message
                if all(call_id in request.cancel_results for call_id in request.cancel_ids):
                    del self._pending[request.rid]
                    request.finish()
        elif isinstance(message, protocol.TurnPlan):
            turn = self._turns.get((message.chat_id, message.turn_id))
            if turn is not None:
                turn._on_plan(message.segments)
            request = self._pending.get(message.rid) if isinstance(message.rid, int) else None
            if request is not None and request.kind == "turn":
                del self._pending[request.rid]
                request.finish()
        elif isinstance(message, protocol.TurnResult):
            turn = self._turns.pop((message.chat_id, message.turn_id), None)
            if turn is not None:
                turn._on_results(message.results)
        elif isinstance(message, protocol.Interrupted):
            request = self._pending.get(message.rid) if isinstance(message.rid, int) else None
            if request is not None and request.kind == "interrupt":
                del self._pending[request.rid]
                request.interrupted = message
                request.finish()
        elif isinstance(message, protocol.Error):
            self._on_error(message)
        elif isinstance(message, protocol.Welcome):
            pass  # only the first message of a connection; handled by _session
        else:  # pragma: no cover - the decoder only yields the types above
            log.warning("unexpected message from the agent: %r", message)

    def _on_accepted(self, message: protocol.Accepted) -> None:
        request = self._pending.get(message.rid) if isinstance(message.rid, int) else None
        if request is not None and request.handle is not None:
            del self._pending[request.rid]
            request.handle._on_accepted(message, self._gen)
            request.finish()
            return
        if message.rid is None:  # a call of a turn: "as if sent as a call" (PROTOCOL.md 5.0)
            handle = self._handles.get((message.chat_id, message.call_id))
            if handle is not None:
                handle._on_accepted(message, self._gen)

    def _on_call_event(self, message: Any) -> None:
        key = (message.chat_id, message.call_id)
        if isinstance(message, protocol.Approval):
            if key not in self._open_gates:
                self._open_gates.add(key)
                self._approvals.put(message)
        elif isinstance(message, protocol.ApprovalResolved):
            self._open_gates.discard(key)
            self._gate_closed(key, message)
        elif isinstance(message, protocol.ResultMessage):
            self._open_gates.discard(key)
        handle = self._handles.get(key)
        # Events count only after this connection accepted the handle's request: anything
        # earlier belongs to an earlier request for the same call (an ended handle).
        if handle is None or handle._live_gen != self._gen:
            return
        handle._on_event(message)
        if handle.done:
            del self._handles[key]

    def _gate_closed(self, key: _Key, message: protocol.ApprovalResolved) -> None:
        for request in list(self._pending.values()):
            if request.kind != "approve" or request.sent_gen is None:
                continue
            approve: protocol.Approve = request.message
            if (approve.chat_id, approve.call_id) != key:
                continue
            # Another decision closed the gate first: our error (not_parked) is on its way.
            if message.decision == ("approved" if approve.approved else "denied"):
                del self._pending[request.rid]
                request.resolved = message
                request.finish()

    def _on_error(self, message: protocol.Error) -> None:
        request = self._pending.pop(message.rid, None) if isinstance(message.rid, int) else None
        if request is None:
            log.warning(
                "error from the agent for no request of ours: %s: %s", message.code, message.message
            )
            self.errors.append(message)
            del self.errors[:-MAX_KEPT_ERRORS]
            return
        error = RequestError(message.code, message.message, message)
        for handle in request.created:
            key = (handle.chat_id, handle.call_id)
            if handle._accepted is None:
                if self._handles.get(key) is handle:
                    del self._handles[key]
                handle._fail(error)
        if request.internal and request.handle is not None:
            # A re-attach failed (the agent no longer knows the call): the handle cannot end.
            key = (request.handle.chat_id, request.handle.call_id)
            if self._handles.get(key) is request.handle:
                del self._handles[key]
            request.handle._fail(error)
        turn = request.turn
        if turn is not None and (turn.segments is None or request.internal):
            key = (turn.chat_id, turn.turn_id)
            if self._turns.get(key) is turn:
                del self._turns[key]
            turn._fail(error)
        request.finish(error)

    # -- connections --------------------------------------------------------------------------

    async def _run(self) -> None:
        """Connect, read until the connection is lost, reconnect with backoff; until closed."""
        attempt = 0
        while not self._stopping():
            before = self.connections
            failure: BaseException | None = None
            try:
                await self._session()
            except* ConnectionRejected as group:
                rejected = _leaf(group)
                assert isinstance(rejected, ConnectionRejected)
                failure = ConnectError(rejected.status_code, rejected.body or b"")
            except* _CONNECTION_ERRORS as group:
                failure = _leaf(group)
            if self._stopping():
                return
            if self.connections == 0:
                if isinstance(failure, ConnectError):
                    self._fatal = failure
                else:
                    self._fatal = ConnectError(None, detail=repr(failure))
                    self._fatal.__cause__ = failure
                self._first_settled.set()
                return
            if self.connections > before:
                attempt = 0
            if (
                isinstance(failure, ConnectError)
                and failure.status_code is not None
                and not _retryable_status(failure.status_code)
            ):
                log.error("reconnecting to %s was refused: %s", self.url, failure)
                self._fail_all(failure)
                return
            if not self.reconnect:
                self._fail_all(ConnectionLost(f"the connection to {self.url} was lost"))
                return
            delay = min(self.backoff_max_s, self.backoff_initial_s * 2**attempt)
            delay *= random.uniform(0.5, 1.0)  # jitter: replicas do not reconnect in lockstep
            attempt = min(attempt + 1, 32)  # 2**32 * initial is past any cap
            why = "" if failure is None else f" ({failure!r})"
            log.info("connection to %s lost%s; reconnecting in %.2f s", self.url, why, delay)
            await trio.sleep(delay)

    def _stopping(self) -> bool:
        return self._closing  # a method, so that type checkers re-read it after each await

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
                self._connected(ws, stream, welcome)
                async with trio.open_nursery() as helpers:
                    helpers.start_soon(self._resubscribe, self._gen)
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

    async def _receive_welcome(self, ws: WebSocketConnection) -> protocol.Welcome:
        frame = await ws.get_message()
        try:
            message = self._codec.decode(frame)
        except MessageError as exc:
            raise _BadWelcome(f"undecodable first message: {exc}") from None
        if not isinstance(message, protocol.Welcome):
            raise _BadWelcome(f"expected welcome, got {type(message).__name__}")
        return message

    def _connected(
        self, ws: WebSocketConnection, stream: trio.abc.Stream, welcome: protocol.Welcome
    ) -> None:
        previous = self._welcome
        self._gen += 1
        self._ws = ws
        self._stream = stream
        self._welcome = welcome
        self.connections += 1
        # Nothing to resume (the first connection): requests may go out at once.
        self._ready = not (self._pending or self._handles or self._turns)
        self._connected_event.set()
        self._connected_event = trio.Event()
        if previous is not None and previous.boot_id != welcome.boot_id:
            log.warning(
                "agent %s restarted (boot %s -> %s); resuming from its journal",
                welcome.agent_id,
                previous.boot_id,
                welcome.boot_id,
            )
        self._first_settled.set()

    def _disconnected(self, stream: trio.abc.Stream) -> None:
        if self._stream is not stream:
            return  # not connected on this stream, or already handled
        self._ws = None
        self._stream = None
        self._ready = False
        for request in list(self._pending.values()):
            if request.kind == "approve" and request.sent_gen is not None:
                del self._pending[request.rid]
                request.finish(
                    ConnectionLost(
                        "the connection was lost while an approve was in flight; it may or may "
                        "not have been applied (the call's events and result will tell)"
                    )
                )

    async def _read(self, ws: WebSocketConnection) -> None:
        while True:
            try:
                frame = await ws.get_message()
            except ConnectionClosed as exc:
                log.debug("connection closed: %s", exc.reason)
                return
            try:
                message = self._codec.decode(frame)
            except MessageError as exc:
                # A newer agent may send what we do not know; skip it rather than drop the link.
                log.warning("undecodable message from the agent, skipped: %s", exc)
                continue
            self._dispatch(message)

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

    async def _resubscribe(self, gen: int) -> None:
        """After a (re)connect: follow again what is unfinished, then re-send what is unanswered.

        Until this is done, new requests are not sent directly but left to this loop, which
        sends them after the older ones: everything goes out in request order, as it would have
        without the reconnect. Order can matter: a `cancel` of an id followed by a `call` of it
        is a call that must not run. The loop ends (and requests go out directly again) once a
        pass finds nothing left to send.
        """
        first = True
        while gen == self._gen and not self._closing:
            unsent = sorted(
                (r for r in self._pending.values() if r.sent_gen != gen), key=lambda r: r.rid
            )
            if first:
                first = False
                await self._refollow(unsent, gen)
            elif not unsent:
                self._ready = True
                return
            for request in unsent:
                if request.kind == "attach" and request.handle is not None:
                    attach: protocol.Attach = request.message
                    handle = request.handle
                    attach.from_offset = handle._cursor.resume_offset if handle.stream else 0
                elif request.kind == "cancel":
                    cancel: protocol.Cancel = request.message
                    cancel.call_ids = [
                        i for i in request.cancel_ids if i not in request.cancel_results
                    ]
                await self._resend(request, gen)

    async def _refollow(self, unsent: list[_Request], gen: int) -> None:
        """Follow again every unfinished turn and call that no unsent request will cover."""
        covered: set[object] = {r.handle or r.turn for r in unsent if r.kind in _SUBSCRIBING}
        for turn in list(self._turns.values()):
            if turn in covered or turn.done:
                continue
            rid = next(self._rids)
            message = msgspec.structs.replace(turn._message, rid=rid)
            await self._resend(_Request(rid, "turn", message, turn=turn, internal=True), gen)
        # After the turns: their re-sent `turn` moved each call's cursor back to 0, and the
        # attach moves it forward again to what we have.
        for key, handle in list(self._handles.items()):
            if handle in covered or handle.done or handle._accepted is None:
                continue
            if self._handles.get(key) is not handle:
                continue  # detached meanwhile
            rid = next(self._rids)
            reattach = protocol.Attach(
                rid=rid,
                chat_id=handle.chat_id,
                call_id=handle.call_id,
                from_offset=handle._cursor.resume_offset if handle.stream else 0,
            )
            request = _Request(rid, "attach", reattach, handle=handle, internal=True)
            await self._resend(request, gen)

    async def _resend(self, request: _Request, gen: int) -> None:
        if gen != self._gen or self._closing:
            return  # that connection is gone already; the next one starts over
        if request.internal:
            self._pending[request.rid] = request
        elif self._pending.get(request.rid) is not request:
            return  # answered, failed or abandoned meanwhile
        request.frame = None
        await self._send_request(request, force=True)

    def _fail_all(self, error: BaseException) -> None:
        self._fatal = self._fatal or error
        for request in list(self._pending.values()):
            request.finish(error)
        self._pending.clear()
        for handle in list(self._handles.values()):
            handle._fail(error)
        self._handles.clear()
        for turn in list(self._turns.values()):
            turn._fail(error)
        self._turns.clear()
        self._approvals.close()
        self._connected_event.set()


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
    failed: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            client._nursery = nursery
            nursery.start_soon(client._run)
            await client._first_settled.wait()
            if client.connections == 0:
                failed = client._fatal
                nursery.cancel_scope.cancel()
            else:
                try:
                    yield client
                finally:
                    await client.aclose()
    except BaseExceptionGroup as group:
        # The nursery wraps whatever the caller's block raised; hand back the caller's own
        # exception when it is the only one, as a plain `async with` would.
        single = _single_leaf(group)
        if single is None:
            raise
        raise single from single.__cause__
    if failed is not None:
        raise failed
