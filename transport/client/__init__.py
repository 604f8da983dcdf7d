"""The orchestrator's client: tool calls over one WebSocket, with resume after reconnects.

One sans-IO core and two shells with the same API in async/await form:

- `state.py` (`ClientState`, with `replies.py` and `requests.py`): every decision, no I/O;
  `cursor.py` (`OutputCursor`) and `handles.py` (`CallHandle`, `TurnHandle`) are shared too.
- `api.py` (`ClientAPI`): the requests a caller makes, waiting on `ClientState`.
- `session.py`: the trio shell on trio-websocket; `connect` and `Client` here are its.
- `aio.py`: the asyncio shell on the `websockets` library (`pip install 'toolwire[asyncio]'`),
  importable as `toolwire.aio`.
- `executor.py` (`ToolExecutor`): model tool calls through either shell, with one truthful
  Result each; `rendering.py` (`render_result`): the text a model is given for it.
"""

from __future__ import annotations

from toolwire.transport.client.cursor import OutputCursor
from toolwire.transport.client.errors import (
    BadArgs,
    CallConflict,
    ConnectError,
    ConnectionLost,
    Detached,
    MessageTooBig,
    RequestError,
    ToolwireClientError,
    UnknownTool,
)
from toolwire.transport.client.executor import Batch, BatchItem, ToolExecutor
from toolwire.transport.client.handles import CallEvent, CallHandle, TurnHandle
from toolwire.transport.client.rendering import render_result
from toolwire.transport.client.session import Client, connect
from toolwire.transport.client.tool_calls import (
    ApprovalDecision,
    ModelToolCall,
    OutputChunk,
)

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
