"""`process_output`, `process_signal`, `process_list` (PROTOCOL.md 8), `process_input` and
`process_resize` (9.1): a chat's own processes.

They run against the chat's `ProcessTable`, so a chat can only ever see, read, signal, type
into or resize its own processes; the "" chat is a chat of its own.
"""

from __future__ import annotations

from typing import Any

import trio

from toolwire.actors import stdin
from toolwire.actors.processes import (
    SIGNALS,
    InputClosed,
    ProcessRecord,
    ProcessTable,
    has_exited,
)
from toolwire.actors.results import TEXT_CANCELED_WHILE_RUNNING, Outcome, ToolReport
from toolwire.actors.stdin import InputEnd, InputProgress, InputTicket
from toolwire.actors.terminal import TerminalSize
from toolwire.actors.tools.process_args import (
    ProcessInputArgs,
    ProcessListArgs,
    ProcessOutputArgs,
    ProcessResizeArgs,
    ProcessSignalArgs,
)

__all__ = [
    "ProcessInputArgs",
    "ProcessListArgs",
    "ProcessOutputArgs",
    "ProcessResizeArgs",
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


async def process_input(
    ticket: InputTicket, args: ProcessInputArgs, max_wait_ms: int, cancel: trio.CancelScope
) -> ToolReport:
    """Write `args.data` to the process once, in its turn, then wait up to `wait_ms` for it to
    print or exit (PROTOCOL.md 9.1).

    `ticket` comes from `stdin.join_input(table, args.process_id)`, taken synchronously when the
    call started, in arrival order. `cancel` is a fresh scope the caller keeps for the call;
    `cancel.cancel()` ends the input at once: `canceled`, with `written` saying how many bytes
    of `data` went in (0 when it was still waiting for its turn). The queue is free for the
    next input whatever happens."""
    data = args.data.encode()
    progress = InputProgress()
    end: InputEnd | None = None
    with cancel:
        end = await stdin.write_input(ticket, data, args.eof, progress)
        record = ticket.record
        if end is InputEnd.WRITTEN and record is not None:
            wait_ms = min(args.wait_ms, max_wait_ms)
            since = (
                record.output.total if progress.output_offset is None else (progress.output_offset)
            )
            await stdin.wait_for_reply(record, since, wait_ms / 1000)
    record = ticket.record
    if record is None:
        return _missing(args.process_id)
    if cancel.cancelled_caught:
        return _input_report(record, Outcome.CANCELED, TEXT_CANCELED_WHILE_RUNNING, progress)
    assert end is not None
    if end is InputEnd.CUT_SHORT:
        # A reader closes its end of the pipe as it exits, a moment before it can be seen to
        # have exited: give the exit that moment, so the text and `running` say what happened.
        with trio.move_on_after(stdin.REPLY_QUIET_S):
            await record.exited.wait()
    pid = record.process_id
    if end is InputEnd.WRITTEN:
        did = f"wrote {progress.written} bytes to process {pid}"
        if args.eof:
            port = record.handle.stdin
            did += " and the EOF character" if port and port.terminal else " and closed its stdin"
        since = record.output.total - (progress.output_offset or 0)
        text = f"{did}; it {_state(record)}; {since} bytes of output since"
        return _input_report(record, Outcome.COMPLETED, text, progress)
    texts = {
        InputEnd.NO_STDIN: f"process {pid} has no stdin (start it with execute's `stdin: true` "
        "or `pty` to write to it); nothing was written",
        InputEnd.EXITED: f"process {pid} {_state(record)}; nothing was written",
        InputEnd.CLOSED: f"the stdin of process {pid} was closed by an earlier process_input "
        "with eof; nothing was written",
        InputEnd.CUT_SHORT: (
            f"process {pid} {'stopped reading its input' if not has_exited(record) else 'exited'}"
            f" after {progress.written} of {len(data)} bytes were written"
        ),
    }
    return _input_report(record, Outcome.FAILED, texts[end], progress)


def _state(record: ProcessRecord) -> str:
    status = record.status
    if status is None:
        return "has exited" if has_exited(record) else "is running"
    how = f"code {status.exit_code}" if status.signal is None else status.signal
    return f"has exited ({how})"


def _input_report(
    record: ProcessRecord, outcome: Outcome, text: str, progress: InputProgress
) -> ToolReport:
    """A process_input's report: its data (PROTOCOL.md 9.1) and the output from its write on."""
    since = record.output.total if progress.output_offset is None else progress.output_offset
    output, truncated = record.output.result_output(since)
    status = record.status
    data: dict[str, Any] = {
        "written": progress.written,
        "stdin_offset": record.stdin_offset,
        "output_offset": since,
        "running": not has_exited(record),
        "exit_code": status.exit_code if status else None,
    }
    return ToolReport(
        outcome=outcome,
        text=text,
        data=data,
        output=output,
        output_bytes=record.output.total - since,
        truncated_bytes=truncated,
    )


def process_resize(table: ProcessTable, args: ProcessResizeArgs) -> ToolReport:
    """Resize the process's terminal; the kernel sends SIGWINCH to its foreground process group
    (PROTOCOL.md 9.1)."""
    proc = table.get(args.process_id)
    if proc is None:
        return _missing(args.process_id)
    pid = args.process_id
    port = proc.handle.stdin
    if port is None or not port.terminal:
        return ToolReport(
            outcome=Outcome.FAILED,
            text=f"process {pid} has no terminal (start it with execute's `pty`); "
            "nothing was resized",
        )
    size = {"rows": args.rows, "cols": args.cols}
    if has_exited(proc):
        return ToolReport(
            outcome=Outcome.FAILED, text=f"process {pid} {_state(proc)}; nothing was resized"
        )
    try:
        port.resize(TerminalSize(args.rows, args.cols))
    except InputClosed:
        return ToolReport(
            outcome=Outcome.FAILED,
            text=f"the terminal of process {pid} is closed; nothing was resized",
        )
    return ToolReport(
        outcome=Outcome.COMPLETED,
        text=f"resized the terminal of process {pid} to {args.rows} rows and {args.cols} columns",
        data=size,
    )
