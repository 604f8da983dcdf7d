"""What a chat keeps in its journal: the row written for a record, and rebuilding a record
from its row after a restart (PROTOCOL.md promise 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from toolwire.actors import gates
from toolwire.actors.calls import CallRuntime, CallSpec, shared_tool_name
from toolwire.actors.journal import JournalRow
from toolwire.actors.records import RecordState, ToolCallRecord
from toolwire.actors.results import TEXT_AGENT_RESTARTED, Outcome, ToolwireError
from toolwire.actors.tools.registry import lookup, parse_args

if TYPE_CHECKING:
    from toolwire.actors.chat import ChatActor


def journal_row(
    chat_id: str, record: ToolCallRecord, spec: CallSpec, touched_at_ms: int
) -> JournalRow:
    """The row that remembers `record` as it is now (with the call as it was requested)."""
    return JournalRow(
        chat_id=chat_id,
        call_id=record.call_id,
        state=record.state.value,
        tool=record.tool,
        fingerprint=record.fingerprint,
        args=spec.args,
        timeout_ms=spec.timeout_ms,
        background=spec.background,
        approval=spec.approval,
        turn_id=record.turn_id,
        result=record.result,
        started_at_ms=record.started_at_ms,
        touched_at_ms=touched_at_ms,
    )


def restore(chat: ChatActor, row: JournalRow, touched_at: float) -> None:
    """Rebuild one record from the journal after a restart (PROTOCOL.md promise 1):
    a saved result is served again as it was; a call that was running when the agent died
    ends `unknown` and never runs again; a parked gate is parked again."""
    spec = CallSpec(
        row.call_id, row.tool or "", row.args, row.timeout_ms, row.background, row.approval
    )
    runtime = CallRuntime(spec=spec)
    record = ToolCallRecord(
        call_id=row.call_id,
        tool=None if row.tool is None else shared_tool_name(row.tool),
        fingerprint=row.fingerprint,
        state=RecordState(row.state),
        touched_at=touched_at,
        effect_started=row.started_at_ms is not None or row.state == "running",
        started_at_ms=row.started_at_ms,
        result=row.result,
        outcome=row.result.outcome if row.result is not None else None,
        turn_id=row.turn_id,
    )
    chat.records.restore(record)
    if record.state is RecordState.DONE:
        if record.result is None:
            raise ValueError(
                f"journal row {row.chat_id!r}/{row.call_id!r} is done without a result"
            )
        # Durable and published as it was before the restart: it needs no runtime (a
        # follower gets a fresh one, already done) and, when the journal keeps results,
        # not its result on the heap either.
        record.published = True
        if chat.ctx.journal.keeps_results:
            chat.records.release_result(record)
        return
    record.runtime = runtime
    if record.state is RecordState.RUNNING:
        chat._finish(record, chat._plain_result(record, Outcome.UNKNOWN, TEXT_AGENT_RESTARTED))
    elif record.state is RecordState.AWAITING_APPROVAL:
        try:
            tool = lookup(spec.tool)
            runtime.parsed = parse_args(tool, spec.args)
        except ToolwireError as exc:
            runtime.invalid = exc.message
        runtime.gate = trio.Event()
        if chat.ctx.approval_timeout_s is not None:
            chat._spawn(gates.expire, chat, record, runtime.gate)
