"""Running an `execute` call: spawn its process once the start is durable, pump its output
to the followers, reap it (or give up at its deadline and leave it to a reaper), and stop it
on cancel. The chat owns the records and the nursery; these run as its tasks."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from toolwire.actors import call_results, observe, processes
from toolwire.actors.calls import CallRuntime
from toolwire.actors.events import StartedEvent
from toolwire.actors.records import ToolCallRecord
from toolwire.actors.results import Outcome, Result
from toolwire.actors.tools import execute as execute_tool

if TYPE_CHECKING:
    from toolwire.actors.chat import ChatActor

log = logging.getLogger("toolwire.chat")


async def run_execute(chat: ChatActor, record: ToolCallRecord, runtime: CallRuntime) -> None:
    args = runtime.parsed
    assert isinstance(args, execute_tool.ExecuteArgs)
    seq = chat._begin(record)
    if not await chat._durable_start(record, seq):
        return
    chat._launching.pop(record.call_id, None)
    if chat._at_process_limit():
        limit = chat.ctx.limits.max_processes_per_chat
        chat._finish(
            record,
            chat._plain_result(
                record,
                Outcome.FAILED,
                f"the command did not start: this chat already runs {limit} processes "
                "(max_processes_per_chat); wait for one to exit or stop one",
            ),
        )
        return
    try:
        proc = chat.processes.spawn(
            record.call_id,
            args.command,
            execute_tool.argv_for(args),
            execute_tool.cwd_for(args, chat.ctx.workspace),
            execute_tool.env_for(args, chat.ctx.base_env),
            record.started_at_ms or chat.ctx.wall_ms(),
        )
    except OSError as exc:
        chat._finish(
            record,
            chat._plain_result(
                record, Outcome.FAILED, f"the command did not start: {exc.strerror or exc}"
            ),
        )
        return
    runtime.process = proc
    for sub in runtime.subs.values():
        sub.buffer = proc.output
    runtime.started = StartedEvent(
        chat.chat_id, record.call_id, record.started_at_ms or 0, proc.handle.pid
    )
    for sub in runtime.subs.values():
        # Only a streaming follower is sent `started` (the outbox drops it for the others,
        # and one that starts streaming later gets it from _follow): queuing it for the
        # rest would only wake their senders for nothing.
        if sub.active and sub.stream:
            sub.outbox.put(runtime.started, sub)

    counter = observe.OutputCounter(chat.ctx)

    def on_output(proc: processes.ProcessRecord) -> None:
        counter.update(proc.output.total)
        chat._output_arrived(record)

    chat._spawn(pump, chat, proc, on_output, record)
    wall_ms, on_exit = chat.ctx.wall_ms, chat.processes.exited
    if runtime.spec.background:
        chat._spawn(processes.reap, proc, wall_ms, on_exit)
        chat._finish(record, execute_result(chat, record, proc, Outcome.COMPLETED))
        return
    # A foreground call reaps its process itself: one task and one wake-up fewer per call
    # than a reaper task that this one waits for.
    with trio.move_on_at(record.deadline if record.deadline is not None else math.inf):
        await processes.reap(proc, wall_ms, on_exit)
    if proc.status is None:
        # The deadline came first; the process runs on, and a reaper of its own records
        # its exit whenever it comes.
        chat._spawn(processes.reap, proc, wall_ms, on_exit)
        proc.timed_out = True
        chat._finish(record, execute_result(chat, record, proc, Outcome.TIMED_OUT))
        return
    if proc.canceled:
        # The shell is gone, but the cancel's grace belongs to the whole group (5.3): the
        # result, and with it the cancel's reply, waits until every member has exited or
        # been killed, and carries what they printed meanwhile.
        await proc.stopped.wait()
    processes.drain_available(proc, on_output)
    outcome = Outcome.CANCELED if record.cancel_requested else Outcome.COMPLETED
    chat._finish(record, execute_result(chat, record, proc, outcome))


async def pump(
    chat: ChatActor,
    proc: processes.ProcessRecord,
    on_output: Callable[[processes.ProcessRecord], None],
    record: ToolCallRecord,
) -> None:
    try:
        await processes.pump(proc, on_output)
    except Exception:
        log.exception("output pump failed", extra=chat._log_extra(record))
    chat._maybe_close_output(record)


async def terminate(chat: ChatActor, proc: processes.ProcessRecord) -> None:
    await processes.terminate(proc, chat.ctx.kill_grace_s)


async def kill_then_finish(
    chat: ChatActor, record: ToolCallRecord, proc: processes.ProcessRecord
) -> None:
    proc.canceled = True
    await processes.terminate(proc, chat.ctx.kill_grace_s)
    chat._finish(record, execute_result(chat, record, proc, Outcome.CANCELED))


def execute_result(
    chat: ChatActor, record: ToolCallRecord, proc: processes.ProcessRecord, outcome: Outcome
) -> Result:
    return call_results.execute_result(
        record,
        outcome=outcome,
        process_id=proc.process_id,
        output=proc.output,
        status=proc.status,
        timeout_ms=chat._runtime(record).spec.timeout_ms,
        timed_out=proc.timed_out,
        canceled=proc.canceled,
        finished_ms=chat.ctx.wall_ms(),
    )
