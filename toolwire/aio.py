"""The asyncio client: the same API as `toolwire.connect` (the trio client), on asyncio and the
`websockets` library, for chat servers on FastAPI, Starlette or aiohttp. Needs the extra:
`pip install 'toolwire[asyncio]'`. Handles, results and errors are the same classes as the trio
client's, re-exported here for convenience."""

from __future__ import annotations

import importlib.util

from toolwire.transport.client import (
    ApprovalDecision,
    BadArgs,
    Batch,
    BatchItem,
    CallConflict,
    CallEvent,
    CallHandle,
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
    render_result,
)

# `pip install toolwire` does not bring websockets: say which extra does, rather than let the
# import below fail naming a library the user never asked for.
if importlib.util.find_spec("websockets") is None:
    raise ModuleNotFoundError(
        "toolwire.aio runs on the websockets library, which is not installed: "
        "pip install 'toolwire[asyncio]' (or '.[asyncio]' in a checkout)",
        name="websockets",
    )

from toolwire.transport.client.aio import Client, connect

__all__ = [
    "ApprovalDecision",
    "BadArgs",
    "Batch",
    "BatchItem",
    "CallConflict",
    "CallEvent",
    "CallHandle",
    "Client",
    "ConnectError",
    "ConnectionLost",
    "Detached",
    "MessageTooBig",
    "ModelToolCall",
    "OutputChunk",
    "OutputCursor",
    "RequestError",
    "ToolExecutor",
    "ToolwireClientError",
    "TurnHandle",
    "UnknownTool",
    "connect",
    "render_result",
]
