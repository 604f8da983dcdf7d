"""Approval gates: a gated call parks until it is approved, denied, canceled or expires.

Announcing a gate sends its `approval` event to the call's followers; resolving it (once)
wakes the parked call and tells them how it ended. Answering it (an `approve`) resolves it and
runs or denies the call; an approval with scope "chat" (PROTOCOL.md 9.5) answers every gate of
its tool parked in the chat, and the chat lets later calls of that tool pass without one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from toolwire.actors.events import ApprovalEvent, ApprovalResolvedEvent
from toolwire.actors.outbox import Outbox, Subscription
from toolwire.actors.records import RecordState, ToolCallRecord
from toolwire.actors.results import TEXT_APPROVAL_EXPIRED, Outcome, text_denied

if TYPE_CHECKING:
    from toolwire.actors.chat import ChatActor


def announce(chat: ChatActor, record: ToolCallRecord, only: Subscription | None = None) -> None:
    runtime = chat._runtime(record)
    event = ApprovalEvent(
        chat.chat_id, record.call_id, runtime.spec.tool, runtime.spec.args, record.turn_id
    )
    if only is not None:
        only.outbox.put(event, only)
    else:
        chat._publish(record, event)


def resolve(chat: ChatActor, record: ToolCallRecord, decision: str) -> None:
    runtime = chat._runtime(record)
    if runtime.gate is not None and not runtime.gate.is_set():
        runtime.gate.set()
        runtime.approved = decision == "approved"
        chat._publish(record, ApprovalResolvedEvent(chat.chat_id, record.call_id, decision))


def answer(
    chat: ChatActor,
    record: ToolCallRecord,
    approved: bool,
    reason: str | None,
    *,
    approver: Outbox | None,
) -> None:
    """Answer a parked gate: run the call, or end it `denied` (with the reason's text)."""
    chat.records.touch(record, chat._now())
    decision = "approved" if approved else "denied"
    resolve(chat, record, decision)
    if approver is not None:
        sub = chat._runtime(record).subs.get(approver)
        if sub is None or not sub.active or sub.detached or not (sub.stream or sub.resolved_events):
            # The approver learns that its answer took effect even when it does not follow the
            # call (another replica raised the gate): the one reply an `approve` gets.
            approver.put(ApprovalResolvedEvent(chat.chat_id, record.call_id, decision))
    if approved:
        chat.records.unpark(record)
        chat._start(record, gated=False)
    else:
        denied = text_denied(reason)
        chat._finish(record, chat._plain_result(record, Outcome.DENIED, denied))


def open_approved(chat: ChatActor, tool: str) -> None:
    """Approve every gate of `tool` parked in the chat (scope "chat"), in arrival order. Each
    one's followers get `approval_resolved{approved}` as for a single approve."""
    parked = [
        record
        for record in chat.records
        if record.state is RecordState.AWAITING_APPROVAL and chat._runtime(record).spec.tool == tool
    ]
    for record in parked:
        answer(chat, record, True, None, approver=None)


async def expire(chat: ChatActor, record: ToolCallRecord, gate: trio.Event) -> None:
    assert chat.ctx.approval_timeout_s is not None
    with trio.move_on_after(chat.ctx.approval_timeout_s):
        await gate.wait()
        return
    if record.state is RecordState.AWAITING_APPROVAL and not gate.is_set():
        resolve(chat, record, "expired")
        chat._finish(record, chat._plain_result(record, Outcome.NOT_RUN, TEXT_APPROVAL_EXPIRED))
