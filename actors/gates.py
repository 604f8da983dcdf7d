"""Approval gates: a gated call parks until it is approved, denied, canceled or expires.

Announcing a gate sends its `approval` event to the call's followers; resolving it (once)
wakes the parked call and tells them how it ended. The chat applies the decision itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from toolwire.actors.events import ApprovalEvent, ApprovalResolvedEvent
from toolwire.actors.outbox import Subscription
from toolwire.actors.records import RecordState, ToolCallRecord
from toolwire.actors.results import TEXT_APPROVAL_EXPIRED, Outcome

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


async def expire(chat: ChatActor, record: ToolCallRecord, gate: trio.Event) -> None:
    assert chat.ctx.approval_timeout_s is not None
    with trio.move_on_after(chat.ctx.approval_timeout_s):
        await gate.wait()
        return
    if record.state is RecordState.AWAITING_APPROVAL and not gate.is_set():
        resolve(chat, record, "expired")
        chat._finish(record, chat._plain_result(record, Outcome.NOT_RUN, TEXT_APPROVAL_EXPIRED))
