"""The hooks the runtime calls where an operator wants to know something: a call ended, a
command's output grew. Each counts (`actors/metrics.py`) and, for a call's end, writes the
log line `toolwire serve --log-format json` turns into one object (`cli/logs.py`).

A log line names the call (chat_id, call_id), the tool, the outcome and wall_ms; never the
args, the output, or anything else the call carried: those may be secrets or file contents.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from toolwire.actors.results import Result

if TYPE_CHECKING:
    from toolwire.actors.context import AgentContext

log = logging.getLogger("toolwire.calls")


def call_ended(ctx: AgentContext, chat_id: str, call_id: str, result: Result) -> None:
    """Once per call, when its result is durable and published."""
    metrics = ctx.metrics
    # tool "": a cancel tombstone (a cancel of an id no call has named); it is not a call.
    if metrics is not None and result.tool:
        metrics.call_ended(result.tool, result.outcome)
    if log.isEnabledFor(logging.INFO):  # the hot path: no dict unless the line is written
        log.info(
            "call ended",
            extra={
                "chat_id": chat_id,
                "call_id": call_id,
                "tool": result.tool,
                "outcome": str(result.outcome),
                "wall_ms": result.wall_ms,
            },
        )


class OutputCounter:
    """Counts one command's output into `toolwire_output_bytes_total` as it arrives."""

    __slots__ = ("_counted", "_metrics")

    def __init__(self, ctx: AgentContext) -> None:
        self._metrics = ctx.metrics
        self._counted = 0

    def update(self, total: int) -> None:
        """The command's output now totals `total` bytes (called after each append)."""
        metrics = self._metrics
        if metrics is not None and total > self._counted:
            metrics.output_bytes += total - self._counted
            self._counted = total
