"""toolwire: a tool-call runtime for AI coding agents.

The repository keeps the design card's top-level folders (`actors/`, `transport/`, `cli/`,
`simulation/`, `benchmarks/`), and this package's subpackages are symlinks to them, so an install
adds a single top-level name: `toolwire.actors`, `toolwire.transport`, and so on. What a chat
server needs is re-exported here.

The names are imported when first used (PEP 562): a process that needs only a subpackage, such
as the keeper (`python -m toolwire.actors.keeper`, which holds every command of an agent),
does not load the client, trio and the WebSocket stack with it (about 8 MiB and a third of a
second of its start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_EXPORTS: dict[str, str] = {
    "Approval": "toolwire.transport.protocol",
    "ApprovalDecision": "toolwire.transport.client",
    "ApprovalResolved": "toolwire.transport.protocol",
    "BadArgs": "toolwire.transport.client",
    "Batch": "toolwire.transport.client",
    "BatchItem": "toolwire.transport.client",
    "CallConflict": "toolwire.transport.client",
    "CallEvent": "toolwire.transport.client",
    "CallHandle": "toolwire.transport.client",
    "CallSpec": "toolwire.transport.protocol",
    "Client": "toolwire.transport.client",
    "ConnectError": "toolwire.transport.client",
    "ConnectionLost": "toolwire.transport.client",
    "Detached": "toolwire.transport.client",
    "MessageTooBig": "toolwire.transport.client",
    "ModelToolCall": "toolwire.transport.client",
    "Output": "toolwire.transport.protocol",
    "OutputChunk": "toolwire.transport.client",
    "OutputCursor": "toolwire.transport.client",
    "RequestError": "toolwire.transport.client",
    "Result": "toolwire.transport.protocol",
    "ResultMessage": "toolwire.transport.protocol",
    "Started": "toolwire.transport.protocol",
    "TOOL_CALL_NAMESPACE": "toolwire.transport.ids",
    "ToolExecutor": "toolwire.transport.client",
    "ToolwireClientError": "toolwire.transport.client",
    "TurnHandle": "toolwire.transport.client",
    "UnknownTool": "toolwire.transport.client",
    "connect": "toolwire.transport.client",
    "render_result": "toolwire.transport.client",
    "tool_call_id": "toolwire.transport.ids",
    "tool_call_ids": "toolwire.transport.ids",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'toolwire' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
