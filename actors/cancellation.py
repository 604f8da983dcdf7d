"""Cancel and interrupt: applying a cancel to one record at once (PROTOCOL.md 5.3), and the
replies that wait until the canceled calls (and turns) have their published results."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolwire.actors import execute_calls, gates, processes
from toolwire.actors.calls import CallRuntime, CallSpec
from toolwire.actors.events import CancelResultEvent, InterruptedEvent
from toolwire.actors.outbox import Outbox
from toolwire.actors.records import CancelAction, ToolCallRecord
from toolwire.actors.results import TEXT_CANCELED_BEFORE_RUN, Outcome
from toolwire.actors.turns import TurnRun

if TYPE_CHECKING:
    from toolwire.actors.chat import ChatActor


def cancel_one(chat: ChatActor, call_id: str) -> tuple[bool, ToolCallRecord]:
    """Apply one cancel now (PROTOCOL.md 5.3). Returns (received, record); the record is
    DONE at once, or becomes DONE when the stopped run ends."""
    action, record = chat.records.cancel(call_id, chat._now())
    if action is CancelAction.TOMBSTONED:
        record.runtime = CallRuntime(spec=CallSpec(call_id, "", {}))
        proc = chat.processes.get(call_id)
        if proc is not None and (proc.running or not proc.output_closed.is_set()):
            # A process outlives its (forgotten) record: the cancel still stops it, also
            # when only a background child of its exited shell is left (it holds the pipe).
            chat.records.begin(record)
            record.started_at_ms = proc.started_at_ms
            chat._runtime(record).process = proc
            chat._spawn(execute_calls.kill_then_finish, chat, record, proc)
        else:
            chat._finish(
                record, chat._plain_result(record, Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN)
            )
        return False, record
    runtime = chat._runtime(record)  # a finished record may have released its runtime
    if action is CancelAction.CLOSED_BEFORE_RUN:
        gates.resolve(chat, record, "canceled")
        chat._finish(record, chat._plain_result(record, Outcome.NOT_RUN, TEXT_CANCELED_BEFORE_RUN))
    elif action is CancelAction.STOP_RUNNING:
        proc = runtime.process
        if proc is not None and processes.has_exited(proc):
            # The command had already exited: the call finished first, so its real result
            # stands (only a run that was still going is "canceled").
            record.cancel_requested = False
        elif proc is not None:
            proc.canceled = True
            chat._spawn(execute_calls.terminate, chat, proc)
        elif runtime.wait_scope is not None:
            runtime.wait_scope.cancel()
        # A file tool in a worker thread cannot be interrupted: the cancel waits for it
        # and reports its real result, which is the truth.
    else:
        proc = runtime.process if runtime.process is not None else chat.processes.get(call_id)
        if proc is not None and (proc.running or not proc.output_closed.is_set()):
            proc.canceled = True
            chat._spawn(execute_calls.terminate, chat, proc)
    return True, record


async def reply_cancel(
    chat: ChatActor, outbox: Outbox, record: ToolCallRecord, received: bool, rid: Any
) -> None:
    try:
        runtime = chat._runtime(record)
        await runtime.done.wait()
        proc = runtime.process or chat.processes.get(record.call_id)
        if received and proc is not None and proc.canceled:
            # A process the ended call left running is killed "like a running one" (5.3):
            # the reply waits until its whole group is gone, so a client never sees any of
            # it alive after the cancel_result.
            await proc.stopped.wait()
        chat._deliver(
            [record],
            lambda results: outbox.put(
                CancelResultEvent(chat.chat_id, record.call_id, received, results[0], rid)
            ),
        )
    finally:
        record.unpin()


async def reply_interrupted(
    chat: ChatActor,
    outbox: Outbox,
    turn_id: str | None,
    targets: list[ToolCallRecord],
    ending: list[ToolCallRecord],
    turns: list[TurnRun],
    rid: Any,
) -> None:
    for record in (*targets, *ending):
        await chat._runtime(record).done.wait()
    for run in turns:
        await run.done.wait()
    # The calls this interrupt ended; one that finished on its own first kept its real
    # result and was not ended by the interrupt.
    ended = [r.call_id for r in targets if r.outcome in (Outcome.CANCELED, Outcome.NOT_RUN)]
    # Behind any result still being read back for this chat: `interrupted` comes last.
    chat._deliver([], lambda _: outbox.put(InterruptedEvent(chat.chat_id, turn_id, ended, rid)))
