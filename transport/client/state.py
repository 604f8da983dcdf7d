"""ClientState: every decision of the client, sans-IO (no trio, no asyncio, no sockets).

Both shells (`session.py` on trio, `aio.py` on asyncio) feed it what happens (a connection
opened with a `welcome`, a frame arrived, the connection was lost, the caller sent a request or
gave up on one) and carry out what it returns (a frame to send now, or none; a delay before
reconnecting, or stop). Everything that affects what the client sends or what a handle sees
lives here, in the style of h11's connection state: rids; pending requests; call and turn
handles; what a new connection must follow again and re-send, in which order and from which
byte offset; what is failed when; and when to reconnect. Two parts are split out only to keep
modules small: replies.py (how each agent message resolves a request or feeds a handle) and
requests.py (the request record, and backoff as a pure function of attempt and random source).

The one thing it is given from outside is `make_flag` (trio.Event or asyncio.Event, see
handles.py): the handles it completes are awaited by the caller on the shell's loop.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Mapping
from typing import Any

import msgspec

from toolwire.transport import protocol
from toolwire.transport.client import replies
from toolwire.transport.client.errors import (
    ConnectError,
    ConnectionLost,
    Detached,
    MessageTooBig,
    retryable_status,
)
from toolwire.transport.client.handles import CallHandle, FlagFactory, Mailbox, TurnHandle
from toolwire.transport.client.requests import (
    MAX_BACKOFF_ATTEMPT,
    SUBSCRIBING,
    Key,
    Kind,
    RequestState,
    backoff_delay,
)
from toolwire.transport.codec import Codec, MessageError

__all__ = ["ClientState"]

log = logging.getLogger("toolwire.client")


class ClientState:
    """The state of one logical connection to an agent (PROTOCOL.md), across reconnects."""

    def __init__(
        self,
        codec: Codec,
        make_flag: FlagFactory,
        *,
        reconnect: bool = True,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        self.codec = codec
        self.make_flag = make_flag
        self.reconnect = reconnect
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.rng = rng or random.Random()
        self.connections = 0  # successful connects, the first included
        self.errors: list[protocol.Error] = []  # errors that answer no request of ours
        self.welcome: protocol.Welcome | None = None
        self.live = False  # a connection is open
        self.ready = False  # connected and resubscribed: requests may go out directly
        self.gen = 0  # bumps on every connect; events count only on the current one
        self.pending: dict[int, RequestState] = {}
        self.handles: dict[Key, CallHandle] = {}
        self.turns: dict[Key, TurnHandle] = {}
        self.open_gates: set[Key] = set()
        self.approvals: Mailbox[protocol.Approval] = Mailbox(make_flag)
        self.closing = False
        self.fatal: BaseException | None = None
        self.first_settled = make_flag()  # the first connect succeeded or failed for good
        self.connection_changed = make_flag()  # replaced after each connect
        self._rids = itertools.count(1)

    # -- requests ----------------------------------------------------------------------------

    def check_usable(self) -> None:
        if self.fatal is not None:
            raise ConnectionLost(f"the client cannot send: {self.fatal}") from self.fatal

    def _request(self, kind: Kind, message: Any, **fields: Any) -> RequestState:
        return RequestState(message.rid, kind, message, self.make_flag(), **fields)

    def call(self, message: protocol.Call) -> RequestState:
        handle, created = self._handle_for(
            message.chat_id, message.call_id, message.stream, message.from_offset
        )
        return self._request("call", message, handle=handle, created=[handle] if created else [])

    def attach(self, chat_id: str, call_id: str, from_offset: int, stream: bool) -> RequestState:
        message = protocol.Attach(
            rid=self.next_rid(), chat_id=chat_id, call_id=call_id, from_offset=from_offset
        )
        handle, created = self._handle_for(chat_id, call_id, stream, from_offset)
        return self._request("attach", message, handle=handle, created=[handle] if created else [])

    def cancel(self, chat_id: str, ids: list[str]) -> RequestState:
        message = protocol.Cancel(rid=self.next_rid(), chat_id=chat_id, call_ids=ids)
        return self._request("cancel", message, cancel_ids=ids)

    def approve(self, message: protocol.Approve) -> RequestState:
        return self._request("approve", message)

    def interrupt(self, chat_id: str, turn_id: str | None) -> RequestState:
        message = protocol.Interrupt(rid=self.next_rid(), chat_id=chat_id, turn_id=turn_id)
        return self._request("interrupt", message)

    def close_chat(self, chat_id: str) -> RequestState:
        message = protocol.CloseChat(rid=self.next_rid(), chat_id=chat_id)
        return self._request("close_chat", message)

    def describe_tools(self) -> RequestState:
        """PROTOCOL.md 10.3. Changes nothing on the agent: re-sent as it is after a reconnect."""
        message = protocol.DescribeTools(rid=self.next_rid())
        return self._request("describe_tools", message)

    def turn(
        self, message: protocol.Turn, from_offsets: Mapping[str, int] | None = None
    ) -> tuple[RequestState, TurnHandle]:
        """A repeat of a turn this client follows attaches it (plan again, the same calls'
        events): our handles follow them already, and an error (a `conflict` for other calls)
        fails only this request, not the turn we have. `from_offsets`: where each new call
        handle starts (bytes before it are dropped: a resumed caller had them)."""
        existing = self.turns.get((message.chat_id, message.turn_id))
        if existing is not None and not existing.done:
            return self._request("turn", message), existing
        turn = TurnHandle(message.chat_id, message.turn_id, message, self.make_flag)
        created: list[CallHandle] = []
        if message.stream:
            for spec in message.calls:
                offset = (from_offsets or {}).get(spec.call_id, 0)
                handle, new = self._handle_for(message.chat_id, spec.call_id, True, offset)
                turn.calls[spec.call_id] = handle
                if new:
                    created.append(handle)
        return self._request("turn", message, turn=turn, created=created), turn

    def detach(self, chat_id: str, call_id: str) -> str | bytes | None:
        """Stop following a call: its handle fails with `Detached`. Returns the `detach` frame
        to send now, or None (between connections the new one does not follow it anyway)."""
        self.check_usable()
        handle = self.handles.pop((chat_id, call_id), None)
        if handle is not None:
            handle.feed_failure(Detached(f"detached from {chat_id!r}/{call_id!r}"))
        if not (self.live and self.ready):
            return None
        return self.codec.encode(
            protocol.Detach(rid=self.next_rid(), chat_id=chat_id, call_id=call_id)
        )

    def next_rid(self) -> int:
        return next(self._rids)

    def _handle_for(
        self, chat_id: str, call_id: str, stream: bool, offset: int
    ) -> tuple[CallHandle, bool]:
        """The unfinished handle of a call, or a new one (registered on send)."""
        handle = self.handles.get((chat_id, call_id))
        if handle is not None and not handle.done:
            handle.stream = handle.stream or stream
            return handle, False
        new = CallHandle(chat_id, call_id, stream=stream, offset=offset, make_flag=self.make_flag)
        return new, True

    def encode_checked(self, message: Any) -> str | bytes:
        frame = self.codec.encode(message)
        size = len(frame.encode()) if isinstance(frame, str) else len(frame)
        limit = self.welcome.limits.max_message_bytes if self.welcome else None
        if limit is not None and size > limit:
            raise MessageTooBig(
                f"{type(message).__name__.lower()} message of {size} bytes exceeds the agent's "
                f"max_message_bytes ({limit})"
            )
        return frame

    def register(self, request: RequestState) -> None:
        """The caller sends `request`: check it, encode it, and track it and its handles.
        Raises ConnectionLost or MessageTooBig, and then nothing was registered."""
        self.check_usable()
        request.frame = self.encode_checked(request.message)
        self.pending[request.rid] = request
        for handle in request.created:
            self.handles[(handle.chat_id, handle.call_id)] = handle
        if request.turn is not None:
            self.turns[(request.turn.chat_id, request.turn.turn_id)] = request.turn

    def abandon(self, request: RequestState) -> None:
        """The caller stopped waiting (cancelled): forget what only this request wanted."""
        self.pending.pop(request.rid, None)
        for handle in request.created:
            key = (handle.chat_id, handle.call_id)
            if self.handles.get(key) is handle and not handle.was_accepted:
                del self.handles[key]
        turn = request.turn
        if turn is not None and turn.segments is None:
            key = (turn.chat_id, turn.turn_id)
            if self.turns.get(key) is turn:
                del self.turns[key]

    def frame_to_send(self, request: RequestState, *, force: bool = False) -> str | bytes | None:
        """The frame to send for `request` on the current connection now, or None: between
        connections, or while resubscribing (unless `force`), the resubscribe pass sends it."""
        if not self.live or not (self.ready or force):
            return None
        request.sent_gen = self.gen
        frame, request.frame = request.frame, None
        if frame is None:
            try:
                frame = self.encode_checked(request.message)
            except MessageTooBig as exc:  # the new agent has a smaller limit
                self.pending.pop(request.rid, None)
                request.finish(exc)
                return None
        return frame

    # -- connections ---------------------------------------------------------------------------

    def on_connected(self, welcome: protocol.Welcome) -> int:
        """A connection opened with `welcome`; returns its generation (for `resubscribe`)."""
        previous = self.welcome
        self.gen += 1
        self.live = True
        self.welcome = welcome
        self.connections += 1
        # Nothing to resume (the first connection): requests may go out at once.
        self.ready = not (self.pending or self.handles or self.turns)
        self.connection_changed.set()
        self.connection_changed = self.make_flag()
        if previous is not None and previous.boot_id != welcome.boot_id:
            log.warning(
                "agent %s restarted (boot %s -> %s); resuming from its journal",
                welcome.agent_id,
                previous.boot_id,
                welcome.boot_id,
            )
        self.first_settled.set()
        return self.gen

    def on_disconnected(self) -> None:
        """The connection is gone. `approve` is not idempotent, so one in flight fails: it may
        or may not have been applied. Everything else waits for the next connection."""
        if not self.live:
            return
        self.live = False
        self.ready = False
        for request in list(self.pending.values()):
            if request.kind == "approve" and request.sent_gen is not None:
                del self.pending[request.rid]
                request.finish(
                    ConnectionLost(
                        "the connection was lost while an approve was in flight; it may or may "
                        "not have been applied (the call's events and result will tell)"
                    )
                )

    def resubscribe(self, gen: int, first: bool) -> list[RequestState] | None:
        """The next requests to send on connection `gen` (each through `resend_frame`), or None
        once nothing is left: then requests go out directly again (`ready`).

        Until then, new requests are not sent directly but left to this pass, which sends them
        after the older ones: everything goes out in request order, as it would have without
        the reconnect. Order can matter: a `cancel` of an id followed by a `call` of it is a
        call that must not run. The first pass also follows again every unfinished turn and
        call that no unsent request will cover: the turns first (a re-sent `turn` moves each
        call's cursor back to 0), then the attaches, which move it forward to what we have.
        """
        if gen != self.gen or self.closing:
            return None
        unsent = sorted(
            (r for r in self.pending.values() if r.sent_gen != gen), key=lambda r: r.rid
        )
        if not first and not unsent:
            self.ready = True
            return None
        if not first:
            return unsent
        covered: set[object] = {r.handle or r.turn for r in unsent if r.kind in SUBSCRIBING}
        refollow: list[RequestState] = []
        for turn in self.turns.values():
            if turn not in covered and not turn.done:
                again = msgspec.structs.replace(turn.message, rid=self.next_rid())
                refollow.append(self._request("turn", again, turn=turn, internal=True))
        for handle in self.handles.values():
            if handle in covered or handle.done or not handle.was_accepted:
                continue
            reattach = protocol.Attach(
                rid=self.next_rid(),
                chat_id=handle.chat_id,
                call_id=handle.call_id,
                from_offset=handle.resume_offset,
            )
            refollow.append(self._request("attach", reattach, handle=handle, internal=True))
        return refollow + unsent

    def resend_frame(self, request: RequestState, gen: int) -> str | bytes | None:
        """The frame that re-sends `request` on connection `gen`, or None if nothing is to be
        sent: that connection is gone, or the request was answered, failed or abandoned, or
        (a re-follow) its handle ended or was detached meanwhile."""
        if gen != self.gen or self.closing:
            return None  # that connection is gone already; the next one starts over
        if request.internal:
            handle = request.handle
            if handle is not None and (
                handle.done or self.handles.get((handle.chat_id, handle.call_id)) is not handle
            ):
                return None
            if request.turn is not None and request.turn.done:
                return None
            self.pending[request.rid] = request
        elif self.pending.get(request.rid) is not request:
            return None
        elif request.kind == "attach" and request.handle is not None:
            request.message.from_offset = request.handle.resume_offset
        elif request.kind == "cancel":
            request.message.call_ids = [
                i for i in request.cancel_ids if i not in request.cancel_results
            ]
        request.frame = None
        return self.frame_to_send(request, force=True)

    # -- what the agent sends -----------------------------------------------------------------

    def receive(self, frame: str | bytes) -> None:
        """Apply one message from the agent (see replies.py). Synchronous: the reader never
        waits for a consumer (handles queue without bound what their caller has not consumed)."""
        try:
            message = self.codec.decode(frame)
        except MessageError as exc:
            # A newer agent may send what we do not know; skip it rather than drop the link.
            log.warning("undecodable message from the agent, skipped: %s", exc)
            return
        replies.apply(self, message)

    def begin_close(self) -> bool:
        """The caller closes the client; False if it was closing already."""
        if self.closing:
            return False
        self.closing = True
        return True

    def after_loss(
        self, failure: BaseException | None, connections_before: int, attempt: int
    ) -> tuple[float, int] | None:
        """A connection (attempt) ended with `failure`. Returns (delay, next attempt) to
        reconnect after, or None to stop: closing, the first connect failed (then `fatal` says
        why), reconnecting is refused for good (every request and handle fails), or off."""
        if self.closing:
            return None
        if self.connections == 0:
            if isinstance(failure, ConnectError):
                self.fatal = failure
            else:
                self.fatal = ConnectError(None, detail=repr(failure))
                self.fatal.__cause__ = failure
            self.first_settled.set()
            return None
        if self.connections > connections_before:
            attempt = 0
        if (
            isinstance(failure, ConnectError)
            and failure.status_code is not None
            and not retryable_status(failure.status_code)
        ):
            log.error("reconnecting was refused: %s", failure)
            self.fail_all(failure)
            return None
        if not self.reconnect:
            self.fail_all(ConnectionLost("the connection to the agent was lost"))
            return None
        delay = backoff_delay(attempt, self.backoff_initial_s, self.backoff_max_s, self.rng)
        why = "" if failure is None else f" ({failure!r})"
        log.info("connection lost%s; reconnecting in %.2f s", why, delay)
        return delay, min(attempt + 1, MAX_BACKOFF_ATTEMPT)

    def fail_all(self, error: BaseException) -> None:
        self.fatal = self.fatal or error
        for request in list(self.pending.values()):
            request.finish(error)
        self.pending.clear()
        for handle in list(self.handles.values()):
            handle.feed_failure(error)
        self.handles.clear()
        for turn in list(self.turns.values()):
            turn.feed_failure(error)
        self.turns.clear()
        self.approvals.close()
        self.connection_changed.set()
