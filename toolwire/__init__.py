"""toolwire: a tool-call runtime for AI coding agents.

The repository keeps the design card's top-level folders (`actors/`, `transport/`, `cli/`,
`simulation/`, `benchmarks/`), and this package's subpackages are symlinks to them, so an install
adds a single top-level name: `toolwire.actors`, `toolwire.transport`, and so on. What a chat
server needs is re-exported here.
"""

from __future__ import annotations

from toolwire.transport.client import (
    ApprovalDecision,
    BadArgs,
    Batch,
    BatchItem,
    CallConflict,
    CallEvent,
    CallHandle,
    Client,
    ConnectError,
    ConnectionLost,
    Detached,
    MessageTooBig,
    ModelToolCall,
    OutputChunk,
    OutputCursor,
    RequestError,
    ToolExecutor,
    ToolwireClientError,
    TurnHandle,
    UnknownTool,
    connect,
    render_result,
)
from toolwire.transport.ids import TOOL_CALL_NAMESPACE, tool_call_id, tool_call_ids
from toolwire.transport.protocol import (
    Approval,
    ApprovalResolved,
    CallSpec,
    Output,
    Result,
    ResultMessage,
    Started,
)

__all__ = [
    "TOOL_CALL_NAMESPACE",
    "Approval",
    "ApprovalDecision",
    "ApprovalResolved",
    "BadArgs",
    "Batch",
    "BatchItem",
    "CallConflict",
    "CallEvent",
    "CallHandle",
    "CallSpec",
    "Client",
    "ConnectError",
    "ConnectionLost",
    "Detached",
    "MessageTooBig",
    "ModelToolCall",
    "Output",
    "OutputChunk",
    "OutputCursor",
    "RequestError",
    "Result",
    "ResultMessage",
    "Started",
    "ToolExecutor",
    "ToolwireClientError",
    "TurnHandle",
    "UnknownTool",
    "connect",
    "render_result",
    "tool_call_id",
    "tool_call_ids",
]
