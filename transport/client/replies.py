"""How each message from the agent changes `ClientState` (part of the state machine, pure: no
I/O, no event loop): a reply by `rid` resolves our request, a call event goes to the call's
handle (once per byte, once per event, see handles.py), an approval to the approvals stream.

What a message changes is only the client's tables (`ReplyTables`): its pending requests, its
handles, its open gates. `ClientState` has them and calls `apply`; this module names them by
that protocol and never imports state.py, so imports between the two point one way."""

from __future__ import annotations

import logging
from typing import Any, Final, Protocol

from toolwire.transport import protocol
from toolwire.transport.client.errors import request_error
from toolwire.transport.client.handles import CallHandle, Mailbox, TurnHandle
from toolwire.transport.client.requests import Key, RequestState

__all__ = ["MAX_KEPT_ERRORS", "ReplyTables", "apply"]

log = logging.getLogger("toolwire.client")

# Unmatched `error` messages kept in `ClientState.errors`; the oldest go first. Each is logged.
MAX_KEPT_ERRORS: Final = 1000
_CALL_EVENTS = (
    protocol.Output,
    protocol.Started,
    protocol.ResultMessage,
    protocol.Approval,
    protocol.ApprovalResolved,
)


class ReplyTables(Protocol):
    """The part of `ClientState` (state.py) that a message from the agent reads and changes."""

    @property
    def gen(self) -> int:
        """The current connection: events count only on it."""

    @property
    def pending(self) -> dict[int, RequestState]:
        """Our requests still waiting for their answer, by rid."""

    @property
    def handles(self) -> dict[Key, CallHandle]:
        """The calls we follow, by (chat_id, call_id)."""

    @property
    def turns(self) -> dict[Key, TurnHandle]:
        """The turns we follow, by (chat_id, turn_id)."""

    @property
    def open_gates(self) -> set[Key]:
        """Approval gates we saw open and not close."""

    @property
    def approvals(self) -> Mailbox[protocol.Approval]:
        """Where each gate's `approval` goes, once."""

    @property
    def errors(self) -> list[protocol.Error]:
        """The errors that answer no request of ours (the newest MAX_KEPT_ERRORS)."""


def apply(state: ReplyTables, message: Any) -> None:
    """Route one decoded agent message: replies by `rid` to our requests, call events by
    `(chat_id, call_id)` to handles, approvals to the approvals stream."""
    rid = message.rid if isinstance(getattr(message, "rid", None), int) else None
    request = state.pending.get(rid) if rid is not None else None
    if isinstance(message, _CALL_EVENTS):
        _on_call_event(state, message)
    elif isinstance(message, protocol.Accepted):
        if request is not None and request.handle is not None:
            del state.pending[request.rid]
            request.handle.feed_accepted(message, state.gen)
            request.finish()
        elif message.rid is None:  # a call of a turn: "as if sent as a call" (5.0)
            handle = state.handles.get((message.chat_id, message.call_id))
            if handle is not None:
                handle.feed_accepted(message, state.gen)
    elif isinstance(message, protocol.CancelResult):
        if request is not None and request.kind == "cancel":
            request.cancel_results[message.call_id] = message
            if all(call_id in request.cancel_results for call_id in request.cancel_ids):
                del state.pending[request.rid]
                request.finish()
    elif isinstance(message, protocol.TurnPlan):
        turn = state.turns.get((message.chat_id, message.turn_id))
        if turn is not None:
            turn.feed_plan(message.segments)
        if request is not None and request.kind == "turn":
            del state.pending[request.rid]
            request.finish()
    elif isinstance(message, protocol.TurnResult):
        ended = state.turns.pop((message.chat_id, message.turn_id), None)
        if ended is not None:
            ended.feed_results(message.results)
    elif isinstance(message, protocol.Interrupted):
        if request is not None and request.kind == "interrupt":
            del state.pending[request.rid]
            request.interrupted = message
            request.finish()
    elif isinstance(message, protocol.ChatClosed):
        if request is not None and request.kind == "close_chat":
            del state.pending[request.rid]
            request.chat_closed = message
            request.finish()
    elif isinstance(message, protocol.ToolDefinitions):
        if request is not None and request.kind == "describe_tools":
            del state.pending[request.rid]
            request.tool_definitions = message
            request.finish()
    elif isinstance(message, protocol.Error):
        _on_error(state, message, request)
    # A `welcome` is only the first message of a connection (the shell reads it), and the
    # decoder yields no other types.


def _on_call_event(state: ReplyTables, message: Any) -> None:
    key = (message.chat_id, message.call_id)
    if isinstance(message, protocol.Approval):
        if key not in state.open_gates:
            state.open_gates.add(key)
            state.approvals.put(message)
    elif isinstance(message, protocol.ApprovalResolved):
        state.open_gates.discard(key)
        _gate_closed(state, key, message)
    elif isinstance(message, protocol.ResultMessage):
        state.open_gates.discard(key)
    handle = state.handles.get(key)
    # Events count only after this connection accepted the handle's request: anything
    # earlier belongs to an earlier request for the same call (an ended handle).
    if handle is None or handle.live_gen != state.gen:
        return
    handle.feed_event(message)
    if handle.done:
        del state.handles[key]


def _gate_closed(state: ReplyTables, key: Key, message: protocol.ApprovalResolved) -> None:
    """An `approve` of ours is answered by the `approval_resolved` carrying our decision
    (docs/protocol.md: there is no direct reply). Another decision closed the gate first
    if it differs: then our error (`not_parked`) is on its way."""
    for request in list(state.pending.values()):
        if request.kind != "approve" or request.sent_gen is None:
            continue
        approve: protocol.Approve = request.message
        if (approve.chat_id, approve.call_id) != key:
            continue
        if message.decision == ("approved" if approve.approved else "denied"):
            del state.pending[request.rid]
            request.resolved = message
            request.finish()


def _on_error(state: ReplyTables, message: protocol.Error, request: RequestState | None) -> None:
    if request is None:
        log.warning(
            "error from the agent for no request of ours: %s: %s", message.code, message.message
        )
        state.errors.append(message)
        del state.errors[:-MAX_KEPT_ERRORS]
        return
    del state.pending[request.rid]
    error = request_error(message.code, message.message, message)
    for handle in request.created:
        key = (handle.chat_id, handle.call_id)
        if not handle.was_accepted:
            if state.handles.get(key) is handle:
                del state.handles[key]
            handle.feed_failure(error)
    if request.internal and request.handle is not None:
        # A re-attach failed (the agent no longer knows the call): the handle cannot end.
        key = (request.handle.chat_id, request.handle.call_id)
        if state.handles.get(key) is request.handle:
            del state.handles[key]
        request.handle.feed_failure(error)
    turn = request.turn
    if turn is not None and (turn.segments is None or request.internal):
        key = (turn.chat_id, turn.turn_id)
        if state.turns.get(key) is turn:
            del state.turns[key]
        turn.feed_failure(error)
    request.finish(error)
