"""Domain types the actors speak: outcomes, tool reports, results and errors.

These mirror the wire protocol's Result (PROTOCOL.md section 4) field for field, but they are
the actors' own: `actors` never imports `transport`. The server maps them to wire messages.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec


class Outcome(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELED = "canceled"
    NOT_RUN = "not_run"
    DENIED = "denied"
    UNKNOWN = "unknown"


# The exact model-facing texts of PROTOCOL.md section 7. Clients match on them: never reword.
TEXT_CANCELED_BEFORE_RUN = "tool call was canceled before it ran; no changes were made"
TEXT_CANCELED_WHILE_RUNNING = "tool call was canceled while running"
TEXT_DENIED = "tool call was denied; no changes were made"
TEXT_APPROVAL_EXPIRED = "tool call was not approved in time; no changes were made"
TEXT_AGENT_FAILURE = "tool call failed inside the agent; its outcome is unknown"
# PROTOCOL.md 9.10: the agent failed while admitting or journaling a call, before its effect
# could start.
TEXT_AGENT_FAILURE_BEFORE_RUN = (
    "tool call failed inside the agent before it ran; no changes were made"
)
TEXT_AGENT_RESTARTED = "the agent restarted while the tool call was running; its outcome is unknown"
# PROTOCOL.md 10.1: the keeper that held a running command died under a live agent (its exit
# can no longer be learnt; what was left of its group was killed).
TEXT_KEEPER_GONE = (
    "the keeper holding the command was killed while it ran; the rest of its process group "
    "was stopped and its outcome is unknown"
)
# PROTOCOL.md 9.3, 9.10: a call still running when the agent shut down gracefully.
TEXT_SHUTDOWN = "the agent shut down while the tool call was running; it was stopped"


def text_denied(reason: str | None) -> str:
    """PROTOCOL.md 9.5: a denial that says why; without a reason (or a blank one), section 7's
    text. The reason goes to the model as given."""
    if reason is None or not reason.strip():
        return TEXT_DENIED
    return f"tool call was denied: {reason}; no changes were made"


def text_timed_out(timeout_ms: int) -> str:
    return f"tool call timed out after {timeout_ms} ms; the process is still running"


def text_killed_after(kill_after_ms: int) -> str:
    """PROTOCOL.md 9.2, 9.10: a call whose result was still owed when its hard deadline stopped
    the process group."""
    return f"tool call ran past its kill_after_ms of {kill_after_ms} ms; the process was stopped"


def text_unresolved(why: str) -> str:
    """A turn's call that never ran because the agent could not resolve what the turn's calls
    reserve (their paths, PROTOCOL.md 5.6): its outcome is `failed`, and nothing was run."""
    return (
        f"tool call did not run: the agent could not resolve the paths of its turn ({why}); "
        "no changes were made"
    )


class ToolReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool says about its own run, before the chat adds timing and output."""

    outcome: Outcome
    text: str
    data: dict[str, Any] | None = None
    # Model-facing output for tools that have no process output buffer (file tools: "").
    output: str = ""
    # For an `output` cut from a process's output (process_input): the bytes it stands for and
    # those omitted from its middle. None: `output` is whole, its UTF-8 length is the count.
    output_bytes: int | None = None
    truncated_bytes: int = 0


class Result(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    # gc=False: a Result holds only immutable values and plain data, never a cycle, so the
    # garbage collector need not track the (many) saved results: less memory, shorter GC passes.
    """The one saved, truthful result of a tool call (PROTOCOL.md section 4, Result)."""

    tool: str
    outcome: Outcome
    text: str
    data: dict[str, Any] | None
    output: str
    output_bytes: int
    truncated_bytes: int
    timed_out: bool
    canceled: bool
    started_at: int | None
    finished_at: int | None
    wall_ms: int | None


class ToolwireError(Exception):
    """A request the agent refuses; it changed nothing. `code` is a PROTOCOL.md section 6 code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ToolFailure(Exception):
    """Raised inside a tool for a failure on the tool's own terms (outcome `failed`)."""

    def __init__(self, text: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(text)
        self.text = text
        self.data = data
