"""Every message of the toolwire wire protocol v1 (PROTOCOL.md) as msgspec Structs.

Client->agent and agent->client messages are two separate tagged unions on `type`, so a decoder
for one direction never accepts a message of the other. Unknown fields are ignored (forward
compatibility); a field of the wrong type fails decoding with msgspec's message, which names the
field path (`... - at `$.call_id``), and the server answers `bad_message` with it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

PROTOCOL_VERSION = 1

# PROTOCOL.md 2: chat ids are 0..128 chars ("" is the chat-less namespace); call and turn ids are
# 1..200 chars. All hold only printable characters in the sense of Python's `str.isprintable()`
# (PROTOCOL.md 9.9: no control, format, or line/paragraph separator characters, a trailing
# newline included), because ids end up in logs, paths and terminals. That is not a regular
# expression msgspec could check cheaply (a `$` also matches before a final newline), so the
# lengths are checked by the decoder and printability by `bad_id_path` right after it: one
# C-speed `isprintable()` per id.
_PRINTABLE = "printable characters only (Python's str.isprintable())"
ChatId = Annotated[
    str, msgspec.Meta(max_length=128, description=_PRINTABLE, extra={"printable": True})
]
CallId = Annotated[
    str,
    msgspec.Meta(min_length=1, max_length=200, description=_PRINTABLE, extra={"printable": True}),
]
TurnId = CallId
Rid = str | int | None
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]

Outcome = Literal["completed", "failed", "timed_out", "canceled", "not_run", "denied", "unknown"]
CallState = Literal["awaiting_approval", "running", "done"]
Decision = Literal["approved", "denied", "canceled", "expired"]
ErrorCode = Literal[
    "bad_message",
    "unknown_tool",
    "bad_args",
    "conflict",
    "unknown_call",
    "not_parked",
    "over_limit",
    "chat_closed",
    "internal",
    "sandbox_unsupported",
]


# The 1.1 features of PROTOCOL.md 9 this agent implements, sent in `welcome.features`.
# `approval_scope`: `approve.scope` "chat" approves a tool for the whole chat (9.5).
# `expected_sha256`: file digests and write preconditions (9.4).
# `http_status`: /healthz, /readyz and /metrics on the WebSocket's port (9.7).
# `stdin`, `pty`, `kill_after`: interactive commands and hard deadlines (9.1, 9.2).
# `close_chat`: ending a chat's calls and processes in one request (9.6).
# And of the 1.2 additions of PROTOCOL.md 10: `call_from_offset` (10.2), `describe_tools`
# (10.3), `list_dir` (10.5).
FEATURES = (
    "stdin",
    "pty",
    "kill_after",
    "approval_scope",
    "expected_sha256",
    "close_chat",
    "http_status",
    "call_from_offset",
    "describe_tools",
    "list_dir",
)


class _ClientMessage(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    rid: Rid = None


class _AgentMessage(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    pass


# ---------------------------------------------------------------------------------------------
# Client -> agent (PROTOCOL.md 3)


class Sandbox(msgspec.Struct, kw_only=True):
    """A call's sandbox (PROTOCOL.md 10.4): a field of the call, never of the tool's args."""

    filesystem: Literal["read_only", "workspace_write", "full"] = "full"
    writable: list[Annotated[str, msgspec.Meta(min_length=1)]] = msgspec.field(default_factory=list)
    network: bool = True


class Call(_ClientMessage, tag="call"):
    chat_id: ChatId
    call_id: CallId
    tool: str
    args: dict[str, Any]
    timeout_ms: NonNegativeInt | None = None
    background: bool = False
    approval: bool = False
    stream: bool = True
    sandbox: Sandbox | None = None
    # 1.2 (PROTOCOL.md 10.2): this request's output starts at this byte offset, as an
    # attach's does; a resumed chat server shows nothing twice. Not part of what the call id
    # stands for (a repeat with another offset is no conflict) and never changes the result.
    from_offset: NonNegativeInt = 0


class Attach(_ClientMessage, tag="attach"):
    chat_id: ChatId
    call_id: CallId
    from_offset: NonNegativeInt = 0


class Detach(_ClientMessage, tag="detach"):
    chat_id: ChatId
    call_id: CallId


class Cancel(_ClientMessage, tag="cancel"):
    chat_id: ChatId
    call_ids: list[CallId]


class Approve(_ClientMessage, tag="approve"):
    chat_id: ChatId
    call_id: CallId
    approved: bool
    reason: str | None = None
    # "chat": with approved=true, every gate of this call's tool in this chat, parked now or
    # later, for as long as the chat has records (PROTOCOL.md 9.5).
    scope: Literal["call", "chat"] = "call"


class CallSpec(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One call of a `turn`. `args` is not checked here: malformed args make a planner barrier
    and the call then fails on its own (PROTOCOL.md 5.6), so one bad call never rejects a turn."""

    call_id: CallId
    tool: str
    args: Any
    timeout_ms: NonNegativeInt | None = None
    background: bool = False
    approval: bool = False
    sandbox: Sandbox | None = None


