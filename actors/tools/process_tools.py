"""`process_output`, `process_signal` and `process_list` (PROTOCOL.md 8): a chat's own processes.

They run against the chat's `ProcessTable`, so a chat can only ever see, read or signal its own
processes; the "" chat is a chat of its own.
"""

from __future__ import annotations

import trio

from toolwire.actors.processes import SIGNALS, ProcessRecord, ProcessTable, has_exited
from toolwire.actors.results import Outcome, ToolReport
from toolwire.actors.tools.process_args import (
    ProcessListArgs,
    ProcessOutputArgs,
    ProcessSignalArgs,
)

__all__ = [
    "ProcessListArgs",
    "ProcessOutputArgs",
    "ProcessSignalArgs",
    "process_list",
    "process_output",
    "process_signal",
    "process_state",
]


def _missing(process_id: str) -> ToolReport:
    return ToolReport(
        outcome=Outcome.FAILED,
        text=f"no process {process_id!r} in this chat (process_list shows this chat's processes)",
    )


def process_state(proc: ProcessRecord) -> ToolReport:
    output, _ = proc.output.result_output()
    status = proc.status
    data = {
        "process_id": proc.process_id,
        "running": proc.running,
        "exit_code": status.exit_code if status else None,
        "signal": status.signal if status else None,
        "timed_out": proc.timed_out,
        "canceled": proc.canceled,
        "output_bytes": proc.output.total,
    }
    state = "is running" if proc.running else "has exited"
    if status is not None:
        state += f" ({'code ' + str(status.exit_code) if status.signal is None else status.signal})"
    return ToolReport(
        outcome=Outcome.COMPLETED,
        text=f"process {proc.process_id} {state}; {proc.output.total} bytes of output",
        data=data,
        output=output,
    )


async def process_output(
    table: ProcessTable, args: ProcessOutputArgs, max_wait_ms: int
) -> ToolReport:
    proc = table.get(args.process_id)
    if proc is None:
        return _missing(args.process_id)
    if args.wait and proc.running:
        # Blocking waits are capped (max_wait_ms, 5 minutes like the anchor's agent) so a
        # forgotten `wait` never pins a call forever.
        wait_ms = min(args.wait_ms if args.wait_ms is not None else max_wait_ms, max_wait_ms)
        with trio.move_on_after(wait_ms / 1000):
            await proc.exited.wait()
    return process_state(proc)


def process_signal(table: ProcessTable, args: ProcessSignalArgs) -> ToolReport:
    proc = table.get(args.process_id)
    if proc is None:
        return _missing(args.process_id)
    # Decided by the command's own process, as `process_output` reports it, and never by
    # `killpg`: it also succeeds on a group whose members have all exited but are not reaped
    # yet (zombies), and on a leftover background child after the shell exited. Once
    # `process_output` has said `running: false`, no later signal claims delivery. A shell
    # that exited and is not reaped yet counts as exited (has_exited looks without reaping).
    # Leftover background children of an exited shell are stopped with `cancel` (5.3).
    delivered = not has_exited(proc) and proc.handle.signal_group(SIGNALS[args.signal])
    text = (
        f"sent {args.signal} to process {args.process_id}"
        if delivered
        else f"process {args.process_id} has already exited; {args.signal} was not delivered"
    )
    return ToolReport(outcome=Outcome.COMPLETED, text=text, data={"delivered": delivered})


def process_list(table: ProcessTable) -> ToolReport:
    rows = [
        {
            "process_id": p.process_id,
            "command": p.command,
            "running": p.running,
            "exit_code": p.status.exit_code if p.status else None,
            "started_at": p.started_at_ms,
            "exited_at": p.exited_at_ms,
        }
        for p in table.listing()
    ]
    running = sum(1 for r in rows if r["running"])
    return ToolReport(
        outcome=Outcome.COMPLETED,
        text=f"{len(rows)} processes, {running} running",
        data={"processes": rows},
    )
