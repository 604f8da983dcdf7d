"""The work a chat's effects ask for: running a tool, stopping a process group, taking a
command's snapshot. Each takes its arguments and returns (or reports) what happened; none sees
a chat. The shell (actors/chat.py) decides nothing here: it calls these and feeds the result
back to `ChatState` as an input.
"""

from __future__ import annotations

import functools
import signal
import threading
from typing import Any, TypeVar, assert_never

import msgspec
import trio

from toolwire.actors import processes
from toolwire.actors.effects import ProcessSnapshot
from toolwire.actors.hidden_paths import HiddenPaths
from toolwire.actors.results import ToolReport
from toolwire.actors.tools import process_tools
from toolwire.actors.tools.process_args import ProcessResizeArgs, ProcessSignalArgs
from toolwire.actors.tools.registry import (
    OnLoop,
    OnThread,
    ProcessOp,
    Spawns,
    StoppableOnThread,
    ToolDef,
)
from toolwire.actors.worker_priority import run_sync_below_the_loop


def run_tool(
    tool: ToolDef,
    args: msgspec.Struct,
    workspace: str,
    table: processes.ProcessTable,
    hidden: HiddenPaths,
) -> ToolReport:
    """A file or process tool's work itself, as its registry entry says: on the loop for the
    short ones, on a worker thread (the caller's choice) for file work. The waits a cancel can
    end (`process_output`, `process_input`, a stoppable search) have runners of their own."""
    match tool.run:
        case OnLoop(run=run) | OnThread(run=run):
            return run(workspace, args, hidden=hidden)
        case ProcessOp.SIGNAL:
            return process_tools.process_signal(table, _as(args, ProcessSignalArgs))
        case ProcessOp.LIST:
            return process_tools.process_list(table)
        case ProcessOp.RESIZE:
            return process_tools.process_resize(table, _as(args, ProcessResizeArgs))
        case StoppableOnThread() | ProcessOp.OUTPUT | ProcessOp.INPUT | Spawns.COMMAND:
            raise TypeError(f"{tool.name} does not run as a plain call")
        case unmatched:
            assert_never(unmatched)


_S = TypeVar("_S", bound=msgspec.Struct)


def _as(args: msgspec.Struct, args_type: type[_S]) -> _S:
    """The args of a process op as the type its function takes. The registry pairs each op
    with that args type; an entry that paired it with another fails here, on the tool's first
    call (live tests make one of each: process_signal in tests/test_semantics.py,
    process_resize in tests/test_interactive.py)."""
    if not isinstance(args, args_type):
        raise TypeError(f"expected {args_type.__name__}, got {type(args).__name__}")
    return args


async def run_tool_in_thread(
    tool: ToolDef,
    args: msgspec.Struct,
    workspace: str,
    table: processes.ProcessTable,
    hidden: HiddenPaths,
) -> ToolReport:
    if isinstance(tool.run, OnThread) and tool.run.below_the_loop:
        return await run_sync_below_the_loop(run_tool, tool, args, workspace, table, hidden)
    return await trio.to_thread.run_sync(run_tool, tool, args, workspace, table, hidden)


async def run_stoppable_in_thread(
    work: StoppableOnThread[Any],
    args: msgspec.Struct,
    workspace: str,
    stop: threading.Event,
    hidden: HiddenPaths,
) -> ToolReport:
    """Stoppable file work (search_files) on a worker thread; once `stop` is set it ends
    within a block of work, raising SearchStopped. RE2 releases the GIL while it matches, so
    the loop runs meanwhile."""
    return await trio.to_thread.run_sync(
        functools.partial(work.run, workspace, args, stop.is_set, hidden=hidden)
    )


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
