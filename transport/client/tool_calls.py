"""A model's tool call as the executor takes it, and what its callbacks are given (pure).

`ModelToolCall` is what a chat server has of one call the model asked for: the chat, the
assistant message that asked, the provider's tool call id, the tool and its args. Its
`call_id` is derived from the first three (transport/ids.py), so the same call of the same
message has the same id after any crash, replica switch or retry, and the agent runs it at
most once.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from toolwire.transport.client.errors import BadArgs
from toolwire.transport.ids import tool_call_id
from toolwire.transport.protocol import Approval

__all__ = [
    "ApprovalCallback",
    "ApprovalDecision",
    "ModelToolCall",
    "OnCancel",
    "OutputCallback",
    "OutputChunk",
]

# What a cancellation of the task awaiting a call means (see ToolExecutor).
OnCancel = Literal["cancel", "detach"]


@dataclass(frozen=True, slots=True)
class ModelToolCall:
    """One tool call of one model response. `args` is the object the model sent, or its JSON
    text as most provider APIs hand it over."""

    chat_id: str
    message_id: str
    provider_call_id: str
    tool: str
    args: Mapping[str, Any] | str = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.provider_call_id:
            # An empty id would give every such call of the message one call id, and each
            # would get the other's saved result (transport/ids.py).
            raise ValueError("provider_call_id must not be empty")

    @property
    def call_id(self) -> str:
        """UUIDv5 of chat, message and provider call id: the same on every retry."""
        return tool_call_id(self.chat_id, self.message_id, self.provider_call_id)

    def arguments(self) -> dict[str, Any]:
        """The args as an object. Raises BadArgs when the model's text is not JSON or not an
        object: a model can fix that, as any other bad argument."""
        args = self.args
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise BadArgs("bad_args", f"{self.tool}: args are not valid JSON ({exc})") from None
        if not isinstance(args, Mapping):
            raise BadArgs("bad_args", f"{self.tool}: args must be an object, not {args!r}")
        return dict(args)


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """Output of a call as it streams, each byte once, in order. Save `end` to resume: pass it
    as `from_offset` and nothing is shown twice."""

    call: ModelToolCall
    offset: int  # byte offset of `data` in the call's output
    data: str

    @property
    def end(self) -> int:
        """The byte offset after this chunk: where a resumed call continues. (Where the agent
        replaced invalid UTF-8 by U+FFFD this may lie up to 2 bytes per replacement beyond the
        true end; what a resume then skips is only bytes that were no text.)"""
        return self.offset + len(self.data.encode())


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """An answer to an approval gate: `reason` goes with a denial into the call's text;
    `scope="chat"` approves the tool for the whole chat (PROTOCOL.md 9.5)."""

    approved: bool
    reason: str | None = None
    scope: Literal["call", "chat"] = "call"


OutputCallback = Callable[[OutputChunk], Awaitable[None] | None]
# Returns the answer, or None to leave the gate parked for someone else to answer.
ApprovalCallback = Callable[[ModelToolCall, Approval], Awaitable[ApprovalDecision | bool | None]]
