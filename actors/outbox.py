"""Per-connection outboxes and per-call subscriptions: how events reach followers.

A connection that calls or attaches to a call follows it through a `Subscription`, which holds a
cursor into the call's output buffer. Output is never copied into a queue: the connection's
sender pulls it from the cursor when the socket can take more. So a slow or stalled connection
never blocks a process, another chat or another connection, and memory is bounded by the calls'
retention buffers, not by queues (DESIGN.md, "How a request flows" step 4).

The outbox's queue holds only discrete events (a handful per request) and at most one "output
ready" marker per subscription. Per call and connection the order is: `accepted` first, then
approval / started / output in order, and each `result` after all output before it. A request
for a call that has ended replays from an offset of its own, carried by its queued result, so
it never moves (or skips) what the live cursor still owes (PROTOCOL.md 9.9).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable

import trio

from toolwire.actors.events import (
    AcceptedEvent,
    ApprovalEvent,
    ApprovalResolvedEvent,
    Event,
    OutputEvent,
    ResultEvent,
    StartedEvent,
)
from toolwire.actors.output import OutputBuffer

# One `output` message carries at most one large pipe read's worth of text (256 KiB, see
# processes.BULK_PIPE_BYTES): a fast producer costs few messages, and each message costs both ends
# a fixed price (on 2 cores, 64 KiB messages cost the benchmark's client more CPU than the bytes
# did); still small enough that other calls interleave fairly.
OUTPUT_CHUNK_BYTES = 256 * 1024
# On a JSON connection a control character is escaped as six bytes (`\u0001`), so 256 KiB of
# output can make a 1.5 MiB message. Common client libraries refuse messages over 1 MiB by
# default (Python's `websockets`, trio-websocket), so JSON connections get 128 KiB chunks: at
# worst 768 KiB of JSON.
JSON_OUTPUT_CHUNK_BYTES = 128 * 1024
# Output taken in one `take` (whole messages; a result's remaining output may exceed it): bounds
# what one sender batch adds to a connection's write buffer however many calls stream at once.
TAKE_OUTPUT_BYTES = 2 * 1024 * 1024


class _Kind(enum.Enum):
    PLAIN = 0
    OUTPUT = 1
    RESULT = 2
    REPLAY = 3  # a result with the output it replays first, from its own offset (or none)


class Subscription:
    """One connection following one call."""

    __slots__ = (
        "active",
        "approval_sent",
        "buffer",
        "call_id",
        "chat_id",
        "cursor",
        "detached",
        "finished",
        "on_caught_up",
        "outbox",
        "output_pending",
        "replays_pending",
        "resolved_events",
        "results_queued",
        "started_sent",
        "stream",
    )

    def __init__(self, outbox: Outbox, chat_id: str, call_id: str) -> None:
        self.outbox = outbox
        self.chat_id = chat_id
        self.call_id = call_id
        self.cursor = 0
        self.stream = False  # started / output / approval_resolved events
        self.resolved_events = False  # approval_resolved even without stream (turns)
        self.active = True
        self.output_pending = False
        self.buffer: OutputBuffer | None = None
        self.started_sent = False
        self.approval_sent = False  # `approval` goes to a connection once per gate (5.0)
        # True once a result was sent with no request since: no output follows a result.
        self.finished = False
        # The connection sent `detach`: no more started / output / approval events, but every
        # request it made still gets its `accepted` and its one `result` (PROTOCOL.md 9.9).
        self.detached = False
        # Replays of an ended call queued (or being read back) and not sent yet: the output
        # they replay must stay retained until then.
        self.replays_pending = 0
        self.on_caught_up: Callable[[], None] | None = None
        # Results put in the outbox and not taken yet (their output is still to be sent), or
        # being read back from the journal to be put (ChatActor._follow).
        self.results_queued = 0

    @property
    def lagging(self) -> bool:
        """Still owes streamed output that the buffer holds."""
        if not self.active or self.detached or self.outbox.closed:
            return False
        if self.replays_pending:
            return True  # an attach's replay reads the retained output when it is sent
        return (
            self.stream
            and not self.finished
            and self.buffer is not None
            and self.buffer.first_retained(self.cursor) < self.buffer.total
        )

    @property
    def following(self) -> bool:
        """Streaming live output from its cursor for a request that still owes it."""
        return self.active and self.stream and not self.detached and not self.finished

    def output_ready(self) -> None:
        if self.stream and self.active and not self.finished and not self.detached:
            self.outbox.put_output(self)


class Outbox:
    """The queue of one connection. Filled synchronously by actors, drained by one sender."""

    def __init__(self, label: str = "", *, output_chunk_bytes: int = OUTPUT_CHUNK_BYTES) -> None:
        self.label = label
        self.output_chunk_bytes = output_chunk_bytes
        self.closed = False
        # (kind, subscription, event, replay offset: -1 for none)
        self._queue: deque[tuple[_Kind, Subscription | None, Event | None, int]] = deque()
        self._nonempty = trio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, event: Event, sub: Subscription | None = None) -> None:
        if self.closed:
            return
        self._queue.append((_Kind.PLAIN, sub, event, -1))
        self._nonempty.set()

    def put_result(self, sub: Subscription, event: Event) -> None:
        if self.closed:
            return
        sub.results_queued += 1
        self._queue.append((_Kind.RESULT, sub, event, -1))
        self._nonempty.set()

    def put_replay(self, sub: Subscription, event: Event, from_offset: int | None) -> None:
        """The saved result of an ended call for one more request: the retained output from
        `from_offset` first (an `attach`), or none (a repeated `call`). The live cursor is not
        touched: an earlier request's result still queued keeps the output it owes."""
        if self.closed:
            return
        sub.results_queued += 1
        offset = -1 if from_offset is None else from_offset
        self._queue.append((_Kind.REPLAY, sub, event, offset))
        self._nonempty.set()

    def put_output(self, sub: Subscription) -> None:
        if self.closed or sub.output_pending:
            return
        sub.output_pending = True
        self._queue.append((_Kind.OUTPUT, sub, None, -1))
        self._nonempty.set()

    async def wait(self) -> None:
        """Return once there is something to take (or the outbox was closed)."""
        while not self._queue and not self.closed:
            await self._nonempty.wait()
            self._nonempty = trio.Event()

    def close(self) -> None:
        """The connection is gone: drop everything; its subscriptions stop receiving."""
        self.closed = True
        for _, sub, _, _ in self._queue:
            if sub is not None:
                sub.active = False
        self._queue.clear()
        self._nonempty.set()

    def take(self, max_events: int = 256) -> list[Event]:
        """Up to `max_events` events in send order, pulling output from cursors (about
        TAKE_OUTPUT_BYTES of it at most: more stays queued for the next take)."""
        out: list[Event] = []
        queue = self._queue
        output_bytes = 0
        while queue and len(out) < max_events:
            if output_bytes >= TAKE_OUTPUT_BYTES and queue[0][0] is _Kind.OUTPUT:
                break
            kind, sub, event, replay_from = queue.popleft()
            if sub is None:
                assert event is not None
                out.append(event)
                continue
            if kind is _Kind.RESULT or kind is _Kind.REPLAY:
                sub.results_queued -= 1
            if not sub.active:
                continue
            if kind is _Kind.OUTPUT:
                sub.output_pending = False
                cursor = sub.cursor
                if self._read_output(sub, out, once=True):
                    self.put_output(sub)  # more is ready: go round again, after the others
                output_bytes += sub.cursor - cursor
            elif kind is _Kind.RESULT:
                assert event is not None
                if sub.stream and not sub.finished:
                    self._read_output(sub, out, once=False, final_at=_ended_at(event))
                sub.finished = True
                out.append(event)
                if sub.on_caught_up is not None:
                    sub.on_caught_up()  # no output follows: the buffer need not wait for it
            elif kind is _Kind.REPLAY:
                assert event is not None
                if replay_from >= 0:
                    sub.replays_pending -= 1
                    if not sub.detached:  # an attach: its replay brings the output
                        self._replay_output(sub, replay_from, out, _ended_at(event))
                out.append(event)
                if replay_from >= 0 and sub.on_caught_up is not None:
                    sub.on_caught_up()
            else:
                assert event is not None
                if type(event) is AcceptedEvent:  # a reply (the common case): always sent
                    out.append(event)
                    continue
                if sub.detached:
                    continue  # detach stops the call's events, never a reply
                if isinstance(event, StartedEvent):
                    if not sub.stream or sub.started_sent:
                        continue
                    sub.started_sent = True
                elif isinstance(event, ApprovalEvent):
                    if sub.approval_sent:
                        continue
                    sub.approval_sent = True
                elif isinstance(event, ApprovalResolvedEvent) and not (
                    sub.stream or sub.resolved_events
                ):
                    continue
                out.append(event)
        return out

    def _read_output(
        self, sub: Subscription, out: list[Event], *, once: bool, final_at: int | None = None
    ) -> bool:
        """Append output events from the cursor; True if more is ready after `once` read.
        `final_at`: where the call's output ended (see `OutputBuffer.read`)."""
        buffer = sub.buffer
        if buffer is None or sub.finished or not sub.stream or sub.detached:
            return False
        got = False
        while True:
            chunk = buffer.read(sub.cursor, self.output_chunk_bytes, final_at=final_at)
            if chunk is None:
                break
            got = True
            out.append(OutputEvent(sub.chat_id, sub.call_id, chunk.offset, chunk.data))
            sub.cursor = chunk.next_offset
            if once:
                break
        # Only a read that returned something can have more behind it: bytes held back as an
        # incomplete UTF-8 character must not make the sender spin.
        more = got and buffer.first_retained(sub.cursor) < buffer.total
        if not more and sub.on_caught_up is not None:
            sub.on_caught_up()
        return more

    def _replay_output(
        self, sub: Subscription, offset: int, out: list[Event], final_at: int | None
    ) -> None:
        """Append the retained output from `offset` to the end, for one replay."""
        buffer = sub.buffer
        if buffer is None:
            return
        while True:
            chunk = buffer.read(offset, self.output_chunk_bytes, final_at=final_at)
            if chunk is None:
                return
            out.append(OutputEvent(sub.chat_id, sub.call_id, chunk.offset, chunk.data))
            offset = chunk.next_offset


def _ended_at(event: Event) -> int | None:
    """Where the call's output ended, for a `result` event: its `output_bytes`."""
    return event.result.output_bytes if isinstance(event, ResultEvent) else None
