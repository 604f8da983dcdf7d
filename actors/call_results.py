"""Building the one saved Result of a call (PROTOCOL.md 4, Result). Pure: no trio, no I/O.

The chat actor decides *what* happened (the outcome); these functions only say it in the
Result's terms: times counted from the FIRST start, the head+tail output with its omitted-bytes
count, and the exact texts of PROTOCOL.md 7.
"""

from __future__ import annotations

from typing import Any

from toolwire.actors.effects import ProcessSnapshot
from toolwire.actors.records import ToolCallRecord
from toolwire.actors.results import (
    TEXT_CANCELED_WHILE_RUNNING,
    Outcome,
    Result,
    ToolReport,
    text_timed_out,
)


def make_result(
    record: ToolCallRecord,
    *,
    finished_ms: int,
    tool: str,
    outcome: Outcome,
    text: str,
    data: dict[str, Any] | None = None,
    output: str = "",
    output_bytes: int = 0,
    truncated_bytes: int = 0,
    timed_out: bool = False,
    canceled: bool = False,
) -> Result:
    started = record.started_at_ms
    return Result(
        tool=tool,
        outcome=outcome,
        text=text,
        data=data,
        output=output,
        output_bytes=output_bytes,
        truncated_bytes=truncated_bytes,
        timed_out=timed_out,
        canceled=canceled,
        started_at=started,
        finished_at=finished_ms,
        # From the first start: a retry never restarts the clock (PROTOCOL.md 4).
        wall_ms=None if started is None else max(0, finished_ms - started),
    )


def plain_result(
    record: ToolCallRecord, tool: str, outcome: Outcome, text: str, finished_ms: int
) -> Result:
    """A result with no tool output: not run, denied, canceled, failed before or inside."""
    canceled = outcome in (Outcome.CANCELED, Outcome.NOT_RUN) and record.cancel_requested
    return make_result(
        record, finished_ms=finished_ms, tool=tool, outcome=outcome, text=text, canceled=canceled
    )


def report_result(record: ToolCallRecord, report: ToolReport, finished_ms: int) -> Result:
    """What a file or process tool reported about its own run (a process_input canceled while
    it waited or wrote reports `canceled` itself, with what it wrote in its data)."""
    output_bytes = report.output_bytes
    return make_result(
        record,
        finished_ms=finished_ms,
        tool=record.tool or "",
        outcome=report.outcome,
        text=report.text,
        data=report.data,
        output=report.output,
        output_bytes=len(report.output.encode()) if output_bytes is None else output_bytes,
        truncated_bytes=report.truncated_bytes,
        canceled=report.outcome is Outcome.CANCELED,
    )


def execute_result(
    record: ToolCallRecord,
    *,
    outcome: Outcome,
    snapshot: ProcessSnapshot,
    timeout_ms: int | None,
    timed_out: bool,
    canceled: bool,
    finished_ms: int,
    text: str | None = None,
) -> Result:
    """An `execute` call's result: its exit status as data, its output head and tail. `text`
    overrides the outcome's own text (the hard deadline's, PROTOCOL.md 9.2)."""
    if text is not None:
        pass
    elif outcome is Outcome.TIMED_OUT:
        text = text_timed_out(timeout_ms or 0)
    elif outcome is Outcome.CANCELED:
        text = TEXT_CANCELED_WHILE_RUNNING
    elif not snapshot.exited:
        text = f"started in the background as process {snapshot.process_id}"
    elif snapshot.signal is not None:
        text = f"command was killed by {snapshot.signal}"
    else:
        text = f"command exited with code {snapshot.exit_code}"
    return make_result(
        record,
        finished_ms=finished_ms,
        tool="execute",
        outcome=outcome,
        text=text,
        data={
            "exit_code": snapshot.exit_code,
            "signal": snapshot.signal,
            "process_id": snapshot.process_id,
        },
        output=snapshot.output,
        output_bytes=snapshot.output_bytes,
        truncated_bytes=snapshot.truncated_bytes,
        timed_out=timed_out,
        canceled=canceled,
    )
