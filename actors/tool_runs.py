"""Running a tool call that is not an `execute` (and handing an execute to its module): inline
file tools on the loop, thread tools on a worker thread, `process_output` waits that a cancel
can end, and a turn's calls behind its "at most 8 at once" limiter. Each ends in the chat's
one `_finish`; an exception saves an `unknown` (or `not_run`) result, never escapes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from toolwire.actors import execute_calls
from toolwire.actors.calls import CallRuntime
from toolwire.actors.records import RecordState, ToolCallRecord
from toolwire.actors.results import (
    TEXT_AGENT_FAILURE,
    TEXT_CANCELED_WHILE_RUNNING,
    Outcome,
    ToolReport,
)
from toolwire.actors.tools import files as file_tools
from toolwire.actors.tools import process_tools
from toolwire.actors.tools.registry import ToolDef, ToolKind

if TYPE_CHECKING:
    from toolwire.actors.chat import ChatActor

log = logging.getLogger("toolwire.chat")


def run_inline_once_started(
    chat: ChatActor, record: ToolCallRecord, tool: ToolDef, runtime: CallRuntime
) -> None:
    """An inline tool whose start just became durable (a journal commit callback)."""
    if chat._may_start(record):
        finish_guarded(chat, record, lambda: run_inline(chat, tool, runtime))


def run_inline(chat: ChatActor, tool: ToolDef, runtime: CallRuntime) -> ToolReport:
    """The tool's work itself: on the loop for inline tools, on a worker thread for the rest."""
    parsed = runtime.parsed
    workspace = chat.ctx.workspace
    if isinstance(parsed, file_tools.ReadFileArgs):
        return file_tools.read_file(workspace, parsed)
    if isinstance(parsed, file_tools.WriteFileArgs):
        return file_tools.write_file(workspace, parsed)
    if isinstance(parsed, file_tools.EditFilesArgs):
        return file_tools.edit_files(workspace, parsed)
    if isinstance(parsed, file_tools.SearchFilesArgs):
        return file_tools.search_files(workspace, parsed)
    if isinstance(parsed, process_tools.ProcessSignalArgs):
        return process_tools.process_signal(chat.processes, parsed)
    if isinstance(parsed, process_tools.ProcessListArgs):
        return process_tools.process_list(chat.processes)
    raise AssertionError(f"no inline runner for {tool.name}")


def finish_guarded(chat: ChatActor, record: ToolCallRecord, run: Callable[[], ToolReport]) -> None:
    """Run an inline tool outside any task: a failure must still save the call's result."""
    try:
        report = run()
    except Exception:
        log.exception("tool %s failed", record.tool, extra=chat._log_extra(record))
        chat._finish(record, chat._plain_result(record, Outcome.UNKNOWN, TEXT_AGENT_FAILURE))
        return
    chat._finish(record, chat._report_result(record, report))


async def run_task(chat: ChatActor, record: ToolCallRecord, tool: ToolDef) -> None:
    """A call's task in the chat's nursery: whatever happens, it ends with a saved result."""
    runtime = chat._runtime(record)
    try:
        if runtime.limiter is not None:
            async with runtime.limiter:
                await _run_tool(chat, record, tool, runtime)
        else:
            await _run_tool(chat, record, tool, runtime)
    except Exception:
        # `not_run` with the agent-failure text if the effect cannot have started (the failure
        # came before its durable start), else `unknown` (PROTOCOL.md 9.9, 9.10).
        chat._fail(record)
    finally:
        chat._launching.pop(record.call_id, None)


async def _run_tool(
    chat: ChatActor, record: ToolCallRecord, tool: ToolDef, runtime: CallRuntime
) -> None:
    if record.state is not RecordState.QUEUED and record.state is not (
        RecordState.AWAITING_APPROVAL
    ):
        return  # canceled (or denied) while waiting for a worker slot
    if tool.kind is ToolKind.EXECUTE:
        await execute_calls.run_execute(chat, record, runtime)
        return
    seq = chat._begin(record)
    if not await chat._durable_start(record, seq):
        return
    parsed = runtime.parsed
    if isinstance(parsed, process_tools.ProcessOutputArgs):
        with trio.CancelScope() as scope:
            runtime.wait_scope = scope
            report = await process_tools.process_output(
                chat.processes, parsed, chat.ctx.limits.max_wait_ms
            )
        if scope.cancelled_caught:
            chat._finish(
                record,
                chat._plain_result(record, Outcome.CANCELED, TEXT_CANCELED_WHILE_RUNNING),
            )
            return
    elif tool.kind is ToolKind.THREAD:
        report = await trio.to_thread.run_sync(run_inline, chat, tool, runtime)
    else:
        report = run_inline(chat, tool, runtime)
    chat._finish(record, chat._report_result(record, report))