class Turn(_ClientMessage, tag="turn"):
    chat_id: ChatId
    turn_id: TurnId
    calls: list[CallSpec]
    stream: bool = True


class Interrupt(_ClientMessage, tag="interrupt"):
    chat_id: ChatId
    turn_id: TurnId | None = None


class CloseChat(_ClientMessage, tag="close_chat"):
    chat_id: ChatId


class DescribeTools(_ClientMessage, tag="describe_tools"):
    """PROTOCOL.md 10.3: the agent's tools as a model is given them (`tool_definitions`)."""


ClientMessage = (
    Call | Attach | Detach | Cancel | Approve | Turn | Interrupt | CloseChat | DescribeTools
)


def bad_id_path(message: ClientMessage) -> str | None:
    """The path of the first id in a decoded client message that is not printable
    (PROTOCOL.md 9.9), or None when every id is."""
    if isinstance(message, DescribeTools):
        return None
    if not message.chat_id.isprintable():
        return "$.chat_id"
    if isinstance(message, CloseChat):
        return None
    if isinstance(message, Call | Attach | Detach | Approve):
        return None if message.call_id.isprintable() else "$.call_id"
    if isinstance(message, Cancel):
        for index, call_id in enumerate(message.call_ids):
            if not call_id.isprintable():
                return f"$.call_ids[{index}]"
        return None
    if message.turn_id is not None and not message.turn_id.isprintable():
        return "$.turn_id"
    if isinstance(message, Turn):
        for index, spec in enumerate(message.calls):
            if not spec.call_id.isprintable():
                return f"$.calls[{index}].call_id"
    return None


CLIENT_MESSAGE_TYPES: tuple[type[_ClientMessage], ...] = (
    Call,
    Attach,
    Detach,
    Cancel,
    Approve,
    Turn,
    Interrupt,
    CloseChat,
    DescribeTools,
)


# ---------------------------------------------------------------------------------------------
# Agent -> client (PROTOCOL.md 4)


class SandboxLimits(msgspec.Struct, kw_only=True):
    filesystem: bool
    network: bool


class Limits(msgspec.Struct, kw_only=True):
    max_message_bytes: int
    output_retention_bytes: int
    result_output_bytes: int
    max_wait_ms: int
    forget_after_s: int
    exited_retention_s: int
    max_processes_per_chat: int
    # 1.1 (PROTOCOL.md 9): how long a stopped process group has from SIGTERM to exit before
    # SIGKILL (5.3, 9.2, 9.3). Optional for the client: an agent of 1.0 does not send it.
    kill_grace_ms: int | None = None
    # The bounds of one request and of the whole agent (docs/protocol.md, "Limits"): optional
    # for the client, an agent before them does not send them.
    max_ids_per_request: int | None = None
    max_records: int | None = None
    max_processes: int | None = None
    max_message_bytes_in_flight: int | None = None
    # 1.2 (PROTOCOL.md 10.4): what this agent can enforce of a call's `sandbox`.
    sandbox: SandboxLimits | None = None


