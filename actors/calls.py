"""What a chat holds for one tool call: the call as requested (`CallSpec`) and the runtime
state beside its pure record (`CallRuntime`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from toolwire.actors import processes
from toolwire.actors.events import StartedEvent
from toolwire.actors.outbox import Outbox, Subscription
from toolwire.actors.records import ToolCallRecord
from toolwire.actors.results import ToolwireError
from toolwire.actors.tools.registry import TOOLS


def shared_tool_name(name: str) -> str:
    """The registry's own string for a known tool name: a record keeps it for as long as it
    lives, and a name decoded from a request or a journal row is a new string each time (about
    60 bytes per record, 100,000 records)."""
    tool = TOOLS.get(name)
    return tool.name if tool is not None else name


@dataclass(frozen=True, slots=True)
class CallSpec:
    """A tool call as requested (a `call` message, or one call of a `turn`)."""

    call_id: str
    tool: str
    args: Any
    timeout_ms: int | None = None
    background: bool = False
    approval: bool = False


@dataclass(eq=False)
class CallRuntime:
    """What the chat holds for one record besides the pure record state."""

    spec: CallSpec
    parsed: msgspec.Struct | None = None
    invalid: str | None = None  # why the args are unusable (turn calls only: fails when run)
    done: trio.Event = field(default_factory=trio.Event)
    subs: dict[Outbox, Subscription] = field(default_factory=dict)
    process: processes.ProcessRecord | None = None
    started: StartedEvent | None = None
    gate: trio.Event | None = None  # set when a parked gate is answered
    approved: bool = False
    limiter: trio.CapacityLimiter | None = None  # a turn's "at most 8 at once"
    # A blocking wait (process_output) has no process of its own to stop: a cancel ends it here.
    wait_scope: trio.CancelScope | None = None
    # Between `_begin` (the record says RUNNING) and the durable start that lets the effect
    # happen: a failure in between ends the call `not_run`, since nothing can have started.
    start_pending: bool = False
    # Its result could not be journaled: it stays on the heap, never read back from the journal.
    unsaved: bool = False


def conflict_error(record: ToolCallRecord) -> ToolwireError:
    """A call id reused with another tool or other args: refused, never run as the first."""
    return ToolwireError(
        "conflict",
        f"call_id {record.call_id!r} was first used with tool {record.tool!r} and other "
        "args; a retry must repeat the same tool and args, a new call needs a new id",
    )
