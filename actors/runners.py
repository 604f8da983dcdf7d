"""The work a chat's effects ask for: running a tool, stopping a process group, taking a
command's snapshot. Each takes its arguments and returns (or reports) what happened; none sees
a chat. The shell (actors/chat.py) decides nothing here: it calls these and feeds the result
back to `ChatState` as an input.
"""

from __future__ import annotations

import functools
import signal
import threading

import msgspec
import trio

from toolwire.actors import processes
from toolwire.actors.effects import ProcessSnapshot
from toolwire.actors.results import ToolReport
from toolwire.actors.tools import files as file_tools
from toolwire.actors.tools import process_tools


def run_tool(args: msgspec.Struct, workspace: str, table: processes.ProcessTable) -> ToolReport:
    """A file or process tool's work itself, by its parsed args: on the loop for the short
    ones, on a worker thread (the caller's choice) for the rest."""
    if isinstance(args, file_tools.ReadFileArgs):
        return file_tools.read_file(workspace, args)
    if isinstance(args, file_tools.WriteFileArgs):
        return file_tools.write_file(workspace, args)
    if isinstance(args, file_tools.EditFilesArgs):
        return file_tools.edit_files(workspace, args)
    if isinstance(args, file_tools.SearchFilesArgs):
        return file_tools.search_files(workspace, args)
    if isinstance(args, process_tools.ProcessSignalArgs):
        return process_tools.process_signal(table, args)
    if isinstance(args, process_tools.ProcessListArgs):
        return process_tools.process_list(table)
    if isinstance(args, process_tools.ProcessResizeArgs):
        return process_tools.process_resize(table, args)
    raise AssertionError(f"no runner for {type(args).__name__}")


async def run_tool_in_thread(
    args: msgspec.Struct, workspace: str, table: processes.ProcessTable
) -> ToolReport:
    return await trio.to_thread.run_sync(run_tool, args, workspace, table)


async def search_in_thread(
    args: file_tools.SearchFilesArgs, workspace: str, stop: threading.Event
) -> ToolReport:
    """search_files on a worker thread; once `stop` is set it ends within a block of lines,
    raising SearchStopped. RE2 releases the GIL while it matches, so the loop runs meanwhile."""
    search = functools.partial(file_tools.search_files, workspace, args, should_stop=stop.is_set)
    return await trio.to_thread.run_sync(search)


async def wait_for_process(
    table: processes.ProcessTable, args: process_tools.ProcessOutputArgs, max_wait_ms: int
) -> ToolReport:
    return await process_tools.process_output(table, args, max_wait_ms)


def snapshot(proc: processes.ProcessRecord) -> ProcessSnapshot:
    """The command as its result tells it now: exit status, output head and tail."""
    output, truncated = proc.output.result_output()
    status = proc.status
    return ProcessSnapshot(
        process_id=proc.process_id,
        exit_code=status.exit_code if status is not None else None,
        signal=status.signal if status is not None else None,
        exited=status is not None,
        output=output,
        output_bytes=proc.output.total,
        truncated_bytes=truncated,
    )


async def term_group(proc: processes.ProcessRecord, grace_s: float) -> bool:
    """SIGTERM to the whole group, then wait up to `grace_s` for it to have no member: the
    grace is the group's, not the shell's (PROTOCOL.md 5.3). True if it emptied."""
    if not proc.handle.group_alive():
        return True
    proc.handle.signal_group(signal.SIGTERM)
    return await processes.wait_until_group_empty(proc, grace_s)


async def kill_group(proc: processes.ProcessRecord) -> None:
    """SIGKILL to the whole group (it reaches nothing if the group emptied: a member that
    ignores SIGTERM can never outlive a canceled call), then wait until it is gone."""
    proc.handle.signal_group(signal.SIGKILL)
    await proc.exited.wait()
    await processes.wait_until_group_empty(proc, processes.GROUP_GONE_AFTER_KILL_S)
    proc.stopped.set()
