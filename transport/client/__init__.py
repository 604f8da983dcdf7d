"""The orchestrator's client: tool calls over one WebSocket, with resume after reconnects.

One sans-IO core and two shells with the same API in async/await form:

- `state.py` (`ClientState`, with `replies.py` and `requests.py`): every decision, no I/O;
  `cursor.py` (`OutputCursor`) and `handles.py` (`CallHandle`, `TurnHandle`) are shared too.
- `api.py` (`ClientAPI`): the requests a caller makes, waiting on `ClientState`.
- `session.py`: the trio shell on trio-websocket; `connect` and `Client` here are its.
- `aio.py`: the asyncio shell on the `websockets` library (`pip install 'toolwire[asyncio]'`),
  importable as `toolwire.aio`.
"""

from __future__ import annotations

from toolwire.transport.client.cursor import OutputCursor
from toolwire.transport.client.errors import (
    ConnectError,
    ConnectionLost,
    Detached,
    MessageTooBig,
    RequestError,
    ToolwireClientError,
)
from toolwire.transport.client.handles import CallEvent, CallHandle, TurnHandle
from toolwire.transport.client.session import Client, connect

__all__ = [
    "CallEvent",
    "CallHandle",
    "Client",
    "ConnectError",
    "ConnectionLost",
    "Detached",
    "MessageTooBig",
    "OutputCursor",
    "RequestError",
    "ToolwireClientError",
    "TurnHandle",
    "connect",
]