class Result(msgspec.Struct, kw_only=True):
    """The Result object of PROTOCOL.md 4. Null fields are sent as null, never omitted."""

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

    def to_dict(self) -> dict[str, Any]:
        """The Result as plain JSON values (for a framework's message history, a database):
        every field, nulls included; `Result.from_dict` turns it back into an equal Result."""
        value: dict[str, Any] = msgspec.to_builtins(self)
        return value

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Result:
        """A Result from `to_dict`'s form (or a `result` message's fields; others are ignored).
        Raises msgspec.ValidationError naming the field when one is missing or mistyped."""
        return msgspec.convert(value, cls)


class Welcome(_AgentMessage, tag="welcome"):
    protocol: int
    agent_id: str
    boot_id: str
    encoding: Literal["json", "msgpack"]
    tools: list[str]
    limits: Limits
    # What this agent supports of the 1.1 additions (PROTOCOL.md 9); a client checks it first.
    features: list[str] = msgspec.field(default_factory=list)


class Accepted(_AgentMessage, tag="accepted"):
    chat_id: str
    call_id: str
    replay: bool
    state: CallState
    requests: int
    rid: Rid = None


class Approval(_AgentMessage, tag="approval"):
    chat_id: str
    call_id: str
    tool: str
    args: Any
    turn_id: str | None = None


class ApprovalResolved(_AgentMessage, tag="approval_resolved"):
    chat_id: str
    call_id: str
    decision: Decision


class Started(_AgentMessage, tag="started"):
    chat_id: str
    call_id: str
    started_at: int
    pid: int | None = None


class Output(_AgentMessage, tag="output"):
    chat_id: str
    call_id: str
    offset: int
    data: str


class ResultMessage(_AgentMessage, tag="result"):
    chat_id: str
    call_id: str
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


class CancelResult(_AgentMessage, tag="cancel_result"):
    chat_id: str
    call_id: str
    received: bool
    result: Result
    rid: Rid = None


class TurnPlan(_AgentMessage, tag="turn_plan"):
    chat_id: str
    turn_id: str
    segments: list[list[str]]
    rid: Rid = None


class TurnResult(_AgentMessage, tag="turn_result"):
    chat_id: str
    turn_id: str
    results: list[Result]


class Interrupted(_AgentMessage, tag="interrupted"):
    chat_id: str
    call_ids: list[str]
    turn_id: str | None = None
    rid: Rid = None


class ChatClosed(_AgentMessage, tag="chat_closed"):
    chat_id: str
    call_ids: list[str]
    process_ids: list[str]
    rid: Rid = None


Effect = Literal["read", "write", "process"]


class ToolDefinition(msgspec.Struct, kw_only=True):
    """One tool as a model is given it (PROTOCOL.md 10.3)."""

    name: str
    # For a model: what the tool does, when to use it, what it returns, its limits.
    description: Annotated[str, msgspec.Meta(max_length=1000)]
    # JSON Schema 2020-12 of the tool's `args`: self-contained, exact.
    input_schema: dict[str, Any]
    effect: Effect


class ToolDefinitions(_AgentMessage, tag="tool_definitions"):
    tools: list[ToolDefinition]
    rid: Rid = None


class Error(_AgentMessage, tag="error"):
    code: ErrorCode
    message: str
    rid: Rid = None
    chat_id: str | None = None
    call_id: str | None = None


AgentMessage = (
    Welcome
    | Accepted
    | Approval
    | ApprovalResolved
    | Started
    | Output
    | ResultMessage
    | CancelResult
    | TurnPlan
    | TurnResult
    | Interrupted
    | ChatClosed
    | ToolDefinitions
    | Error
)
AGENT_MESSAGE_TYPES: tuple[type[_AgentMessage], ...] = (
    Welcome,
    Accepted,
    Approval,
    ApprovalResolved,
    Started,
    Output,
    ResultMessage,
    CancelResult,
    TurnPlan,
    TurnResult,
    Interrupted,
    ChatClosed,
    ToolDefinitions,
    Error,
)
