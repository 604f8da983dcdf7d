"""How toolwire calls sit in a pydantic-ai message history (pure: no I/O).

- `message_id(response)`: the id of the model response that asked for a call, from what the
  history keeps of it, so a resumed run (the same saved history) names the same toolwire call
  and the agent runs it at most once (`ModelToolCall.call_id`: UUIDv5 of chat, message id and
  the provider's tool call id).
- `framework_outcome(result)`: a Result's outcome as pydantic-ai's `ToolReturnPart.outcome`.
- `returns_to_repair(messages, ...)`: the returns a stopped run's history needs rewritten, so
  every call has exactly one return and each says what really happened.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic_ai.messages import (
    INTERRUPTED_TOOL_RETURN_CONTENT,
    SYNTHESIZED_TOOL_RETURN_METADATA_KEY,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
)

from toolwire.transport.client.rendering import render_result
from toolwire.transport.client.tool_calls import ModelToolCall
from toolwire.transport.protocol import Result

__all__ = [
    "RESULT_KEY",
    "FrameworkOutcome",
    "Rewrite",
    "framework_outcome",
    "message_id",
    "response_of",
    "returns_to_repair",
    "rewritten",
    "tool_return",
]

# The key of a toolwire return's `metadata` that holds its Result as plain JSON (Result.to_dict).
RESULT_KEY = "toolwire"

FrameworkOutcome = Literal["success", "failed", "denied", "interrupted"]

_OUTCOMES: dict[str, FrameworkOutcome] = {
    "completed": "success",
    "timed_out": "success",  # the tool ran; its text says it timed out
    "failed": "failed",
    "unknown": "failed",
    "denied": "denied",
    "canceled": "interrupted",
    "not_run": "interrupted",
}


def framework_outcome(result: Result) -> FrameworkOutcome:
    """`denied` is denied, `canceled` and `not_run` are interrupted (stopped before they could
    give a result of their own), `failed` and `unknown` failed; `completed` and `timed_out`
    are a success (the model reads the rest in the text)."""
    return _OUTCOMES.get(result.outcome, "failed")


def message_id(response: ModelResponse) -> str:
    """The id of a model response as toolwire's call ids use it: the provider's response id
    when it gave one, else the response's timestamp (set once, when the model answered, and
    kept by the history's serialization). Not its position: compaction and trimming move it."""
    if response.provider_response_id:
        return f"response {response.provider_response_id}"
    return f"response at {response.timestamp.isoformat()}"


def response_of(messages: Sequence[ModelMessage], provider_call_id: str) -> ModelResponse | None:
    """The newest model response of `messages` holding a call with that provider id."""
    for message in reversed(messages):
        if isinstance(message, ModelResponse) and any(
            isinstance(part, ToolCallPart) and part.tool_call_id == provider_call_id
            for part in message.parts
        ):
            return message
    return None


def tool_return(part: ToolReturnPart, result: Result) -> ToolReturnPart:
    """`part` (the return of `result`'s call) saying what `result` says, in toolwire's text."""
    return replace(
        part,
        content=render_result(result),
        outcome=framework_outcome(result),
        metadata={RESULT_KEY: result.to_dict()},
    )


@dataclass(frozen=True, slots=True)
class Rewrite:
    """A return of a toolwire call that must say the call's real result: message and part
    index in the history, and the call."""

    message: int
    part: int
    call: ModelToolCall


def returns_to_repair(
    messages: Sequence[ModelMessage], chat_id: str, tools: Collection[str]
) -> list[Rewrite]:
    """The returns of toolwire calls (tools in `tools`) that do not tell their call's real
    result: one pydantic-ai synthesized for a call that got none ("interrupted before a result
    was produced"), or one whose outcome is not what its Result says. Returns are matched to
    calls as pydantic-ai does: by provider id, the oldest open call first."""
    open_calls: dict[str, list[ModelToolCall]] = {}
    found: list[Rewrite] = []
    for index, message in enumerate(messages):
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart) and part.tool_name in tools:
                    call = ModelToolCall(
                        chat_id, message_id(message), part.tool_call_id, part.tool_name, {}
                    )
                    open_calls.setdefault(part.tool_call_id, []).append(call)
        elif isinstance(message, ModelRequest):
            for position, request_part in enumerate(message.parts):
                if not isinstance(request_part, ToolReturnPart):
                    continue
                waiting = open_calls.get(request_part.tool_call_id)
                if not waiting:
                    continue
                call = waiting.pop(0)
                if _untruthful(request_part):
                    found.append(Rewrite(index, position, call))
    return found


def rewritten(
    messages: Sequence[ModelMessage],
    rewrites: Sequence[Rewrite],
    result_of: Callable[[ModelToolCall], Result],
) -> list[ModelMessage]:
    """`messages` with each rewrite's return replaced by its call's real result."""
    by_message: dict[int, dict[int, ModelToolCall]] = {}
    for rewrite in rewrites:
        by_message.setdefault(rewrite.message, {})[rewrite.part] = rewrite.call
    repaired: list[ModelMessage] = []
    for index, message in enumerate(messages):
        parts = by_message.get(index)
        if parts and isinstance(message, ModelRequest):
            new_parts = [
                tool_return(part, result_of(parts[position]))
                if position in parts and isinstance(part, ToolReturnPart)
                else part
                for position, part in enumerate(message.parts)
            ]
            message = replace(message, parts=new_parts)
        repaired.append(message)
    return repaired


def _untruthful(part: ToolReturnPart) -> bool:
    metadata: Any = part.metadata
    if isinstance(metadata, dict):
        if metadata.get(SYNTHESIZED_TOOL_RETURN_METADATA_KEY):
            return True
        saved = metadata.get(RESULT_KEY)
        if isinstance(saved, dict):
            return _OUTCOMES.get(str(saved.get("outcome")), "failed") != part.outcome
    return part.content == INTERRUPTED_TOOL_RETURN_CONTENT
