"""Events the actors publish to their followers. The server maps each to one wire message.

These are the actors' own types (DESIGN.md: `actors` never imports `transport`); they carry the
same fields as the wire messages of PROTOCOL.md section 4, minus the `type` tag.
"""

from __future__ import annotations

from typing import Any

import msgspec

from toolwire.actors.results import Result

Rid = str | int | None


class AcceptedEvent(msgspec.Struct, frozen=True):
    chat_id: str
    call_id: str
    replay: bool
    state: str
    requests: int
    rid: Rid = None


class ApprovalEvent(msgspec.Struct, frozen=True):
    chat_id: str
    call_id: str
    tool: str
    args: Any
    turn_id: str | None = None


class ApprovalResolvedEvent(msgspec.Struct, frozen=True):
    chat_id: str
    call_id: str
    decision: str  # approved / denied / canceled / expired


class StartedEvent(msgspec.Struct, frozen=True):
    chat_id: str
    call_id: str
    started_at: int
    pid: int | None = None


class OutputEvent(msgspec.Struct, frozen=True):
    chat_id: str
    call_id: str
    offset: int
    data: str


class ResultEvent(msgspec.Struct, frozen=True):
    chat_id: str
    call_id: str
    result: Result


class CancelResultEvent(msgspec.Struct, frozen=True):
    chat_id: str
    call_id: str
    received: bool
    result: Result
    rid: Rid = None


class TurnPlanEvent(msgspec.Struct, frozen=True):
    chat_id: str
    turn_id: str
    segments: list[list[str]]
    rid: Rid = None


class TurnResultEvent(msgspec.Struct, frozen=True):
    chat_id: str
    turn_id: str
    results: list[Result]


class InterruptedEvent(msgspec.Struct, frozen=True):
    chat_id: str
    turn_id: str | None
    call_ids: list[str]
    rid: Rid = None


class ChatClosedEvent(msgspec.Struct, frozen=True):
    chat_id: str
    call_ids: list[str]  # the calls the close ended
    process_ids: list[str]  # the processes it stopped
    rid: Rid = None


class ToolDefinitionsEvent(msgspec.Struct, frozen=True):
    """The reply to `describe_tools` (PROTOCOL.md 10.3): the named tools, in that order, as
    the registry defines them."""

    tools: list[str]
    rid: Rid = None


class ErrorEvent(msgspec.Struct, frozen=True):
    code: str
    message: str
    rid: Rid = None
    chat_id: str | None = None
    call_id: str | None = None


Event = (
    AcceptedEvent
    | ApprovalEvent
    | ApprovalResolvedEvent
    | StartedEvent
    | OutputEvent
    | ResultEvent
    | CancelResultEvent
    | TurnPlanEvent
    | TurnResultEvent
    | InterruptedEvent
    | ChatClosedEvent
    | ToolDefinitionsEvent
    | ErrorEvent
)
